"""A plugin written against the method interface before 2.0: its ``wrap_model`` takes
``(module, spec)``, without the method's params (CHANGELOG.md). Registering it is refused."""

from __future__ import annotations

from raysim.algorithms import Method, register
from raysim.algorithms.general.fedavg import FedAvg


def add_nothing(module, spec):
    return module


register(Method(name="old_wrap", strategy=FedAvg, wrap_model=add_nothing))
