"""FedOT (arXiv:2206.02468, docs/papers/fedot.md; Farnia et al., "An Optimal Transport Approach to
Personalized Federated Learning"): FedOT-GDA and the baselines only it compares with, L-FedAvg,
FedMI and Fed-FOMAML. ``families`` holds the map and potential families, ``model`` the resident
model (map, predictor, potential), ``client``/``server`` the two halves of FedOT-GDA and
``lockstep`` the all-clients-in-one-graph reference (``dual_centering: exact``, §3.3). Not
FS-LLM's "FedOT" (offsite tuning)."""
