"""Training backends (torch, Accelerate, DeepSpeed ZeRO 2/3) on the tiny LoRA LLaMA.

Tolerances: fp32 backends reproduce the torch loss trajectory within rtol 1e-4 and its adapter
within atol 1e-6 (measured: ZeRO-2 and Accelerate bit-identical, ZeRO-3 ~3e-8); bf16 DeepSpeed
stays within rtol 5e-2 of fp32's losses; gradient accumulation matches the full batch within 1e-6
(FedOA spec I22).
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch

from raysim.training.backends import _ModuleSnapshot, get_backend
from raysim.training.loop import LocalTrainingConfig, train_local
from raysim.training.tasks import CausalLMTask
from tests.test_fedoa import LENGTH, VOCAB, client, context, handle, lm_data

FP32_RTOL = 1e-4  # loss trajectory vs torch, fp32
FP32_ATOL = 1e-6  # trained adapter vs torch, fp32
BF16_RTOL = 5e-2  # bf16 DeepSpeed losses vs fp32 torch
ACCUM_TOL = 1e-6  # micro 2 × accumulation 2 vs batch 4 (I22)

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
BASE = dict(epochs=2, batch_size=4, lr=1e-2, optimizer="adamw")
BACKENDS = {
    "accelerate": {"backend": "accelerate"},
    "zero2": {"backend": "deepspeed", "deepspeed": {"zero_stage": 2}},
    "zero3": {"backend": "deepspeed", "deepspeed": {"zero_stage": 3}},
    "zero2_offload": {
        "backend": "deepspeed",
        "deepspeed": {"zero_stage": 2, "offload_optimizer": True},
    },
}
# "full": a short last step (10 examples, batch 4), accumulation, clipping, decay and a penalty.
RECIPES = {
    "plain": ({}, 8, False),
    "full": ({"grad_accumulation": 2, "max_grad_norm": 0.3, "lr_schedule": "linear"}, 10, True),
}


class RecordingTask(CausalLMTask):
    """The causal-LM task, recording every micro-batch loss (the loss trajectory)."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def loss(self, module, batch):
        out = super().loss(module, batch)
        self.losses.append(float(out.detach()))
        return out


def prox(params):
    return 0.05 * sum((p**2).sum() for p in params)


def prox_with_gc(module, partitioned):
    """The penalty, plus one GC pass mid-job (earlier engines get collected while one is live);
    appends how many of ``module``'s tensors ZeRO-3 holds partitioned (empty) at that point."""
    pending = [True]

    def penalty(params):
        if pending and pending.pop():
            gc.collect()
            partitioned.append(sum(p.data.numel() == 0 for p in module.parameters()))
        return prox(params)

    return penalty


def run(h, data, penalty=False, seed=3, **overrides):
    """One local call on ``h``'s global adapter; returns (losses, metrics, trained adapter).
    ``penalty``: False, True (``prox``) or a penalty function."""
    task = RecordingTask()
    cfg = LocalTrainingConfig(**{**BASE, **overrides})
    gen = torch.Generator().manual_seed(seed)
    fn = prox if penalty is True else (penalty or None)
    m = train_local(h.module, h.global_parameters(), task, data, cfg, gen, fn)
    return np.array(task.losses), m, h.get_global()


def module_state(h):
    """Hooks, DeepSpeed attributes, dtypes and tensor identity of the resident module."""
    mods = list(h.module.modules())
    hooks = sum(len(getattr(m, t)) for m in mods for t in _ModuleSnapshot.HOOK_TABLES)
    attrs = sorted({k for p in h.module.parameters() for k in vars(p)})
    attrs += sorted({k for m in mods for k in vars(m) if "ds_" in k or "_external" in k})
    dtypes = {p.dtype for p in h.module.parameters()}
    types = {type(m._parameters) for m in mods}
    return hooks, attrs, dtypes, types, h.base_pointers(), torch.nn.functional.linear


