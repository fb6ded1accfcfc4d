"""Many clients' local training in one pass (``workers.execution: batched``).

k clients of one worker that start from their own copies of a module are trained together:

- every parameter (and buffer) is stacked on a leading client axis; the trained ones are leaves;
- each step runs one ``torch.func.vmap`` of ``functional_call`` over the clients whose batch has
  the same size (usually all of them), so PyTorch's per-operation cost is paid once per group of
  clients instead of once per client; the summed loss gives each client exactly its own gradient,
  because a client's loss reads only its own slice;
- the optimiser step is per client and written out here (SGD with momentum, Adam, AdamW, as
  ``torch.optim``'s single-tensor code computes them), so a client that has run out of batches
  takes no step: its parameters and optimiser state stay as they are; clipping computes each
  client's own norm; a linear schedule decays each client's rate over its own steps.

Each client keeps its own batch stream (``step_batches`` on its own generator), so a batched
client sees exactly the batches it would see alone; results differ from sequential training only
by floating-point reassociation in the batched kernels (``tests/test_batched.py`` states the
tolerance). What cannot be batched (``unbatchable`` says why) trains one client after another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.utils.rnn import pad_sequence

from raysim.training.chain import chain_forward, linear_chain, stacked_backward, written_out
from raysim.training.dp_sgd import (
    chain_clipped_sum,
    chain_of,
    clipped_sum,
    has_transformer,
    noise_generator,
    noised_mean,
)
from raysim.training.loop import step_batches
from raysim.training.settings import DP_SGD_STEPS_METRIC, LocalTrainingConfig, total_optimizer_steps
from raysim.training.tasks import CausalLMTask, ClassificationTask, Task

#: torch.optim's Adam/AdamW defaults
BETAS, EPS = (0.9, 0.999), 1e-8

PenaltyFn = Callable[[Sequence[torch.Tensor]], torch.Tensor]
#: the clients a step moves: all of them (a slice, so the stacks are updated through views) or
#: some (their indices)
Rows = slice | torch.Tensor


def stacked_forward(template: nn.Module) -> Callable[[dict, torch.Tensor], torch.Tensor] | None:
    """``forward(params, x)`` of k clients at once with batched matmuls, for a ``Sequential``
    of ``Linear``, ``Flatten`` and elementwise layers (``raysim.training.chain``): ``params``
    maps names to stacks (k, ...), ``x`` is (k, B, ...). None for any other module (``vmap``
    then does the work)."""
    layers = linear_chain(template)
    if layers is None:
        return None

    def forward(params: dict, x: torch.Tensor) -> torch.Tensor:
        return chain_forward(layers, params, x, stacked=True)

    return forward


def unbatchable(
    model: Any, task: Task, configs: Sequence[LocalTrainingConfig], personal: bool = False
) -> str:
    """Why these clients of ``model`` (a ``ModelHandle``) cannot train in one batched pass
    ("" when they can); ``personal``: the caller stacks the personal groups itself."""
    cfg = configs[0]
    if any(c.model_copy(update={"max_steps": cfg.max_steps}) != cfg for c in configs[1:]):
        return "the clients' local settings differ (a client behaviour changed them)"
    if cfg.backend != "torch" or cfg.mixed_precision != "no" or cfg.grad_accumulation != 1:
        return (
            "batched training takes plain torch steps (backend torch, no mixed precision, no "
            "gradient accumulation)"
        )
    if model.personal_groups() and not personal:
        return "its personal parameter groups are not stacked by the default local training"
    module = model.module
    if type(task) is CausalLMTask:
        from raysim.models.multilora import lora_layers

        if cfg.dp_sgd is not None:
            return (
                "local.dp_sgd takes a causal LM's per-example gradients example by example, "
                "one client after another"
            )

        layers = lora_layers(module, getattr(model, "global_adapter", ""))
        if not layers:
            return "a causal LM batches through multi-LoRA: it needs LoRA adapters"
        if any(
            not isinstance(m.lora_dropout[model.global_adapter], nn.Identity) for _, m in layers
        ):
            return "LoRA dropout draws per client: set model.lora.dropout 0"
        return ""
    if type(task) is not ClassificationTask:
        return f"its task ({type(task).__name__}) has no batched loss yet"
    if cfg.absent_logits != "keep":
        return "local.absent_logits masks each client's own classes"
    if stacked_forward(module) is None and has_transformer(module):
        return "a transformers model does not run under vmap (causal LMs batch through multi-LoRA)"
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            return "BatchNorm updates running statistics in place"
        if isinstance(m, torch.nn.Dropout) and m.p > 0:
            return "dropout draws from torch's global stream, per client when sequential"
    return ""


@dataclass
class _Optimiser:
    """Per-client SGD / Adam / AdamW over stacked tensors (client axis first), in place.

    ``rate`` gives each client's step size, 0 for a client that takes no step this time; its
    gradient is zero then, and every state update is written so that a zero rate and a zero
    gradient leave that client's parameters and state exactly as they were."""

    cfg: LocalTrainingConfig
    params: list[torch.Tensor]

    def __post_init__(self) -> None:
        self.state: list[dict[str, torch.Tensor]] = [{} for _ in self.params]

    def step(self, grads: list[torch.Tensor], rates: list[float], t: int) -> None:
        """The t-th step (1-based) of every client whose rate (``rates``, one per client) is
        not 0."""
        cfg = self.cfg
        if cfg.optimizer == "sgd":
            moving = {r for r in rates if r > 0}
            # every client moves at one rate; or, with neither momentum nor weight decay, every
            # client that moves (the others' gradients are zero: they stay exactly as they are)
            plain = not cfg.momentum and not cfg.weight_decay
            if len(moving) == 1 and (plain or min(rates) > 0):
                self._sgd_all(grads, moving.pop())
                return
        rate = torch.tensor(rates, dtype=torch.float64)
        moving = (rate > 0).to(rate.dtype)
        views: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (dtype, ndim) → rate, on
        with torch.no_grad():
            for p, g, state in zip(self.params, grads, self.state, strict=True):
                key = (p.dtype, p.ndim)
                if key not in views:
                    shape = (-1,) + (1,) * (p.ndim - 1)
                    on_p = {"device": p.device, "dtype": p.dtype}
                    views[key] = rate.to(**on_p).view(shape), moving.to(**on_p).view(shape)
                lr, on = views[key]
                if cfg.optimizer == "sgd":
                    if cfg.weight_decay:
                        g = g.add(p * on, alpha=cfg.weight_decay)
                    if cfg.momentum:
                        buf = state.get("momentum")
                        if buf is None:  # torch's first step: the buffer is the gradient
                            buf = state["momentum"] = g.clone()
                        else:  # moving: momentum·buf + g; still: buf (and g = 0)
                            buf.mul_(1 - on * (1 - cfg.momentum)).add_(g)
                        g = buf
                    p.sub_(lr * g)
                    continue
                if cfg.optimizer == "adamw":
                    p.mul_(1 - lr * cfg.weight_decay)
                elif cfg.weight_decay:
                    g = g.add(p * on, alpha=cfg.weight_decay)
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.lerp_(g, on * (1 - BETAS[0]))
                v.mul_(1 - on * (1 - BETAS[1])).addcmul_(g, g, value=1 - BETAS[1])
                step_size = lr / (1 - BETAS[0] ** t)
                denom = (v.sqrt() / math.sqrt(1 - BETAS[1] ** t)).add_(EPS)
                p.sub_(step_size * (m / denom))

    def _sgd_all(self, grads: list[torch.Tensor], lr: float) -> None:
        """SGD (momentum, weight decay) when every client steps at the same rate: the scalar
        form of ``step``, as ``torch.optim.SGD`` writes it (fewer operations per step)."""
        cfg = self.cfg
        with torch.no_grad():
            for p, g, state in zip(self.params, grads, self.state, strict=True):
                if cfg.weight_decay:
                    g = g.add(p, alpha=cfg.weight_decay)
                if cfg.momentum:
                    buf = state.get("momentum")
                    if buf is None:
                        buf = state["momentum"] = g.clone()
                    else:
                        buf.mul_(cfg.momentum).add_(g)
                    g = buf
                p.add_(g, alpha=-lr)


