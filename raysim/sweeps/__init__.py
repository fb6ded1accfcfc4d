"""Ray Tune sweeps over raysim runs: the ``tune:`` config section and its search space."""