def test_defaults_are_the_plain_loop_bit_for_bit():
    """torch backend, no accumulation, no clipping, constant lr = the original loop exactly."""
    data, cfg = lm_data(8), LocalTrainingConfig(epochs=2, batch_size=3, lr=1e-2, optimizer="adam")
    a, b = handle(("global",)), handle(("global",))
    train_local(
        a.module, a.global_parameters(), CausalLMTask(), data, cfg, torch.Generator().manual_seed(1)
    )
    params, task, gen = b.global_parameters(), CausalLMTask(), torch.Generator().manual_seed(1)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    b.module.train()
    for _ in range(cfg.epochs):
        order = torch.randperm(8, generator=gen)
        for s in range(0, 8, cfg.batch_size):
            opt.zero_grad(set_to_none=True)
            task.loss(b.module, task.batch(data, order[s : s + cfg.batch_size])).backward()
            opt.step()
    np.testing.assert_array_equal(a.get_global(), b.get_global())
    assert not np.array_equal(a.get_global(), handle(("global",)).get_global())


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_fp32_backends_follow_torch(name, recipe):
    """Same start, data and order: every fp32 backend gives torch's loss trajectory (rtol 1e-4)
    and adapter (atol 1e-6), and leaves the base and the module untouched."""
    extra, n, penalty = RECIPES[recipe]
    data = lm_data(n)
    ref_losses, ref_m, ref = run(handle(("global",)), data, penalty, **extra)
    h = handle(("global",))
    start, digest, state = h.get_global(), h.base_digest(), module_state(h)
    losses, m, trained = run(h, data, penalty, **extra, **BACKENDS[name])
    assert m["local_steps"] == ref_m["local_steps"] == (6 if n == 10 else 4)
    assert (
        len(losses) == len(ref_losses) == (10 if recipe == "full" else 4)
    )  # 4+4+2 rows: 5 micro-batches
    np.testing.assert_allclose(losses, ref_losses, rtol=FP32_RTOL)
    np.testing.assert_allclose(trained, ref, rtol=0, atol=FP32_ATOL)
    assert np.abs(trained - start).max() > 1e-3  # it trained
    assert h.base_digest() == digest
    assert module_state(h) == state


def test_bf16_deepspeed_runs_close_to_fp32():
    """ZeRO-2 bf16: losses within rtol 5e-2 of fp32, yet not identical (bf16 was really used);
    the base and the parameter dtypes are restored (fp32, same digest)."""
    data = lm_data(8)
    ref_losses, _, ref = run(handle(("global",)), data)
    h = handle(("global",))
    digest, state = h.base_digest(), module_state(h)
    losses, _, trained = run(
        h, data, backend="deepspeed", mixed_precision="bf16", deepspeed={"zero_stage": 2}
    )
    np.testing.assert_allclose(losses, ref_losses, rtol=BF16_RTOL)
    assert not np.array_equal(losses, ref_losses)
    assert np.abs(trained - ref).max() < 0.05 and trained.dtype == np.float32
    assert h.base_digest() == digest
    assert module_state(h) == state


