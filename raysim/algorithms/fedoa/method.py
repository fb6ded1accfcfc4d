"""FedOA (Yang et al. 2025; FedOA spec §2): a global and a personal LoRA adapter per client, and
Local-only (FedOA with λ = 0).

Per round, client e (FedOA spec §2.3):
(a) personal adapter φ_e, K epochs of ``CE(φ_e; ξ) + λ·D(Φ(φ_e; ξ), stop_grad Φ(φ_g^{t-1}; ξ))``,
    teacher = the *round-start* global adapter on the same minibatch, no gradient through it;
(b) the client's copy of φ_g, K epochs of plain CE (exactly FedIT), uploaded.
The server is FedAvg (FedIT). φ_e never leaves the client and persists across rounds.

Switches (FedOA spec §8, defaults first): ``distance`` l2 (un-squared Frobenius per micro-batch,
§2.5) | l2_squared | l2_mean | mse | cosine | pearson | l1; ``feature_layer`` −1 (post-final-norm,
§2.4); ``feature_pool`` last | mean | response_mean | token; ``personal_init`` fresh | copy_global,
``personal_start_round`` 0 (paper) or 1 (authors' code) (§2.8); ``teacher_dropout`` off (§2.8);
``order`` personal_first (code) | global_first (invariant I4); ``global_update_mode`` local_epochs |
single_full_grad_step (Alg. 1 literally, §2.3 note 1).

The client (``FedOAClient``, ``FedOAParams``) lives in ``personal.py``: Ditto, PerAda and FedSDR
reuse it with one term swapped. FedOA needs a LoRA causal LM (its term compares hidden states);
Local-only trains the personal model on the task loss alone, so it runs on any model (on a plain
module the personal model is a copy of the trainable tensors, ``ModelHandle``), and logs the
Fig. 2 feature distance on a causal LM only.
"""

from __future__ import annotations

from ..base import Method
from ..general.fedavg import FedAvg
from ..registry import register
from .params import METHODS
from .personal import PERSONAL, PERSONAL_GROUPS, FedOAClient

METHOD = register(
    Method.of(
        METHODS["fedoa"],
        strategy=FedAvg,
        client=FedOAClient,
        groups=PERSONAL_GROUPS,
        evaluate_with=PERSONAL,
    )
)


METHOD_LOCAL = register(
    Method.of(
        METHODS["local_only"],
        strategy=FedAvg,
        client=FedOAClient,
        groups=PERSONAL_GROUPS,
        evaluate_with=PERSONAL,
    )
)
