"""Where and how a run executes, decided once: the plan (``plan``), the rules of running without
Ray (``without_ray``), the machine's resources and the pool (``resources``), the private Ray
(``private_ray``), placement on a cluster (``placement``), the checks before anything starts
(``preflight``, ``inputs``, ``sizes``) and the session that carries the plan out (``session``).
Everything below this package receives the plan and recomputes none of its choices."""
