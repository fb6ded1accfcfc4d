"""FedOA (Yang et al., "Federated Adapter on Foundation Models: An Out-Of-Distribution Approach",
arXiv:2505.01075; docs/papers/fedoa.md): the method and the baselines only it compares with,
FedIT, FedLoRA, PERADA, FedSDR, pFedMe, Ditto, Local-only and Centralized; ``personal.py`` holds
their shared two-group (global, personal) client."""