def equal_length_data(n=8, seed=0):
    """Unpadded rows with the same number of labelled tokens: token means compose exactly."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (n, LENGTH), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@pytest.mark.parametrize("name", ["torch", "accelerate", "zero2", "zero3"])
def test_accumulation_equals_full_batch(name):
    """I22: micro 2 × accumulation 2 = batch 4 (tolerance 1e-6) on equal-length unpadded rows."""
    extra = BACKENDS.get(name, {})
    full = run(handle(("global",)), equal_length_data(), optimizer="sgd", lr=0.5, **extra)
    accum = run(
        handle(("global",)),
        equal_length_data(),
        optimizer="sgd",
        lr=0.5,
        grad_accumulation=2,
        **extra,
    )
    assert len(accum[0]) == 2 * len(full[0])
    np.testing.assert_allclose(accum[1]["train_loss"], full[1]["train_loss"], atol=ACCUM_TOL)
    np.testing.assert_allclose(accum[2], full[2], rtol=0, atol=ACCUM_TOL)


def test_accumulation_differs_on_padded_rows():
    """The I22 check can fail: with unequal lengths a micro-batch token mean weights differently."""
    a = run(handle(("global",)), lm_data(8), optimizer="sgd", lr=0.5)[2]
    b = run(handle(("global",)), lm_data(8), optimizer="sgd", lr=0.5, grad_accumulation=2)[2]
    assert np.abs(a - b).max() > 10 * ACCUM_TOL


@pytest.mark.parametrize("name", ["torch", "accelerate", "zero2", "zero3"])
def test_linear_schedule_reaches_zero(name):
    """Linear decay without warmup: lr·(1 - t/T) at step t, 0 after the last of T steps."""
    h = handle(("global",))
    cfg = LocalTrainingConfig(**{**BASE, "lr_schedule": "linear", **BACKENDS.get(name, {})})
    params = h.global_parameters()
    stepper = get_backend(cfg.backend).prepare(h.module, params, cfg, total_steps=4)
    seen = []
    try:
        for _ in range(4):
            seen.append(stepper.lr)
            with stepper.forward_context():
                loss = CausalLMTask().loss(
                    h.module, CausalLMTask().batch(lm_data(4), torch.arange(4))
                )
            stepper.backward(loss)
            stepper.step()
        seen.append(stepper.lr)
    finally:
        stepper.finish()
    np.testing.assert_allclose(seen, [1e-2, 7.5e-3, 5e-3, 2.5e-3, 0.0], rtol=1e-12, atol=0)


def test_linear_schedule_steps_per_optimizer_step():
    """End to end with SGD: train_local(linear, accumulation 2) = a hand loop with lr·(1 - t/T)."""
    data, lr = equal_length_data(), 0.5
    got = run(
        handle(("global",)), data, optimizer="sgd", lr=lr, lr_schedule="linear", grad_accumulation=2
    )[2]
    h = handle(("global",))
    params, task, gen = h.global_parameters(), CausalLMTask(), torch.Generator().manual_seed(3)
    h.module.train()
    t, total = 0, 2 * 2
    for _ in range(2):
        for idx in torch.randperm(8, generator=gen).split(4):
            loss = task.loss(h.module, task.batch(data, idx))
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    p -= lr * (1 - t / total) * g
            t += 1
    np.testing.assert_allclose(got, h.get_global(), rtol=0, atol=ACCUM_TOL)
    constant = run(handle(("global",)), data, optimizer="sgd", lr=lr, grad_accumulation=2)[2]
    assert np.abs(constant - got).max() > 1e-4


@pytest.mark.parametrize("stage", [2, 3])
def test_consecutive_deepspeed_jobs_on_one_module(stage):
    """Three clients in a row through one resident module: each job matches torch from the same
    start, leaves trained values in the adapter and the base, hooks, attributes and tensors as
    they were; a torch job afterwards is bit-identical to one in a clean module. (A GC pass inside
    each job once let a dead engine's ``__del__`` unlink the live one's fp32 master copy.)"""
    h, ref = handle(("global",)), handle(("global",))
    digest, state = h.base_digest(), module_state(h)
    env = {k: os.environ.get(k) for k in ENV_KEYS}
    rng, partitioned = np.random.default_rng(0), []
    ds = {"backend": "deepspeed", "deepspeed": {"zero_stage": stage}}
    for job in range(3):
        start = h.get_global() + 0.02 * rng.standard_normal(h.get_global().shape).astype("f4")
        h.set_global(start)
        ref.set_global(start)
        data = lm_data(8, seed=job)
        penalty = prox_with_gc(h.module, partitioned)
        losses, _, trained = run(h, data, penalty=penalty, seed=job, **ds)
        ref_losses, _, expected = run(ref, data, penalty=True, seed=job)
        np.testing.assert_allclose(losses, ref_losses, rtol=FP32_RTOL)
        np.testing.assert_allclose(trained, expected, rtol=0, atol=FP32_ATOL)
        assert np.abs(trained - start).max() > 1e-3
        assert h.base_digest() == digest
        assert module_state(h) == state
    assert {k: os.environ.get(k) for k in ENV_KEYS} == env  # single-rank env only while in use
    if stage == 3:  # the base (embeddings, q, k, v, o, MLP, head: 9 large tensors) is partitioned
        assert min(partitioned) >= 9, partitioned
    else:
        assert partitioned == [0, 0, 0]
    clean = handle(("global",))
    clean.set_global(h.get_global())
    np.testing.assert_array_equal(run(h, lm_data(8))[2], run(clean, lm_data(8))[2])


def test_fedoa_personal_and_global_on_zero3():
    """FedOA's two adapters (teacher forward with adapter switching) under ZeRO-3 match torch;
    get_state()/get_global() read the trained values."""
    results = []
    for extra in ({}, BACKENDS["zero3"]):
        h = handle()
        h.set_state(None, seed=3)
        start_state = h.get_state()
        cfg = LocalTrainingConfig(**{**BASE, "epochs": 1, **extra})
        client("fedoa", **{"lambda": 0.5}).train(context(h, cfg=cfg))
        results.append((h.get_global(), h.get_state()))
        moved = max(np.abs(v - start_state[k]).max() for k, v in h.get_state().items())
        assert moved > 1e-3
    (g0, s0), (g1, s1) = results
    np.testing.assert_allclose(g1, g0, rtol=0, atol=FP32_ATOL)
    for k in s0:
        np.testing.assert_allclose(s1[k], s0[k], rtol=0, atol=FP32_ATOL)


def test_accelerate_precision_switch_resets_state():
    """One Accelerator per process: asking for bf16 and then fp32 again rebuilds it, and fp32
    is torch-exact afterwards."""
    data = lm_data(8)
    ref = run(handle(("global",)), data)
    bf16 = run(handle(("global",)), data, backend="accelerate", mixed_precision="bf16")
    fp32 = run(handle(("global",)), data, backend="accelerate")
    assert not np.array_equal(bf16[0], ref[0])
    np.testing.assert_allclose(bf16[0], ref[0], rtol=BF16_RTOL)
    np.testing.assert_array_equal(fp32[2], ref[2])


@pytest.mark.parametrize("name", ["accelerate", "zero3"])
def test_a_local_call_runs_no_full_garbage_collection(name, monkeypatch):
    """Per-call costs that grow with the worker's heap, not with its clients: Accelerate's
    ``free_memory`` and ZeRO-3's ``defragment`` each ran a full ``gc.collect()`` on every local
    call (0.28 s and 0.5 s on a tiny LLaMA in a worker). Neither runs now; the accelerator still
    lets go of the call's optimizer, and ``Parameter.__repr__`` is DeepSpeed's to use again."""
    from raysim.training.backends import AccelerateBackend

    run(handle(("global",)), lm_data(8), **BACKENDS[name])  # the first call sets the process up
    calls, real = [], gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or real(*a))
    plain_repr = torch.nn.Parameter.__repr__
    ref = run(handle(("global",)), lm_data(8))
    assert calls == []  # (the torch backend's call collects nothing either)
    out = run(handle(("global",)), lm_data(8), **BACKENDS[name])
    assert calls == []
    np.testing.assert_allclose(out[2], ref[2], rtol=0, atol=FP32_ATOL)
    assert torch.nn.Parameter.__repr__ is plain_repr
    if name == "accelerate":
        assert AccelerateBackend._accelerator._optimizers == []


def test_failed_deepspeed_job_still_restores_the_module(monkeypatch):
    """An error inside a job (here in the penalty) propagates and the module is restored."""
    h = handle(("global",))
    digest, state, start = h.base_digest(), module_state(h), h.get_global()

    def broken(params):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        train_local(
            h.module,
            h.global_parameters(),
            CausalLMTask(),
            lm_data(8),
            LocalTrainingConfig(**BASE, **BACKENDS["zero3"]),
            torch.Generator(),
            broken,
        )
    assert module_state(h) == state and h.base_digest() == digest
    np.testing.assert_array_equal(h.get_global(), start)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        LocalTrainingConfig(batch_size=6, grad_accumulation=4)
    with pytest.raises(ValueError, match="zero_stage 3"):
        LocalTrainingConfig(deepspeed={"zero_stage": 2, "offload_params": True})
    with pytest.raises(ValueError, match="did you mean"):
        LocalTrainingConfig(deepspeed={"zero_stag": 3})
    with pytest.raises(ValueError, match="unknown training backend"):
        get_backend("jax")
    cfg = LocalTrainingConfig(batch_size=32, grad_accumulation=4)
    assert cfg.micro_batch_size == 8 and LocalTrainingConfig().backend == "torch"
