"""Differential privacy for raysim runs: clipping, noise, accounting, secure aggregation's
effects and an audit (``docs/privacy.md``).

``settings`` (the config section), ``clipping`` (a client's side, on its worker), ``server`` and
``wrap`` (the server's side), ``accounting`` (ε with ``dp-accounting``), ``secagg`` (secure
aggregation simulated) and ``audit`` (a one-run audit). None imports Ray or torch.
"""
