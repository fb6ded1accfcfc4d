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
from torch.func import functional_call, vmap
from torch.nn.utils.rnn import pad_sequence

from raysim.training.backends import total_optimizer_steps
from raysim.training.loop import step_batches
from raysim.training.settings import LocalTrainingConfig
from raysim.training.tasks import ClassificationTask, Task

#: torch.optim's Adam/AdamW defaults
BETAS, EPS = (0.9, 0.999), 1e-8

PenaltyFn = Callable[[Sequence[torch.Tensor]], torch.Tensor]
#: the clients a step moves: all of them (a slice, so the stacks are updated through views) or
#: some (their indices)
Rows = slice | torch.Tensor
#: layers whose batched form is the layer itself (they act elementwise)
ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Identity)


def stacked_forward(template: nn.Module) -> Callable[[dict, torch.Tensor], torch.Tensor] | None:
    """``forward(params, x)`` of k clients at once with batched matmuls, for a ``Sequential``
    of ``Linear``, ``Flatten`` and elementwise layers: ``params`` maps names to stacks
    (k, ...), ``x`` is (k, B, ...). None for any other module (``vmap`` then does the work)."""
    layers: list[tuple] = []

    def walk(module: nn.Module, prefix: str) -> bool:
        for name, child in module.named_children():
            if isinstance(child, nn.Sequential):
                if not walk(child, f"{prefix}{name}."):
                    return False
            elif isinstance(child, nn.Linear):
                layers.append(("linear", f"{prefix}{name}", child.bias is not None))
            elif isinstance(child, nn.Flatten) and child.start_dim >= 1 and child.end_dim == -1:
                layers.append(("flatten", child.start_dim + 1))
            elif isinstance(child, ELEMENTWISE) or (isinstance(child, nn.Dropout) and not child.p):
                layers.append(("apply", child))
            else:
                return False
        return True

    if type(template) is not nn.Sequential or not walk(template, ""):
        return None

    def forward(params: dict, x: torch.Tensor) -> torch.Tensor:
        for kind, *rest in layers:
            if kind == "linear":
                name, bias = rest
                wt = params[f"{name}.weight"].transpose(1, 2)
                if bias:
                    x = torch.baddbmm(params[f"{name}.bias"].unsqueeze(1), x, wt)
                else:
                    x = torch.bmm(x, wt)
            elif kind == "flatten":
                x = x.flatten(rest[0])
            else:
                x = rest[0](x)
        return x

    return forward


def unbatchable(
    modules: Sequence[torch.nn.Module], task: Task, configs: Sequence[LocalTrainingConfig]
) -> str:
    """Why these clients cannot train in one batched pass ("" when they can)."""
    cfg = configs[0]
    if any(c != cfg for c in configs[1:]):
        return "the clients' local settings differ (a client behaviour changed them)"
    if type(task) is not ClassificationTask:
        return f"its task ({type(task).__name__}) has no batched loss yet"
    if cfg.absent_logits != "keep":
        return "local.absent_logits masks each client's own classes"
    if cfg.backend != "torch" or cfg.mixed_precision != "no" or cfg.grad_accumulation != 1:
        return (
            "batched training takes plain torch steps (backend torch, no mixed precision, no "
            "gradient accumulation)"
        )
    for m in modules[0].modules():
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

    def step(self, grads: list[torch.Tensor], rate: torch.Tensor, t: int) -> None:
        """The t-th step (1-based) of every client whose ``rate`` (shape (k,)) is not 0."""
        cfg = self.cfg
        moving = (rate > 0).to(rate.dtype)
        with torch.no_grad():
            for p, g, state in zip(self.params, grads, self.state, strict=True):
                shape = (-1,) + (1,) * (p.ndim - 1)
                lr, on = rate.view(shape).to(p.dtype), moving.view(shape).to(p.dtype)
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

    def loss(self, forward: Callable, params: dict, index: list[torch.Tensor]) -> torch.Tensor:
        """Each client's mean cross-entropy on its batch (``index``: its rows, table-wide)."""
        rows = pad_sequence(index, batch_first=True, padding_value=self.pad)
        lengths = torch.tensor([len(i) for i in index])
        weight = (torch.arange(rows.shape[1]) < lengths[:, None]) / lengths[:, None]
        logits = forward(params, self.x[rows])
        ce = nn.functional.cross_entropy(
            logits.flatten(0, 1), self.y[rows].flatten(), reduction="none"
        )
        return (ce.view(rows.shape) * weight).sum(dim=1)


