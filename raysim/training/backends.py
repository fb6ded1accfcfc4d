"""Training backends: how one local call's backward, optimizer step and precision are executed.

``train_local`` owns the loop (batches, micro-batches, loss scaling); a backend turns
``(module, params, cfg)`` into a :class:`Stepper` for one call and tears it down afterwards, leaving
the module as it found it except for the trained values of ``params``.

- ``torch``: a plain optimizer; autocast only on CUDA (on the CPU mixed precision is a no-op).
- ``accelerate``: one ``Accelerator`` per process (its state is a process singleton); the optimizer
  goes through ``accelerator.prepare``, backward, clipping and autocast (bf16 also on the CPU)
  through the accelerator.
- ``deepspeed``: a fresh ``deepspeed.initialize`` per call over a torch optimizer (ZeRO 0-3, CPU
  offload, bf16). The module is restored afterwards (see :class:`DeepSpeedBackend`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from raysim.training.settings import LocalTrainingConfig

BACKENDS = ("torch", "accelerate", "deepspeed")
PenaltyFn = Callable[[Sequence[torch.Tensor]], torch.Tensor]


class Stepper(Protocol):
    """One local call's optimisation machinery (made by :meth:`Backend.prepare`)."""

    def forward_context(self) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward pass and loss (autocast, engine bookkeeping)."""
        ...

    def cast(self, batch: Any) -> Any:
        """The batch with floating tensors in the dtype the module computes in."""
        ...

    def penalty(self, fn: PenaltyFn, params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
        """``fn(params)``, with ``params`` whole while the term and its backward need them."""
        ...

    def backward(self, loss: torch.Tensor, sync: bool = True) -> None:
        """Accumulate ``loss``'s gradient; ``sync`` marks the last micro-batch before a step."""
        ...

    def step(self) -> None:
        """Clip, optimizer step, scheduler step, zero the gradients."""
        ...

    @property
    def lr(self) -> float:
        """The learning rate the next step uses."""
        ...

    def finish(self) -> None:
        """Release per-call resources; ``params`` keep the trained values in their dtype."""
        ...


class Backend(Protocol):
    def prepare(
        self,
        module: torch.nn.Module,
        params: Sequence[torch.nn.Parameter],
        cfg: LocalTrainingConfig,
        total_steps: int,
    ) -> Stepper: ...


def make_optimizer(
    params: Sequence[torch.nn.Parameter], cfg: LocalTrainingConfig
) -> torch.optim.Optimizer:
    """A fresh torch optimizer over ``params`` as ``cfg`` says."""
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def make_scheduler(
    optimizer: torch.optim.Optimizer, cfg: LocalTrainingConfig, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Linear decay to 0 over ``total_steps`` (no warmup, HF's default), or None for constant."""
    if cfg.lr_schedule == "constant":
        return None
    total = max(total_steps, 1)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, (total - s) / total))


def cast_floats(batch: Any, dtype: torch.dtype | None) -> Any:
    """``batch`` (tensor, dict, list or tuple of them) with floating tensors cast to ``dtype``."""
    if dtype is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: cast_floats(v, dtype) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(cast_floats(v, dtype) for v in batch)
    return batch


def _device_of(params: Sequence[torch.nn.Parameter]) -> torch.device:
    return params[0].device if params else torch.device("cpu")


