"""FedBaF (``../shared/specs/fedbaf.md``): the foundation mixer (``mixer.py``) and its layer
matching, the method on any base, and the §4.4/§6.3 adversaries."""
