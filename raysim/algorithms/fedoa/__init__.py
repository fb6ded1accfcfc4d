"""FedOA (``../shared/specs/fedoa.md``): the method and the baselines only it compares with,
FedIT, FedLoRA, PERADA, FedSDR, pFedMe, Ditto, Local-only and Centralized; ``personal.py`` holds
their shared two-group (global, personal) client."""
