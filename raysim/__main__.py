"""``python -m raysim ...``: the ``raysim`` command where its script is not installed (a machine
that runs the repository from ``PYTHONPATH``, such as the GPU machine's image)."""

from raysim.cli import entry

if __name__ == "__main__":
    entry()
