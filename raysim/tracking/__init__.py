"""MLflow: the store (``store``), one run's writer (``tracker``) and the process it runs in
(``process``), a run's tables and plots (``artifacts``), and the timeline of what each process
did (``timeline``). The coordinator is the only writer."""