# --------------------------------------------------------------------------- torch
class TorchStepper:
    """Plain torch: autocast (+ GradScaler for fp16) on CUDA only."""

    def __init__(
        self, params: Sequence[torch.nn.Parameter], cfg: LocalTrainingConfig, total_steps: int
    ) -> None:
        self.params = list(params)
        self.cfg = cfg
        self.optimizer = make_optimizer(self.params, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg, total_steps)
        device = _device_of(self.params)
        self.amp_dtype = None
        if device.type == "cuda" and cfg.mixed_precision != "no":
            self.amp_dtype = torch.bfloat16 if cfg.mixed_precision == "bf16" else torch.float16
        self.device_type = device.type
        use_scaler = self.amp_dtype is torch.float16
        self.scaler = torch.amp.GradScaler(device.type) if use_scaler else None
        self.optimizer.zero_grad(set_to_none=True)

    def forward_context(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.amp_dtype)

    def cast(self, batch: Any) -> Any:
        return batch

    def penalty(self, fn: PenaltyFn, params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
        return fn(params)

    def backward(self, loss: torch.Tensor, sync: bool = True) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def finish(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)


class TorchBackend:
    def prepare(
        self,
        module: torch.nn.Module,
        params: Sequence[torch.nn.Parameter],
        cfg: LocalTrainingConfig,
        total_steps: int,
    ) -> TorchStepper:
        return TorchStepper(params, cfg, total_steps)


# --------------------------------------------------------------------------- accelerate
class AccelerateStepper(TorchStepper):
    """Backward, clipping and the optimizer through one process-wide ``Accelerator``.

    The loop owns accumulation (it scales each micro-batch's loss by 1/m for the m micro-batches of
    a step, also on an epoch's short last step), so the accelerator runs with
    ``gradient_accumulation_steps=1`` and non-final micro-batches run under ``no_sync``.
    ``accumulate()`` is not used: without a prepared dataloader it divides by the configured count
    even on a short last step and decides the sync by a modulo counter.
    """

    def __init__(
        self,
        accelerator: Any,
        module: torch.nn.Module,
        params: Sequence[torch.nn.Parameter],
        cfg: LocalTrainingConfig,
        total_steps: int,
    ) -> None:
        self.accelerator = accelerator
        self.module = module
        self.params = list(params)
        self.cfg = cfg
        self.optimizer = accelerator.prepare_optimizer(make_optimizer(self.params, cfg))
        self.scheduler = make_scheduler(self.optimizer.optimizer, cfg, total_steps)
        self.optimizer.zero_grad(set_to_none=True)

    def forward_context(self) -> contextlib.AbstractContextManager:
        return self.accelerator.autocast()

    def backward(self, loss: torch.Tensor, sync: bool = True) -> None:
        ctx = contextlib.nullcontext() if sync else self.accelerator.no_sync(self.module)
        with ctx:
            self.accelerator.backward(loss)

    def step(self) -> None:
        if self.cfg.max_grad_norm is not None:
            self.accelerator.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def finish(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        # Drop the accelerator's reference to this call's optimizer. ``free_memory()`` does that
        # too, but also runs ``gc.collect()`` and empties the CUDA cache on every call: 0.2 s a
        # client on a tiny LLaMA, 18x its training (benchmarks/backend_calls.py), and a fresh
        # allocation of every buffer on a GPU.
        held = getattr(self.accelerator, "_optimizers", None)
        if isinstance(held, list) and any(o is self.optimizer for o in held):
            held[:] = [o for o in held if o is not self.optimizer]
        else:
            self.accelerator.free_memory()


class AccelerateBackend:
    """``Accelerator`` state is one per process: built on first use, rebuilt (state reset) only if a
    later call asks for another mixed precision."""

    _accelerator: Any = None
    _precision: str | None = None

    @classmethod
    def accelerator(cls, mixed_precision: str) -> Any:
        if cls._accelerator is None or cls._precision != mixed_precision:
            from accelerate import Accelerator
            from accelerate.state import AcceleratorState, GradientState

            if cls._accelerator is not None:
                AcceleratorState._reset_state(reset_partial_state=True)
                GradientState._reset_state()
            cls._accelerator = Accelerator(
                mixed_precision=mixed_precision, gradient_accumulation_steps=1
            )
            cls._precision = mixed_precision
        return cls._accelerator

    def prepare(
        self,
        module: torch.nn.Module,
        params: Sequence[torch.nn.Parameter],
        cfg: LocalTrainingConfig,
        total_steps: int,
    ) -> AccelerateStepper:
        accelerator = self.accelerator(cfg.mixed_precision)
        return AccelerateStepper(accelerator, module, params, cfg, total_steps)


# --------------------------------------------------------------------------- deepspeed
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_DS_READY = False

#: This process's DeepSpeed engines so far: how many local calls built one, and the wall seconds
#: spent building and taking them apart (``initialize``, reading the trained values back,
#: ``destroy`` and the module's restore), the per-call price of a fresh engine per call.
ENGINE_OVERHEAD = {"calls": 0, "seconds": 0.0}


#: This process's ``TORCH_EXTENSIONS_DIR`` as (pid, path), once ``_extensions_dir`` made it
_DS_EXTENSIONS: tuple[int, str] | None = None


def _extensions_dir() -> str:
    """This process's DeepSpeed build folder: its own (a build killed midway leaves a lock that
    hangs every later one), unique and 0700 in the temp folder (``mkdtemp``: no other user can
    plant or read a build there), made on first use and removed as the process exits."""
    global _DS_EXTENSIONS
    pid = os.getpid()
    if _DS_EXTENSIONS is None or _DS_EXTENSIONS[0] != pid:  # a forked child makes its own
        path = tempfile.mkdtemp(prefix="raysim-ds-")
        atexit.register(_remove_extensions, pid, path)
        _DS_EXTENSIONS = (pid, path)
    return _DS_EXTENSIONS[1]


def _remove_extensions(pid: int, path: str) -> None:
    """At exit: the build folder of process ``pid``, if this is that process (not a fork)."""
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _deepspeed_env(**extra: str) -> Iterator[None]:
    """Single-rank variables (and a per-process ``TORCH_EXTENSIONS_DIR``, ``_extensions_dir``)
    only while DeepSpeed runs: a lingering ``LOCAL_RANK`` makes a later ``Accelerator`` on a GPU
    assume a multi-GPU launch, and child processes (a Ray driver's workers) would inherit the
    port. Variables already set are left alone."""
    wanted = {"LOCAL_RANK": "0", **extra}
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        wanted["TORCH_EXTENSIONS_DIR"] = _extensions_dir()
    added = [k for k in wanted if k not in os.environ]
    os.environ.update({k: wanted[k] for k in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def deepspeed_setup() -> None:
    """Once per process: a single-rank process group (gloo on the CPU, a free port), no C++ op
    builds on the CPU, quiet logs. Anything DeepSpeed JIT-compiles goes to a per-process
    ``TORCH_EXTENSIONS_DIR``: a build killed midway leaves a lock that hangs every later one.
    """
    global _DS_READY
    if _DS_READY:
        return
    import importlib

    import deepspeed
    from deepspeed.accelerator import get_accelerator

    deepspeed.utils.logger.setLevel(logging.WARNING)
    if get_accelerator().device_name() == "cpu":
        # The shared-memory all-reduce op only helps several CPU ranks; building it costs minutes.
        # (``import deepspeed.comm.torch as m`` would bind the torch package: comm re-exports it.)
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    rank = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    with _deepspeed_env(**rank, MASTER_PORT=str(_free_port())):
        deepspeed.init_distributed()
    _DS_READY = True


@contextlib.contextmanager
def _lean_initialize() -> Iterator[None]:
    """Two costs of ``deepspeed.initialize`` that a fresh engine per local call pays every time,
    and that do nothing for a single rank, switched off while it runs:

    - ZeRO-3's ``defragment`` runs a full ``gc.collect()`` (the whole heap of a process that holds
      torch, transformers and Ray: 0.5 s a call on a 2-vCPU machine, 80 % of the call);
    - ZeRO-3's constructor formats ``locals()`` into a debug string it does not print, so every
      trainable tensor is rendered as text (0.05 s a call on a tiny LLaMA; on a GPU each
      rendering also waits for the device).

    Memory is still freed: the tensors ``defragment`` replaces hold no reference cycles, so
    reference counting frees them at once. Both are put back on the way out."""
    import gc

    collect, param_repr = gc.collect, torch.nn.Parameter.__repr__
    gc.collect = lambda generation=2: 0
    torch.nn.Parameter.__repr__ = lambda self: f"Parameter(shape={tuple(self.shape)})"
    try:
        yield
    finally:
        gc.collect, torch.nn.Parameter.__repr__ = collect, param_repr


PEFT_FRACTION = 0.1  # trainable share of the module below which ZeRO-3 keeps them persistent


def deepspeed_config(
    cfg: LocalTrainingConfig, module: torch.nn.Module, trainable: Sequence[torch.nn.Parameter]
) -> dict[str, Any]:
    """The DeepSpeed config for one local call (torch optimizer, no DeepSpeed scheduler)."""
    ds = cfg.deepspeed
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if ds.zero_stage == 3:
        if ds.offload_params:
            zero["offload_param"] = {"device": "cpu"}
        # Parameter-efficient training: the (small) trainable tensors stay whole (persistent), so
        # penalties see them outside the forward pass; the base is partitioned.
        n_trainable = sum(p.numel() for p in trainable)
        if n_trainable <= PEFT_FRACTION * sum(p.numel() for p in module.parameters()):
            largest = max((p.numel() for p in trainable), default=0)
            zero["stage3_param_persistence_threshold"] = largest
        zero["memory_efficient_linear"] = False  # else F.linear is replaced process-wide
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.batch_size // cfg.grad_accumulation,
        "gradient_accumulation_steps": cfg.grad_accumulation,
        "gradient_clipping": cfg.max_grad_norm or 0.0,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if cfg.mixed_precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif cfg.mixed_precision == "fp16":
        config["fp16"] = {"enabled": True}
    return config


class _ModuleSnapshot:
    """What DeepSpeed changes on a module, recorded (references, no copies) to put back exactly.

    DeepSpeed adds hooks to every submodule, attributes to modules and parameters (ZeRO-3 also
    methods such as ``all_gather`` and ``item``), swaps ``module._parameters`` for a fetching dict
    (ZeRO-3), reassigns ``param.data`` (flat ZeRO buffers, partitions, a bf16 cast) and buffers, and
    may replace ``F.linear``. :meth:`restore` undoes all of that.
    """

    HOOK_TABLES = (
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_backward_hooks",
        "_backward_pre_hooks",
    )

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.params = list(module.parameters())
        self.data = [p.data for p in self.params]
        self.requires_grad = [p.requires_grad for p in self.params]
        self.param_attrs = [set(vars(p)) for p in self.params]
        self.modules = list(module.modules())
        self.module_attrs = [dict(vars(m)) for m in self.modules]
        self.tables = [
            {t: dict(getattr(m, t)) for t in ("_parameters", "_buffers")} for m in self.modules
        ]
        self.hooks = [{t: set(getattr(m, t, {})) for t in self.HOOK_TABLES} for m in self.modules]
        self.linear = torch.nn.functional.linear
        self.training = module.training

    def restore(self, trained: dict[int, torch.Tensor]) -> None:
        """Put everything back; ``trained`` maps ``id(param)`` to its trained (fp32) value."""
        torch.nn.functional.linear = self.linear
        for m, attrs, tables, hooks in zip(
            self.modules, self.module_attrs, self.tables, self.hooks, strict=True
        ):
            for table, keys in hooks.items():
                for key in set(getattr(m, table, {})) - keys:
                    getattr(m, table).pop(key, None)
            for key in set(vars(m)) - set(attrs):
                delattr(m, key)
            for table, content in tables.items():
                original = attrs[table]
                original.clear()
                original.update(content)
                m.__dict__[table] = original
        with torch.no_grad():
            for p, data, attrs, grad in zip(
                self.params, self.data, self.param_attrs, self.requires_grad, strict=True
            ):
                for key in set(vars(p)) - attrs:
                    delattr(p, key)
                value = trained.get(id(p))
                p.data = data
                if value is not None:
                    data.copy_(value.reshape(data.shape).to(data.dtype))
                p.grad = None
                p.requires_grad_(grad)
        self.module.train(self.training)


class DeepSpeedStepper:
    """One ``deepspeed.initialize`` over ``module`` and a torch optimizer on ``params``.

    The loop scales micro-batch losses itself (``scale_wrt_gas=False``) and marks the last
    micro-batch of each step with ``set_gradient_accumulation_boundary``, so a short last step is
    exact. The LR schedule steps the wrapped torch optimizer's groups, which ZeRO's step reads.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        params: Sequence[torch.nn.Parameter],
        cfg: LocalTrainingConfig,
        total_steps: int,
    ) -> None:
        import deepspeed

        deepspeed_setup()
        t0 = time.perf_counter()
        self.params = list(params)
        self.snapshot = _ModuleSnapshot(module)
        optimizer = make_optimizer(self.params, cfg)
        self.scheduler = make_scheduler(optimizer, cfg, total_steps)
        self.torch_optimizer = optimizer
        try:
            with _deepspeed_env(), _lean_initialize():
                self.engine, *_ = deepspeed.initialize(
                    model=module,
                    optimizer=optimizer,
                    config=deepspeed_config(cfg, module, self.params),
                )
        except BaseException:
            self.snapshot.restore({})
            raise
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mixed_precision)
        ENGINE_OVERHEAD["calls"] += 1
        ENGINE_OVERHEAD["seconds"] += time.perf_counter() - t0

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        # What ``engine.forward`` does around ``module(...)``; the loop calls the module itself
        # (tasks and objectives hold the module). Without it ZeRO-3 never advances its micro-step
        # counter and overwrites, instead of accumulating, the earlier micro-batches' gradients.
        from deepspeed.runtime.base_optimizer import ZeROOptimizer
        from deepspeed.runtime.torch_autocast import autocast_if_enabled

        with _deepspeed_env():
            if isinstance(self.engine.optimizer, ZeROOptimizer):
                self.engine.optimizer.clear_backward_seen_flag()
            with autocast_if_enabled(self.engine):
                yield

    def cast(self, batch: Any) -> Any:
        return cast_floats(batch, self.dtype)

    def penalty(self, fn: PenaltyFn, params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
        # ZeRO-3: trainable tensors are persistent, but the first (trace-recording) forward still
        # releases them; gather them back so that the term and its backward see whole tensors.
        gather = [p for p in params if getattr(p, "ds_status", None) is not None]
        if gather:
            with _deepspeed_env():
                gather[0].all_gather(param_list=gather)
        return fn(params)

    def backward(self, loss: torch.Tensor, sync: bool = True) -> None:
        with _deepspeed_env():
            self.engine.set_gradient_accumulation_boundary(sync)
            self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> None:
        with _deepspeed_env():
            self.engine.set_gradient_accumulation_boundary(True)
            self.engine.step()
        if self.scheduler is not None:
            self.scheduler.step()

    @property
    def lr(self) -> float:
        return float(self.torch_optimizer.param_groups[0]["lr"])

    def trained_values(self) -> dict[int, torch.Tensor]:
        """Full fp32 values of ``params`` (ZeRO's master copy where there is one)."""
        from deepspeed.utils import safe_get_full_fp32_param

        out = {}
        for p in self.params:
            value = safe_get_full_fp32_param(p)
            if value is None:  # no ZeRO/bf16 master copy (stage 0 in fp32): the tensor itself
                value = p.data
            out[id(p)] = value.detach().clone()
        return out

    def finish(self) -> None:
        t0 = time.perf_counter()
        trained: dict[int, torch.Tensor] = {}
        try:
            with _deepspeed_env():
                trained = self.trained_values()
        finally:
            try:
                with _deepspeed_env():
                    self.engine.destroy()
            finally:
                # ``engine.__del__`` destroys again whenever GC gets to it (cycles: maybe during a
                # later job), and ZeRO-1/2's destroy then unlinks the *current* engine's fp32
                # mapping on the shared parameters. Disarm it and drop the heavy references.
                self.engine.destroy = lambda: None
                self.engine.optimizer = None
                self.engine = None
                self.snapshot.restore(trained)
                ENGINE_OVERHEAD["seconds"] += time.perf_counter() - t0


class DeepSpeedBackend:
    """A fresh DeepSpeed engine per local call, on the same resident module every time.

    Per call (:class:`DeepSpeedStepper`): ``deepspeed.initialize(model=module, optimizer=<torch
    optimizer over params>)``, never a DeepSpeed optimizer block (those JIT-compile C++ ops), with
    ``zero_force_ds_cpu_optimizer: false`` so CPU offload runs the torch optimizer.

    Restoring the module (:class:`_ModuleSnapshot`): before ``initialize`` the tensors of every
    parameter and buffer, the hook tables and attribute names of every submodule and parameter
    and ``F.linear`` are recorded (references, no copies). After training the full fp32 master
    values of ``params`` are read with ``safe_get_full_fp32_param`` (ZeRO 1-3, offload, bf16), the
    engine is destroyed and disarmed, DeepSpeed's hooks and attributes are removed, ZeRO-3's
    fetching ``_parameters`` dicts are swapped back, and every parameter and buffer gets its
    original tensor back, the trainable ones holding the trained values in their own dtype. So the
    frozen base is bit-identical (also after the bf16 cast), Parameter objects keep their identity
    (``LoraHandle`` holds them) and the next call converts an ordinary module again.

    ZeRO-3: the base is partitioned during the call (the recorded originals stay referenced, so
    the base is held twice during a ZeRO-3 or bf16-cast call: memory traded for an exact base and
    no per-call gather). With parameter-efficient training (trainable ≤ 10 % of the module) the
    trainable tensors are made persistent (``stage3_param_persistence_threshold`` = their largest
    size), and they are re-gathered before a penalty uses them, so penalties work outside the
    forward pass; ``memory_efficient_linear`` is off (it swaps ``F.linear``
    process-wide). Per-call cost on the CPU after the first: ~10 ms (ZeRO-2), ~0.4 s (ZeRO-3,
    mostly a ``gc.collect`` inside DeepSpeed); the first call also creates the process group.
    """

    def prepare(
        self,
        module: torch.nn.Module,
        params: Sequence[torch.nn.Parameter],
        cfg: LocalTrainingConfig,
        total_steps: int,
    ) -> DeepSpeedStepper:
        return DeepSpeedStepper(module, params, cfg, total_steps)


_BACKENDS: dict[str, Callable[[], Backend]] = {
    "torch": TorchBackend,
    "accelerate": AccelerateBackend,
    "deepspeed": DeepSpeedBackend,
}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``torch``, ``accelerate`` or ``deepspeed``)."""
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown training backend {name!r}; choose one of {BACKENDS}") from None


def micro_batches(index: torch.Tensor, cfg: LocalTrainingConfig) -> Iterator[torch.Tensor]:
    """A step's example indices split into micro-batches of ``batch_size // grad_accumulation``."""
    if cfg.grad_accumulation == 1:
        yield index
        return
    yield from index.split(cfg.batch_size // cfg.grad_accumulation)
