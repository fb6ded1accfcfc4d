"""FedOA and its LoRA machinery on a tiny config-built LLaMA (FedOA spec §6.3 invariants)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.algorithms import get_method
from raysim.algorithms.base import ClientContext
from raysim.algorithms.fedoa.feature_distance import feature_distance, pool_features
from raysim.models import DataSpec, ModelConfig
from raysim.models.layout import ParamGroup
from raysim.sim.build import build_resident
from raysim.training.loop import LocalTrainingConfig, train_local
from raysim.training.tasks import CausalLMTask

VOCAB, LENGTH = 40, 12
SPEC = DataSpec("causal_lm", (LENGTH,), VOCAB, VOCAB)
MODEL = ModelConfig(
    name="llama",
    llama={
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    },
    lora={"r": 4, "dropout": 0.0},
)
LOCAL = LocalTrainingConfig(epochs=1, batch_size=4, lr=1e-2, optimizer="adam")


def lm_data(n=8, seed=0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (n, LENGTH), generator=g)
    lengths = torch.randint(6, LENGTH + 1, (n,), generator=g)
    mask = (torch.arange(LENGTH)[None] < lengths[:, None]).long()
    ids = ids * mask
    labels = ids.clone()
    labels[:, :3] = -100  # a 3-token "prompt"
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def groups_of(adapters):
    """One LoRA adapter per name: the first shared, the rest personal."""
    return [ParamGroup(a, "shared" if i == 0 else "personal") for i, a in enumerate(adapters)]


def handle(adapters=("global", "personal"), model=MODEL):
    return build_resident(model, SPEC, seed=0, groups=groups_of(adapters))


def context(h, data=None, seed=11, rnd=0, first=True, cfg=LOCAL) -> ClientContext:
    torch.default_generator.manual_seed(seed)
    return ClientContext(
        h,
        CausalLMTask(),
        data if data is not None else lm_data(),
        cfg,
        torch.Generator().manual_seed(seed),
        0,
        rnd,
        first,
        seed,
    )


def client(name="fedoa", **params):
    return get_method(name).build_client(params)


def train_personal_reference(ref, ctx: ClientContext) -> None:
    """CE-only training of ``ref``'s personal adapter on the personal phase's stream of ``ctx``."""
    ref.use("personal")
    train_local(
        ref.module,
        ref.adapter_parameters("personal"),
        CausalLMTask(),
        ctx.data,
        LOCAL,
        ctx.phase("personal"),
    )


def nonzero_global(h, scale=0.05):
    """Move the global adapter off its B = 0 init so that personal and global features differ."""
    g = h.get_global()
    h.set_global(g + scale * np.random.default_rng(0).standard_normal(g.shape).astype(np.float32))


def test_base_exists_once_and_is_identical_across_builds():
    a, b = handle(), handle()
    assert a.base_digest() == b.base_digest()  # same init stream in every process
    assert a.get_global().size == 2 * 1 * (32 * 4 + 4 * 32)  # q and v: A (r×d) + B (d×r)
    assert len(set(a.base_pointers())) == len(a.base_pointers())


def test_lambda_zero_is_plain_local_training():
    """I1: FedOA(λ=0)'s personal trajectory = CE-only training of φ_e (same init and order)."""
    h = handle()
    nonzero_global(h)
    h.set_state(None, seed=5)
    start = h.get_state()
    client("fedoa", **{"lambda": 0.0}).train(ctx := context(h))
    ref = handle()
    ref.set_state(start, seed=0)
    train_personal_reference(ref, ctx)
    for k, v in h.get_state().items():
        np.testing.assert_array_equal(v, ref.get_state()[k])


def test_global_path_is_fedit_exactly():
    """I2: for any λ, FedOA's uploaded global copy equals FedIT's, bit for bit."""
    fedoa, fedit = handle(), handle(("global",))
    nonzero_global(fedoa)
    fedit.set_global(fedoa.get_global())
    fedoa.set_state(None, 3)
    client("fedoa", **{"lambda": 2.0}).train(context(fedoa))
    client("fedit").train(context(fedit))
    np.testing.assert_array_equal(fedoa.get_global(), fedit.get_global())


def test_teacher_untouched_by_personal_training():
    """I3: the personal phase leaves φ_g bit-identical and gives it no gradient."""
    h = handle()
    nonzero_global(h)
    h.set_state(None, 3)
    before = h.get_global()
    c = client("fedoa", **{"lambda": 1.0}, train_global=False)
    c.train(context(h))
    np.testing.assert_array_equal(h.get_global(), before)
    assert all(p.grad is None for p in h.adapter_parameters("global"))
    assert not np.array_equal(list(h.get_state().values())[1], np.zeros(1))


