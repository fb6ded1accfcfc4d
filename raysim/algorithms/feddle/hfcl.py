"""HFCL (Elbir et al. 2021) as Feddle spec §4.7 [O + I]: the server is an extra, always-fresh
client.

Every round end the server trains a copy of ω^k on the in-distribution server set with the
*client* recipe (``local.*``: same optimiser, lr, epochs, batch; "no additional hyperparameters"
[P]) to get Δ_srv, and aggregates it with the round's client deltas by data size:
``ω^{k+1} = ω^k + Σ_{j∈R_k∪{srv}} n_j / Σ n · Δ_j`` with ``n_srv = |D_S|``. The base rule is
FedAvg (A15).
"""

from __future__ import annotations

from ..base import Method, WeightedMean
from ..general.fedavg import RoundBuffer
from ..registry import register
from .params import METHODS
from .server_training import id_pool, train_on_server


class HFCL(RoundBuffer):
    def on_round_end(self, round_index: int) -> bool:
        pool = id_pool(self.ctx, "hfcl")
        trained, _ = train_on_server(
            self.ctx, self.weights, pool.data, self.ctx.local, f"hfcl/{round_index}"
        )
        deltas = [u.delta for u in self.pending] + [trained - self.weights]
        sizes = [u.num_samples for u in self.pending] + [len(pool)]
        total = sum(sizes)
        self.pending = []
        self.weights = self.weights + WeightedMean.combine(deltas, [n / total for n in sizes])
        return True


METHOD = register(Method.of(METHODS["hfcl"], strategy=HFCL))