def _clip(grads: list[torch.Tensor], max_norm: float) -> None:
    """``clip_grad_norm_`` per client: each client's gradients scaled by its own norm."""
    k = grads[0].shape[0]
    norms = torch.stack([g.reshape(k, -1).norm(dim=1) for g in grads]).norm(dim=0)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view((k,) + (1,) * (g.ndim - 1)).to(g.dtype))


class _Padded:
    """Every client's examples in one table (plus a zero row that padding points at), so a
    step's batches of all clients come out padded to the longest in one gather."""

    def __init__(self, datas: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        xs, ys = [d[0] for d in datas], [d[1] for d in datas]
        self.x = torch.cat([*xs, xs[0].new_zeros((1, *xs[0].shape[1:]))])
        self.y = torch.cat([*ys, ys[0].new_zeros(1)])
        self.pad = len(self.y) - 1
        sizes = torch.tensor([len(y) for y in ys])
        self.offsets = (torch.cumsum(sizes, 0) - sizes).tolist()
        self._weights: dict[tuple[int, ...], torch.Tensor] = {}

    def weight(self, lengths: tuple[int, ...]) -> torch.Tensor:
        """(m, longest): 1/length on a client's own rows, 0 on its padding (kept per pattern)."""
        weight = self._weights.get(lengths)
        if weight is None:
            if len(self._weights) > 4096:
                self._weights.clear()
            device = self.y.device
            each = torch.tensor(lengths, device=device)[:, None]
            weight = (torch.arange(max(lengths), device=device) < each) / each
            self._weights[lengths] = weight
        return weight

    def _rows(self, index: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The clients' rows padded to the longest batch, and ``weight``'s."""
        lengths = tuple(len(i) for i in index)
        if min(lengths) == max(lengths):
            rows = torch.stack(index)
        else:
            rows = pad_sequence(index, batch_first=True, padding_value=self.pad)
        return rows, self.weight(lengths)

    def loss(self, forward: Callable, params: dict, index: list[torch.Tensor]) -> torch.Tensor:
        """Each client's mean cross-entropy on its batch (``index``: its rows, table-wide)."""
        rows, weight = self._rows(index)
        logits = forward(params, self.x[rows])
        ce = nn.functional.cross_entropy(
            logits.flatten(0, 1), self.y[rows].flatten(), reduction="none"
        )
        return (ce.view(rows.shape) * weight).sum(dim=1)

    def gradients(
        self, layers: list, params: dict, index: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``loss``'s values and each linear layer's gradient of their sum, written out
        (``chain.stacked_backward``): ∂/∂logits = (softmax − one-hot)·weight."""
        rows, weight = self._rows(index)
        y = self.y[rows].unsqueeze(2)

        def delta(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logp = torch.log_softmax(logits, dim=2)
            loss = (-logp.gather(2, y).squeeze(2) * weight).sum(dim=1)
            minus_one = torch.full(y.shape, -1.0, dtype=logp.dtype, device=logp.device)
            grad = logp.exp_().scatter_add_(2, y, minus_one)
            return loss, grad.mul_(weight.unsqueeze(2))

        return stacked_backward(layers, params, self.x[rows], delta)


class _Streams:
    """Each client's own batch stream (``step_batches`` on its generator) walked in lockstep."""

    def __init__(
        self, task: Task, datas: Sequence[Any], configs: Sequence[LocalTrainingConfig], generators
    ):
        """``configs``: each client's (they differ in ``max_steps`` at most: partial work)."""
        sizes = [task.num_examples(d) for d in datas]
        self.cfg, self.k = configs[0], len(datas)
        triples = list(zip(sizes, configs, generators, strict=True))
        self.steps = [list(step_batches(n, c, g)) for n, c, g in triples]
        self.totals = [total_optimizer_steps(n, c) for n, c, _ in triples]
        self.losses: list[list[float]] = [[] for _ in datas]

    def __len__(self) -> int:
        return max((len(s) for s in self.steps), default=0)

    def active(self, t: int) -> list[int]:
        return [i for i in range(self.k) if t < len(self.steps[i])]

    def rate(self, t: int, active: list[int]) -> list[float]:
        """Each client's step size at its t-th step (0: it takes none); a linear schedule is
        LambdaLR after t steps, lr·(T_i − t)/T_i."""
        cfg = self.cfg
        rate = [0.0] * self.k
        for i in active:
            if cfg.lr_schedule != "linear":
                rate[i] = cfg.lr
                continue
            total = max(self.totals[i], 1)
            rate[i] = cfg.lr * max(0.0, (total - t) / total)
        return rate

    def step(
        self,
        opt: _Optimiser,
        total: torch.Tensor,
        t: int,
        active: list[int],
        extra: tuple[Rows, list[torch.Tensor]] | None = None,
    ) -> None:
        """Backward of the clients' summed losses, plus ``extra`` (rows, gradients written out:
        a penalty's), per-client clipping, the optimiser step."""
        got = torch.autograd.grad(total, opt.params, allow_unused=True)
        grads = [
            torch.zeros_like(p) if g is None else g for p, g in zip(opt.params, got, strict=True)
        ]
        if extra is not None:
            rows, more = extra
            for g, e in zip(grads, more, strict=True):
                g[rows] += e
        self.apply(opt, grads, t, active)

    def apply(self, opt: _Optimiser, grads: list[torch.Tensor], t: int, active: list[int]):
        """Per-client clipping and the optimiser step, for gradients (k, ...) of every client
        (zero for those that take no step)."""
        if self.cfg.max_grad_norm is not None:
            _clip(grads, self.cfg.max_grad_norm)  # clients that take no step have zero gradients
        opt.step(grads, self.rate(t, active), t + 1)

    def record(self, clients: Sequence[int], losses: torch.Tensor) -> None:
        for i, value in zip(clients, losses.detach().tolist(), strict=True):
            self.losses[i].append(value)

    def metrics(self) -> list[dict[str, float]]:
        return [
            {"train_loss": sum(ls) / len(ls) if ls else float("nan"), "local_steps": float(len(ls))}
            for ls in self.losses
        ]


def train_batched(
    model: Any,
    starts: Sequence[Sequence[torch.Tensor]],
    task: Task,
    datas: Sequence[Any],
    cfg: LocalTrainingConfig | Sequence[LocalTrainingConfig],
    generators: Sequence[torch.Generator],
    penalty: PenaltyFn | None = None,
    params: Sequence[torch.nn.Parameter] | None = None,
) -> tuple[list[list[torch.Tensor]], list[dict[str, float]]]:
    """k clients' local training of ``params`` (default ``model.global_parameters()``; tensors
    the module applies now) of ``model`` (a ``ModelHandle``), client i starting from
    ``starts[i]`` on ``datas[i]``, as ``train_local`` would one client at a time; returns each
    client's trained tensors and metrics. Everything else of the model is shared by the clients
    and left as it is; ``penalty`` (FedProx's, Ditto's) applies to each client's own tensors. A
    causal LM with LoRA trains its global adapter through ``MultiLoRA``. ``cfg``: the clients'
    settings, or one per client where they differ in ``max_steps`` (devices' partial work): a
    client whose steps end sooner sits out the rest of the group's steps."""
    configs = [cfg] * len(starts) if isinstance(cfg, LocalTrainingConfig) else list(cfg)
    cfg = configs[0]
    if type(task) is CausalLMTask:
        return _train_multilora(model, starts, task, datas, configs, generators, penalty)
    module = model.module
    trained = list(params) if params is not None else model.global_parameters()
    index = {id(p): n for n, p in module.named_parameters()}
    trained_names = [index[id(p)] for p in trained]
    k = len(starts)
    stacked = {
        n: torch.stack([s[j].detach() for s in starts]).requires_grad_(True)
        for j, n in enumerate(trained_names)
    }
    shared = {n: p.detach() for n, p in module.named_parameters() if n not in stacked}
    buffers = dict(module.named_buffers())
    opt = _Optimiser(cfg, list(stacked.values()))
    module.train()
    streams = _Streams(task, datas, configs, generators)
    if cfg.dp_sgd is not None:
        private = _PrivateGroup(module, trained_names, shared | buffers, task, cfg, generators)
        for t in range(len(streams)):
            active = streams.active(t)
            grads = private.step(stacked, [datas[i] for i in active], streams, t, active, penalty)
            opt.step(grads, streams.rate(t, active), t + 1)
        finals = [[stacked[n][i].detach().clone() for n in trained_names] for i in range(k)]
        return finals, [m | {DP_SGD_STEPS_METRIC: m["local_steps"]} for m in streams.metrics()]

    def client_loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def forward(inputs: torch.Tensor) -> torch.Tensor:
            return functional_call(module, (params, shared, buffers), (inputs,))

        loss = task.loss(forward, (x, y))
        if penalty is not None:
            loss = loss + penalty([params[n] for n in trained_names])
        return loss

    batched_loss = vmap(client_loss)
    fast = stacked_forward(module) if not buffers else None
    penalties = None
    if penalty is not None:  # each client's value: the penalty's stacked form, or vmap's
        each = getattr(penalty, "stacked", None) or vmap(penalty)
        penalties = lambda ps: each([ps[n] for n in trained_names])  # noqa: E731
    written = getattr(penalty, "stacked_with_gradient", None)
    layers = None  # a chain whose step is written out: no penalty, or one that writes its own
    if fast is not None and (penalty is None or written is not None):
        chain = linear_chain(module)
        layers = chain if written_out(chain) else None
    if fast is not None:
        table = _Padded(datas)
        table_steps = [
            [idx + off for idx in s] for s, off in zip(streams.steps, table.offsets, strict=True)
        ]
    for t in range(len(streams)):
        active = streams.active(t)
        rows: Rows = slice(None) if len(active) == k else torch.tensor(active)
        extra = None
        if fast is not None:  # the active clients' stacks, shared tensors broadcast to them
            params = {n: stacked[n][rows] for n in trained_names}
            params.update({n: p.expand(len(active), *p.shape) for n, p in shared.items()})
        if layers is not None:  # the step written out, no autograd
            with torch.no_grad():
                out, got = table.gradients(layers, params, [table_steps[i][t] for i in active])
                grads = [got[n] for n in trained_names]
                if written is not None:
                    value, more = written([params[n] for n in trained_names])
                    out = out + value
                    grads = [g.add_(e) for g, e in zip(grads, more, strict=True)]
                if len(active) < k:  # every client's, zero for those that take no step
                    grads = [torch.zeros_like(stacked[n]).index_copy_(0, rows, g)
                             for n, g in zip(trained_names, grads, strict=True)]  # fmt: skip
            streams.record(active, out)
            streams.apply(opt, grads, t, active)
            continue
        if fast is not None:  # one pass: batches padded to the longest, padding weighted 0
            out = table.loss(fast, params, [table_steps[i][t] for i in active])
            if written is not None:  # the penalty's value, and its gradient written out
                value, more = written([params[n].detach() for n in trained_names])
                out, extra = out + value, (rows, more)
            elif penalties is not None:
                out = out + penalties({n: params[n] for n in trained_names})
            groups = [(active, out)]
        else:  # vmap over the clients whose batches have the same size
            batch = [task.batch(datas[i], streams.steps[i][t]) for i in active]
            groups = []
            for members in _same_size(batch).values():
                sub = torch.tensor([active[j] for j in members])
                x = torch.stack([batch[j][0] for j in members])
                y = torch.stack([batch[j][1] for j in members])
                params = {n: stacked[n][sub] for n in trained_names}
                groups.append(([active[j] for j in members], batched_loss(params, x, y)))
        for members, out in groups:
            streams.record(members, out)
        streams.step(opt, sum(out.sum() for _, out in groups), t, active, extra)
    finals = [[stacked[n][i].detach().clone() for n in trained_names] for i in range(k)]
    return finals, streams.metrics()


def _pad_rows(batch: dict[str, torch.Tensor], length: int) -> dict[str, torch.Tensor]:
    """A causal-LM batch right-padded to ``length`` (no attention, no loss on the padding)."""
    extra = length - batch["input_ids"].shape[1]
    if extra == 0:
        return batch
    fill = {"input_ids": 0, "attention_mask": 0, "labels": -100}
    return {k: nn.functional.pad(v, (0, extra), value=fill.get(k, 0)) for k, v in batch.items()}


def _train_multilora(model, starts, task, datas, configs, generators, penalty):
    """``train_batched`` for a causal LM: each step, the active clients' batches concatenated
    (padded to the longest), one forward and backward through ``MultiLoRA``, each client's
    mean token loss its own."""
    from raysim.models.multilora import MultiLoRA, client_losses

    cfg = configs[0]
    k = len(starts)
    multi = MultiLoRA(model.module, model.global_adapter, k)
    if multi.names() != [n for n, _ in model._global]:
        raise ValueError("the model's global adapter is not in MultiLoRA's order")
    for i, own in enumerate(starts):
        multi.load(i, own)
    leaves = multi.parameters()
    opt = _Optimiser(cfg, leaves)
    model.module.train()
    streams = _Streams(task, datas, configs, generators)
    penalties = vmap(lambda *ps: penalty(list(ps))) if penalty is not None else None
    for t in range(len(streams)):
        active = streams.active(t)
        batches = [task.batch(datas[i], streams.steps[i][t]) for i in active]
        length = max(b["input_ids"].shape[1] for b in batches)
        batches = [_pad_rows(b, length) for b in batches]
        joined = {key: torch.cat([b[key] for b in batches]) for key in batches[0]}
        device = joined["input_ids"].device
        owner = torch.cat(
            [torch.full((len(b["input_ids"]),), i) for i, b in zip(active, batches, strict=True)]
        ).to(device)
        with multi.route(owner):
            logits = model.module(
                input_ids=joined["input_ids"], attention_mask=joined["attention_mask"]
            ).logits
        losses = client_losses(logits, joined["labels"], owner, k)
        if penalties is not None:
            losses = losses + penalties(*leaves).to(losses.dtype)
        picked = losses[torch.tensor(active, device=losses.device)]
        streams.record(active, picked)
        streams.step(opt, picked.sum(), t, active)
    return [multi.unstack(i) for i in range(k)], streams.metrics()


def _same_size(batches: Sequence[Any]) -> dict[int, list[int]]:
    """The positions of ``batches`` (classification (x, y) pairs) by their number of rows."""
    out: dict[int, list[int]] = {}
    for j, b in enumerate(batches):
        out.setdefault(len(b[1]), []).append(j)
    return out


class _PrivateGroup:
    """DP-SGD (``raysim.training.dp_sgd``) for a batched group: each client's clipped sum by the
    outer-product rule on a stacked linear chain, else by a ``vmap`` over its examples nested in
    a ``vmap`` over the clients; each example clipped over all of its client's trained tensors,
    each client's sum noised from its own stream (the draws it takes trained alone) and divided
    by its batch's size (``dp_sgd.noised_mean``, as alone)."""

    def __init__(self, module, names, frozen, task, cfg, generators) -> None:
        self.names, self.settings, self.task = names, cfg.dp_sgd, task
        self.noise = [noise_generator(g) for g in generators]

        def loss_one(trained: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            def forward(inputs: torch.Tensor) -> torch.Tensor:
                return functional_call(module, frozen | trained, (inputs,))

            return task.loss(forward, (x.unsqueeze(0), y.unsqueeze(0)))

        per_example = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0), randomness="different")
        self.per_client = vmap(per_example, randomness="different")
        self.chain = chain_of(module, [p for n, p in module.named_parameters() if n in names],
                              task)  # fmt: skip

    def step(self, stacked, datas, streams, t, active, penalty) -> list[torch.Tensor]:
        """Every client's noised gradient of step t (zero for a client that takes none)."""
        task_batch = [
            self.task.batch(d, streams.steps[i][t]) for d, i in zip(datas, active, strict=True)
        ]
        grads = {n: torch.zeros_like(stacked[n]) for n in self.names}
        for size, members in _same_size(task_batch).items():
            clients = [active[j] for j in members]
            x = torch.stack([task_batch[j][0] for j in members])
            y = torch.stack([task_batch[j][1] for j in members])
            sums, losses = self._clipped_sums(stacked, torch.tensor(clients), x, y)
            for row, client in enumerate(clients):
                own = [sums[n][row] for n in self.names]
                noised = noised_mean(own, size, self.settings, self.noise[client])
                for n, g in zip(self.names, noised, strict=True):
                    grads[n][client] = g
            streams.record(clients, losses.mean(dim=1))
        if penalty is not None:
            rows = torch.tensor(active)
            extra = vmap(torch.func.grad(lambda ps: penalty([ps[n] for n in self.names])))(
                {n: stacked[n][rows].detach() for n in self.names}
            )
            for n in self.names:
                grads[n][rows] += extra[n]
        return [grads[n] for n in self.names]

    def _clipped_sums(self, stacked, sub, x, y):
        """Each of these clients' Σ_i clip_C(∇ℓ_i), (m, ...) per tensor, and losses (m, B):
        by the outer-product rule on a linear chain, else by nested ``vmap``."""
        if self.chain is not None:
            params = {n: stacked[n][sub] for n in self.names}  # in the graph: stacked leaves
            sums, losses = chain_clipped_sum(self.chain, params, (x, y), self.settings.clip,
                                             stacked=True)  # fmt: skip
            if sums is not None:
                return sums, losses
            self.chain = None
        params = {n: stacked[n][sub].detach() for n in self.names}
        per, losses = self.per_client(params, x, y)  # per[n]: (m, B, ...), losses (m, B)
        sums = clipped_sum([per[n] for n in self.names], self.settings.clip, axes=2)
        return dict(zip(self.names, sums, strict=True)), losses
