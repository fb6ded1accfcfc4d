"""FedBaF (Park et al., "FedBaF: Federated Learning Aggregation Biased by a Foundation
Model", arXiv:2410.18352; docs/papers/fedbaf.md): the foundation mixer (``mixer.py``) and its layer
matching, the method on any base, and the §4.4/§6.3 adversaries."""