def test_phase_order_does_not_matter():
    """I4: teacher = round-start global, so (a)→(b) and (b)→(a) give identical results."""
    out = []
    for order in ("personal_first", "global_first"):
        h = handle()
        nonzero_global(h)
        h.set_state(None, 3)
        client("fedoa", **{"lambda": 1.0}, order=order).train(context(h))
        out.append((h.get_global(), h.get_state()))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    for k in out[0][1]:
        np.testing.assert_array_equal(out[0][1][k], out[1][1][k])


def test_lambda_changes_personal_not_global():
    res = {}
    for lam in (0.0, 5.0):
        h = handle()
        nonzero_global(h)
        h.set_state(None, 3)
        client("fedoa", **{"lambda": lam}).train(context(h))
        res[lam] = (h.get_global(), np.concatenate([v.ravel() for v in h.get_state().values()]))
    np.testing.assert_array_equal(res[0.0][0], res[5.0][0])
    assert not np.array_equal(res[0.0][1], res[5.0][1])


def rows(b=5, d=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, d, generator=g, dtype=torch.float64), torch.randn(
        b, d, generator=g, dtype=torch.float64
    )


@pytest.mark.parametrize("kind", ["l2", "l2_squared", "l2_mean", "mse", "cosine", "pearson", "l1"])
def test_distance_of_identical_features_is_zero(kind):
    e, _ = rows()
    assert float(feature_distance(e, e.clone(), kind)) == pytest.approx(0.0, abs=1e-6)


def test_distance_properties():
    """I6."""
    e, g = rows()
    l2 = feature_distance(e, g, "l2")
    assert float(l2) == pytest.approx(float(feature_distance(g, e, "l2")))
    assert float(feature_distance(3 * e, 3 * g, "l2")) == pytest.approx(3 * float(l2))
    assert float(l2) == pytest.approx(float(torch.sqrt(((e - g) ** 2).sum(1).sum())))
    cos = feature_distance(e, g, "cosine")
    assert float(feature_distance(2.5 * e, 0.3 * g, "cosine")) == pytest.approx(float(cos))
    assert 0 <= float(cos) <= 2
    pear = feature_distance(e, g, "pearson")
    assert float(feature_distance(2 * e + 7, 0.5 * g - 1, "pearson")) == pytest.approx(float(pear))
    ec, gc = e - e.mean(1, keepdim=True), g - g.mean(1, keepdim=True)
    assert float(feature_distance(ec, gc, "pearson")) == pytest.approx(
        float(feature_distance(ec, gc, "cosine"))
    )


@pytest.mark.parametrize("kind", ["l2", "l2_mean", "cosine", "pearson"])
def test_gradient_is_finite_at_zero_distance(kind):
    """I7."""
    e = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    feature_distance(e, e.detach().clone(), kind).backward()
    assert torch.isfinite(e.grad).all()
    if kind.startswith("l2"):
        assert torch.count_nonzero(e.grad) == 0


def test_zero_distance_at_init():
    """I8: both adapters with B = 0 ⇒ base features, D = 0 (dropout off)."""
    h = handle()
    h.set_state(None, 9)
    data, m = lm_data(), h.module
    m.eval()
    feats = []
    for a in ("global", "personal"):
        h.use(a)
        with torch.no_grad():
            out = m(**data, output_hidden_states=True)
        feats.append(pool_features(out.hidden_states[-1], data["attention_mask"]))
    assert float(feature_distance(*feats)) == pytest.approx(0.0, abs=1e-5)


def test_last_and_mean_pooling_ignore_padding():
    """I10: left vs right padding and extra pads do not change pooled features; the last hidden
    state fed to lm_head reproduces the logits."""
    h, m = handle(), handle().module
    m.eval()
    ids = torch.randint(4, VOCAB, (1, 6))
    right = {
        "input_ids": torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1),
        "attention_mask": torch.tensor([[1] * 6 + [0] * 3]),
    }
    left = {
        "input_ids": torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1),
        "attention_mask": torch.tensor([[0] * 3 + [1] * 6]),
    }
    plain = {"input_ids": ids, "attention_mask": torch.ones(1, 6, dtype=torch.long)}
    with torch.no_grad():
        outs = {
            k: m(**v, output_hidden_states=True)
            for k, v in {"right": right, "left": left, "plain": plain}.items()
        }
    for how in ("last", "mean"):
        base = pool_features(outs["plain"].hidden_states[-1], plain["attention_mask"], how=how)
        got = pool_features(outs["right"].hidden_states[-1], right["attention_mask"], how=how)
        torch.testing.assert_close(got, base, rtol=1e-4, atol=1e-5)
    last = pool_features(outs["left"].hidden_states[-1], left["attention_mask"], how="last")
    torch.testing.assert_close(
        last,
        pool_features(outs["plain"].hidden_states[-1], plain["attention_mask"]),
        rtol=1e-3,
        atol=1e-4,
    )
    head = h.module.get_output_embeddings()
    torch.testing.assert_close(head(outs["plain"].hidden_states[-1]), outs["plain"].logits)


