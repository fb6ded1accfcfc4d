"""``python -m raysim.cli ...``: the ``raysim`` command (``entry``)."""

from raysim.cli import entry

if __name__ == "__main__":
    entry()
