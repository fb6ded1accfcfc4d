"""Centralized (the FedOA paper's upper-bound-style baseline); FedOA spec §3.1.

All training data of the training environments pooled on one client, one LoRA trained for 10
epochs: FedIT (FedAvg server, plain CE client) with a single client holding every example, one
round. The method itself is FedIT; the protocol lives in the config:

    algorithm={name: centralized}  clients.num=1  clients.per_round=1  rounds=1
    local.epochs=10  data.text.pool_clients=true

(``raysim.sweeps.protocols.TABLE2_METHODS["centralized"]``). ``data.text.pool_clients`` merges the
leave-one-task-out training clients into client 0 (``id/0`` = the union of their ID test splits).
Nothing here validates that protocol. Evaluated with its single global adapter. No switches.
"""

from __future__ import annotations

from ..base import Method
from ..general.fedavg import FedAvg
from ..registry import register
from .params import METHODS

METHOD = register(Method.of(METHODS["centralized"], strategy=FedAvg))
