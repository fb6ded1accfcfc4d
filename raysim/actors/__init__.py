"""Ray runtime: coordinator, worker pool and workers. Knows no paper; moves tensors, time, state."""