def test_gradient_is_linear_in_lambda():
    """I9: ∇L(λ) = ∇CE + λ∇D."""
    grads = {}
    for lam in (0.0, 1.0, 3.0):
        h = handle()
        nonzero_global(h)
        h.set_state(None, 3)
        c = client("fedoa", **{"lambda": lam})
        ctx = context(h)
        h.use("personal")
        loss = c.personal_objective(ctx)(ctx.task.batch(ctx.data, torch.arange(8)))
        loss.backward()
        grads[lam] = torch.cat([p.grad.reshape(-1) for p in h.adapter_parameters("personal")])
    d = grads[1.0] - grads[0.0]
    torch.testing.assert_close(grads[3.0], grads[0.0] + 3 * d, rtol=1e-4, atol=1e-6)


def test_single_full_gradient_step_mode():
    """I19: Algorithm 1 literally: φ_g − η ∇R_e(φ_g) with the full-batch gradient."""
    cfg = LocalTrainingConfig(epochs=1, batch_size=8, lr=0.1, optimizer="sgd")
    h, ref = handle(), handle()
    nonzero_global(h)
    nonzero_global(ref)
    h.set_state(None, 3)
    data = lm_data()
    client("fedoa", global_update_mode="single_full_grad_step").train(context(h, data, cfg=cfg))
    ref.use("global")
    params = ref.adapter_parameters("global")
    ref.module(**data).loss.backward()
    expect = np.concatenate([(p - 0.1 * p.grad).detach().numpy().ravel() for p in params])
    np.testing.assert_allclose(h.get_global(), expect, rtol=1e-5, atol=1e-7)


def test_personal_state_round_trip_and_fresh_init():
    h = handle()
    h.set_state(None, 4)
    a = h.get_state()
    h.set_state(None, 5)
    assert any(not np.array_equal(a[k], v) for k, v in h.get_state().items())
    h.set_state(a, 0)
    for k, v in h.get_state().items():
        np.testing.assert_array_equal(v, a[k])
    assert all("personal" in k for k in a)


def test_fedit_aggregation_is_tensorwise_fedavg():
    """I5: Σ α̃_e φ_e over the flat adapter vector (A and B separately); equal n ⇒ plain mean;
    identical inputs return themselves; client order changes nothing beyond 1e-7."""
    from raysim.algorithms.base import Update

    rng = np.random.default_rng(0)
    base = np.zeros(12, dtype=np.float32)
    locals_ = [rng.standard_normal(12).astype(np.float32) for _ in range(4)]

    def aggregate(vectors, sizes):
        s = get_method("fedit").build_strategy({}, base, 4)
        for j, (v, n) in enumerate(zip(vectors, sizes, strict=True)):
            s.on_arrival(Update(j, v - base, n, 0, 0, 0.0, 0, 0, base))
        s.on_round_end(0)
        return s.weights

    np.testing.assert_allclose(aggregate(locals_, [5] * 4), np.mean(locals_, axis=0), atol=1e-7)
    np.testing.assert_allclose(aggregate([locals_[0]] * 4, [1, 2, 3, 4]), locals_[0], atol=1e-7)
    w = aggregate(locals_, [1, 2, 3, 4])
    np.testing.assert_allclose(w, np.average(locals_, axis=0, weights=[1, 2, 3, 4]), atol=1e-6)
    np.testing.assert_allclose(aggregate(locals_[::-1], [4, 3, 2, 1]), w, atol=1e-7)
    a = [v[:6].reshape(2, 3) for v in locals_]  # as LoRA A (r×d) and B (d×r) factors
    b = [v[6:].reshape(3, 2) for v in locals_]
    mean_ab = np.mean([bb @ aa for aa, bb in zip(a, b, strict=True)], axis=0)
    assert not np.allclose(np.mean(b, axis=0) @ np.mean(a, axis=0), mean_ab)
