"""Feddle (``../shared/specs/feddle.md``): the method (``method.py``: atlas, coefficient search,
OOD probe) and its server-data baselines, Center, Fed+FT, HFCL and FedDF (``server_training.py``
holds the server's training loop they share)."""
