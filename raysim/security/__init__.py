"""Security analyses run against finished runs (fedbaf.md §6): extraction attacks and metrics."""
