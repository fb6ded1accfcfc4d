"""The errors that end a run, for a driver to catch without importing what raises them (torch,
the methods, the coordinator): ``raysim run`` reports each in one line."""

from __future__ import annotations


class Diverged(RuntimeError):
    """Raised by a strategy (or by the coordinator for one that sets ``stop_on_nonfinite``) to
    stop a run whose training diverged; the message names the round and the cause."""


class LeakError(RuntimeError):
    """A payload to clients carries server-private values."""


class RunSetupError(RuntimeError):
    """The coordinator could not set the run up (raised by ``Coordinator.ready``)."""


class PrivacyError(ValueError):
    """A run its ``privacy`` section cannot cover (an update carrying more than its delta), or
    an ε target no noise multiplier meets (``raysim.privacy``)."""
