"""Feddle (Zhu et al., "Unlocking the Value of Decentralized Data: A Federated Dual Learning
Approach for Model Aggregation", arXiv:2503.20138; docs/papers/feddle.md): the method
(``method.py``: atlas, coefficient search, OOD probe) and its server-data baselines, Center,
Fed+FT, HFCL and FedDF (``server_training.py`` holds the server's training loop they share)."""
