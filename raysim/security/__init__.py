"""Security analysis, apart from the Ray runtime: the leak auditor that checks every payload the
coordinator sends (``audit``, fedbaf.md §6.3; the coordinator's one seam is ``LeakAuditor.check``)
and the extraction attacks and metrics run against finished runs (fedbaf.md §6)."""
