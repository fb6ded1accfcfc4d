"""Security analysis, apart from the Ray runtime: the leak auditor that checks every payload the
coordinator sends (``audit``, FedBaF spec §6.3; the coordinator's one seam is ``LeakAuditor.check``)
and the extraction attacks and metrics run against finished runs (FedBaF spec §6)."""