def train_batched(
    modules: Sequence[torch.nn.Module],
    trained: Sequence[Sequence[torch.nn.Parameter]],
    task: Task,
    datas: Sequence[Any],
    cfg: LocalTrainingConfig,
    generators: Sequence[torch.Generator],
    penalty: PenaltyFn | None = None,
) -> list[dict[str, float]]:
    """Train client i's ``trained[i]`` (parameters of ``modules[i]``) on ``datas[i]``, as
    ``train_local`` would one client at a time; the modules hold the results afterwards.

    All modules share one architecture; ``penalty`` (FedProx's) is one function for every client,
    applied to each client's own trained tensors."""
    template = modules[0]
    k = len(modules)
    names = [n for n, _ in template.named_parameters()]
    index = {id(p): n for n, p in template.named_parameters()}
    trained_names = [index[id(p)] for p in trained[0]]
    per_client = [dict(m.named_parameters()) for m in modules]
    stacked = {
        n: torch.stack([pc[n].detach() for pc in per_client]).requires_grad_(n in trained_names)
        for n in names
    }
    buffers = {
        n: torch.stack([dict(m.named_buffers())[n] for m in modules])
        for n, _ in template.named_buffers()
    }
    leaves = [stacked[n] for n in trained_names]
    opt = _Optimiser(cfg, leaves)
    for m in modules:
        m.train()

    sizes = [task.num_examples(d) for d in datas]
    steps = [list(step_batches(n, cfg, g)) for n, g in zip(sizes, generators, strict=True)]
    totals = [total_optimizer_steps(n, cfg) for n in sizes]
    losses: list[list[float]] = [[] for _ in range(k)]

    def client_loss(params: dict, bufs: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def model(inputs: torch.Tensor) -> torch.Tensor:
            return functional_call(template, (params, bufs), (inputs,))

        loss = task.loss(model, (x, y))
        if penalty is not None:
            loss = loss + penalty([params[n] for n in trained_names])
        return loss

    batched_loss = vmap(client_loss)
    fast = stacked_forward(template) if not buffers else None
    penalties = None
    if penalty is not None:
        penalties = vmap(lambda ps: penalty([ps[n] for n in trained_names]))
    everyone = slice(None)
    if fast is not None:
        table = _Padded(datas)
        table_steps = [
            [idx + off for idx in s] for s, off in zip(steps, table.offsets, strict=True)
        ]
    for t in range(max((len(s) for s in steps), default=0)):
        active = [i for i in range(k) if t < len(steps[i])]
        rows: Rows = everyone if len(active) == k else torch.tensor(active)
        if fast is not None:  # one pass: batches padded to the longest, padding weighted 0
            params = {n: stacked[n][rows] for n in names}
            out = table.loss(fast, params, [table_steps[i][t] for i in active])
            if penalties is not None:
                out = out + penalties({n: params[n] for n in trained_names})
            groups = [(active, out)]
        else:  # vmap over the clients whose batches have the same size
            batch = [task.batch(datas[i], steps[i][t]) for i in active]
            by_size: dict[int, list[int]] = {}
            for j, b in enumerate(batch):
                by_size.setdefault(len(b[1]), []).append(j)
            groups = []
            for members in by_size.values():
                sub = torch.tensor([active[j] for j in members])
                x = torch.stack([batch[j][0] for j in members])
                y = torch.stack([batch[j][1] for j in members])
                params = {n: stacked[n][sub] for n in names}
                bufs = {n: b[sub] for n, b in buffers.items()}
                groups.append(([active[j] for j in members], batched_loss(params, bufs, x, y)))
        total = sum(out.sum() for _, out in groups)
        grads = list(torch.autograd.grad(total, leaves, allow_unused=True))
        grads = [
            torch.zeros_like(p) if g is None else g for p, g in zip(leaves, grads, strict=True)
        ]
        for members, out in groups:
            for i, value in zip(members, out.detach().tolist(), strict=True):
                losses[i].append(value)
        if cfg.max_grad_norm is not None:
            _clip(grads, cfg.max_grad_norm)  # clients that take no step have zero gradients
        rate = torch.zeros(k, dtype=torch.float64)
        for i in active:  # a linear schedule: LambdaLR after t steps, lr·(T_i − t)/T_i
            total_i = max(totals[i], 1)
            linear = cfg.lr_schedule == "linear"
            rate[i] = cfg.lr * max(0.0, (total_i - t) / total_i) if linear else cfg.lr
        opt.step(grads, rate, t + 1)

    with torch.no_grad():
        for i, pc in enumerate(per_client):
            for n in trained_names:
                pc[n].copy_(stacked[n][i])
    return [
        {
            "train_loss": sum(ls) / len(ls) if ls else float("nan"),
            "local_steps": float(len(ls)),
        }
        for ls in losses
    ]
