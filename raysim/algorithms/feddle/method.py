"""Feddle (Feddle spec §3): the server searches for the best combination of recent client deltas
(the *atlas*) on its in-distribution data, starting from, and tied to, FedBuff's step.

Every round end (§3.8): this round's arrivals enter the atlas (§3.2); the anchors are normalised
to the median norm ρ (§3.3, Eq. 5); the fallback coefficients ``c'`` reproduce
``fedbuff_per_round``'s step in that basis (§3.6); the search starts there (or at 0) and minimises
the server loss plus ``(λ/2)‖c − c'‖²`` over ``c`` with a fresh optimiser (§3.4, §3.7); the model
moves by ``Σ ĉ_m ā_m`` and every anchor's importance becomes ``|ĉ_m|``. BatchNorm buffers stay out
of the anchors and follow ``bn_buffers`` (§3.1, A14). Every interpretation is a switch with the
spec's default; Table 3's ablation rows are ``normalize`` × ``eviction`` × ``fallback_init`` × λ
(§3.9). ``mode: ood`` searches on the OOD surrogate instead (§3.5, ``probe.py``): a linear
probe θ on the body's features, refitted each round at the start point, then frozen.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ...models.layout import BUFFERS, SHARED
from ..base import Diverged, Method, Strategy, Update
from ..context import ServerContext
from ..general.fedbuff import staleness_weight
from ..registry import register
from .atlas import Atlas
from .params import METHODS, FeddleParams
from .probe import ProbeTask, fit_probe, head_of, load_probe, new_probe, probe_state
from .search import Objective, SearchConfig, search
from .server_training import id_pool, ood_sample


class Feddle(Strategy):
    params: FeddleParams
    transient = ("shared", "buffers")

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.pending: list[Update] = []
        self.atlas: Atlas | None = None
        self.theta: dict[str, np.ndarray] | None = None  # the OOD probe, warm across rounds
        self.last: dict[str, float] = {}
        self.coefficients: list[dict[str, float]] = []  # per round and anchor (tables())

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self.shared = ctx.layout.mask(SHARED)
        self.buffers = ctx.layout.mask(BUFFERS)
        if self.atlas is None:
            m = self.params.atlas_size or 2 * (ctx.clients_per_round or 10)
            self.atlas = Atlas(m, self.params.eviction, self.params.new_anchor_score)

    def on_arrival(self, update: Update) -> bool:
        self.pending.append(update)  # no model change mid-round (§3.8)
        return False

    # ------------------------------------------------------------------ §3.6
    def fallback(
        self, new: dict[int, Update], arrived: int, norms: np.ndarray, rho: float
    ) -> np.ndarray:
        """``c'``: FedBuff's step over this round's ``arrived`` updates (``new``: slot → update
        for those in the atlas) in the normalised basis, or over the whole atlas."""
        p = self.params
        c = np.zeros(len(norms), dtype=np.float64)
        scale = norms / rho if p.fallback_norm_correction and p.normalize == "median" else 1.0
        scale = np.broadcast_to(scale, c.shape)
        if p.fallback_scope == "whole_atlas":
            return p.fallback_lr * scale / len(norms)
        for m, u in new.items():
            c[m] = p.fallback_lr * staleness_weight(p.staleness_weight, u) * scale[m] / arrived
        return c

    # ------------------------------------------------------------------ §3.8
    def on_round_end(self, round_index: int) -> bool:
        arrivals, self.pending = self.pending, []
        atlas = self.atlas
        inserted = {}
        for u in arrivals:
            m = atlas.insert(u.delta[self.shared], round_index, u.client_id, u.tau_rounds)
            if m >= 0:
                inserted[m] = (atlas.slots[m].seq, u)
        new = {m: u for m, (seq, u) in inserted.items() if atlas.slots[m].seq == seq}
        if not len(atlas) or (self.params.search_trigger == "on_new_arrivals" and not arrivals):
            self.last = {"feddle_atlas_size": float(len(atlas))}
            self._update_buffers(arrivals)
            return True  # a new version every round, even with nothing to search (§2.4)
        anchors, rho = atlas.normalized(self.params.normalize)
        norms = atlas.norms()
        c_fb = self.fallback(new, len(arrivals), norms, rho)
        c0 = c_fb if self.params.fallback_init == "fedbuff" else np.zeros_like(c_fb)
        c_hat, losses = self._search(round_index, anchors, c0, c_fb)
        weights = self.weights.copy()
        weights[self.shared] += c_hat.astype(np.float32) @ anchors
        self.weights = weights
        self.coefficients += [
            {
                "round": round_index,
                "anchor": slot.seq,
                "client": slot.client_id,
                "inserted_round": slot.inserted_round,
                "tau_rounds": slot.tau_rounds,
                "norm": float(norm),
                "fallback": float(c_fb[m]),
                "coefficient": float(c_hat[m]),
            }
            for m, (slot, norm) in enumerate(zip(atlas.slots, norms, strict=True))
        ]
        atlas.record_search(c_hat)
        self._update_buffers(arrivals)  # after the search, which used ω^k's statistics
        ages = atlas.ages(round_index)
        self.last = {
            "feddle_atlas_size": float(len(atlas)),
            "feddle_rho": rho,
            "feddle_coef_mean": float(np.mean(c_hat)),
            "feddle_coef_abs_max": float(np.max(np.abs(c_hat))),
            "feddle_coef_negative_fraction": float(np.mean(c_hat < 0)),
            "feddle_evictions": float(atlas.evictions),
            "feddle_atlas_age_mean": float(np.mean(ages)),
            "feddle_atlas_age_max": float(np.max(ages)),
            # Table 6's "Cache": the stored deltas, as FedBuff's buffer counts its own; the
            # search's working copies are feddle_anchor_matrix_bytes and feddle_probe_bytes
            "feddle_cache_bytes": float(sum(slot.delta.nbytes for slot in atlas.slots)),
            "feddle_probe_bytes": float(sum(v.nbytes for v in (self.theta or {}).values())),
            **losses,
        }
        return True

    def _search(
        self, round_index: int, anchors: np.ndarray, c0: np.ndarray, c_fb: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """§3.7: the search from ``c0`` on the ID set (§3.4) or the OOD surrogate (§3.5)."""
        p = self.params
        if p.server_epochs == 0:
            return c0, {}
        handle, task = self.ctx.model()
        handle.set_global(self.weights)
        params = handle.global_parameters()
        module, like = handle.module, params[0]
        module.eval()  # every server pass: probe fit, diagnostics, search (§3.7)

        def t(x: np.ndarray) -> torch.Tensor:
            """``x`` on the model's device and dtype. A fresh float32 array for a CPU model is
            shared, not copied (the anchor matrix is |A| × d); the search only reads it."""
            return torch.from_numpy(x).to(device=like.device, dtype=like.dtype)

        base, a, c_start = t(self.weights[self.shared]), t(anchors), t(c0)
        bs, diag = p.server_batch_size, {}
        if p.mode == "id":
            obj = Objective(module, params, task, id_pool(self.ctx, "feddle").data, base, a)
        else:
            obj = Objective(module, params, task, None, base, a)
            obj.place(c_start)  # the probe is fitted at the start point (Eq. 9)
            data, probe_task = self._ood_objective(round_index, module, like, diag)
            if p.log_gradient_cosine and self.ctx.data.id is not None:
                on_id = replace(obj, data=self.ctx.data.id.data)
                g_l = on_id.full_gradient(c_start, bs)
                g_h = replace(obj, task=probe_task, data=data).full_gradient(c_start, bs)
                denom = float(g_h.norm() * g_l.norm())
                diag["feddle_grad_cosine"] = float(g_h @ g_l) / denom if denom else float("nan")
            obj = replace(obj, task=probe_task, data=data)
        module.eval()  # again: the probe fit may have trained it
        if p.log_server_loss:
            diag["server_loss_before"] = obj.loss(c_start, bs)
        config = SearchConfig(p.server_lr, p.server_epochs, bs, p.coef_optimizer, p.tie, p.tie_step)
        if p.log_flops:
            diag["server_gflops"] = obj.flops(c_start, config) / 1e9
        generator = self.ctx.torch_generator(f"feddle/search/{round_index}")
        c_hat = search(obj, c_start, t(c_fb), config, generator)
        if not bool(torch.isfinite(c_hat).all()):
            raise Diverged(
                f"round {round_index}: Feddle's coefficient search diverged (ĉ is not finite); "
                "lower algorithm.server_lr"
            )
        diag["feddle_anchor_matrix_bytes"] = float(a.numel() * a.element_size())  # on the device
        if like.is_cuda:  # the server's GPU: anchors, model and search together (Table 6)
            diag["server_gpu_peak_bytes"] = float(torch.cuda.max_memory_allocated(like.device))
        if p.log_server_loss:
            module.eval()
            diag["server_loss_after"] = obj.loss(c_hat, bs)
        module.train()
        return c_hat.cpu().double().numpy(), diag

    def _ood_objective(
        self, round_index: int, module: torch.nn.Module, like: torch.Tensor, diag: dict
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], ProbeTask]:
        """This round's OOD sample and ``h`` with the probe refitted at the start point (Eq. 9);
        θ is then frozen for the search (Eq. 10)."""
        p = self.params
        pool, (x, y) = ood_sample(
            self.ctx, p.ood_pool, p.ood_samples_per_round, f"feddle/ood/{round_index}", "feddle"
        )
        head = head_of(module)
        fresh = p.theta_init == "fresh" or self.theta is None
        stream = f"feddle/theta/{round_index}" if p.theta_init == "fresh" else "feddle/theta"
        probe = new_probe(head.in_features, pool.num_classes, self.ctx.stream_seed(stream), like)
        if not fresh:
            load_probe(probe, self.theta)
        diag["feddle_probe_loss"] = fit_probe(
            probe,
            module,
            head,
            (x, y),
            epochs=p.theta_epochs,
            lr=p.theta_lr,
            batch_size=p.server_batch_size,
            generator=self.ctx.torch_generator(f"feddle/theta/{round_index}"),
        )
        self.theta = probe_state(probe)
        for q in probe.parameters():
            q.requires_grad_(False)
        return (x, y), ProbeTask(probe, head)

    def _update_buffers(self, arrivals: list[Update]) -> None:
        """Non-trainable buffers (BN statistics), outside the anchors (§3.1, A14)."""
        if not self.buffers.any() or not arrivals or self.params.bn_buffers == "freeze":
            return
        weights = self.weights.copy()
        if self.params.bn_buffers == "fallback_mean":
            mean = np.mean([u.delta[self.buffers] for u in arrivals], axis=0, dtype=np.float64)
            weights[self.buffers] = weights[self.buffers] + mean.astype(np.float32)
        else:  # fedavg_models: the sample-weighted mean of the arriving models' buffers
            total = sum(u.num_samples for u in arrivals)
            models = [u.local_weights[self.buffers] * (u.num_samples / total) for u in arrivals]
            weights[self.buffers] = np.sum(models, axis=0, dtype=np.float64).astype(np.float32)
        self.weights = weights

    def metrics(self) -> dict[str, float]:
        return dict(self.last)

    def tables(self) -> dict[str, list[dict[str, float]]]:
        """``strategy/coefficients.csv``: every anchor's ĉ, c′ and raw norm, every round (§7.1
        item 13; the sign pattern of Fig. 6)."""
        return {"coefficients": list(self.coefficients)}


METHOD = register(Method.of(METHODS["feddle"], strategy=Feddle))


METHOD_OOD = register(Method.of(METHODS["feddle_ood"], strategy=Feddle))
