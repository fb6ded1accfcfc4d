"""FedIT (Zhang et al. 2023, "Towards building the federated GPT"), as FedOA spec §3.2.

FedAvg over the global LoRA adapter: each sampled client trains its copy of φ_g for K epochs on the
causal-LM loss and uploads it; the server averages tensor-wise by data size (FedOA spec §2.7; A and
B averaged separately because they are separate coordinates of the flat vector).
"""

from __future__ import annotations

from ..base import Method
from ..general.fedavg import FedAvg
from ..registry import register
from .params import METHODS

METHOD = register(Method.of(METHODS["fedit"], strategy=FedAvg))
