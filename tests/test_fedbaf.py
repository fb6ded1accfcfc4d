"""FedBaF's mixer (FedBaF spec §2) against its §7.2 invariants 1–8 and 11, in process (no Ray)."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from raysim.actors.local import local_core
from raysim.algorithms.context import ServerContext
from raysim.algorithms.fedbaf.matching import match_layers
from raysim.algorithms.fedbaf.mixer import FedBaF, FedBaFParams, mix_float64, r_float64
from raysim.algorithms.private import PrivateStateError
from raysim.config import load_config
from raysim.models import DataSpec, build_handle
from raysim.models.layout import SHARED, Layout
from tests.conftest import EXAMPLES, tiny


def mixer_on(tmp_path, pre: np.ndarray, **params) -> FedBaF:
    """A FedBaF mixer on a bare vector of ``len(pre)`` values whose foundation is ``pre``."""
    save_file({"weights": np.asarray(pre, dtype=np.float32)}, str(tmp_path / "pre.safetensors"))
    m = FedBaF(FedBaFParams(foundation=str(tmp_path / "pre.safetensors"), **params))
    m.setup(ServerContext.minimal(seed=0, size=len(pre), num_clients=4))
    return m


#: r_t is computed in float32 on the server's device (mixer.py): its relative rounding
FP32 = 1e-6


def test_the_float32_device_mix_stays_within_tolerance_of_the_float64_reference(tmp_path):
    """§8.2 asks for fp32 on the server's device: the mixed weights within 1e-6 of the weights'
    scale of the float64 form, and r_t (accumulated in float64 on the device) within 1e-9
    relative of it, late rounds included (w' close to w_t, where the difference of unit vectors
    cancels most: in float32 it was off by 1.5e-4 at r_t = 1e-5, issue 45 (10))."""
    rng = np.random.default_rng(3)
    n = 200_000
    pre = rng.normal(size=n)
    m = mixer_on(tmp_path, pre)
    prev = rng.normal(size=n).astype(np.float32)
    scope = np.arange(n)
    for step in (1.0, 1e-1, 1e-2, 1e-3, 1e-5):
        agg = (prev + step * rng.normal(size=n)).astype(np.float32)
        out = m.mix(4, prev, agg)
        r = r_float64(prev, agg, scope)
        assert m.last["fedbaf_r"] == pytest.approx(r, rel=1e-9), step
        want = mix_float64(agg, pre, scope, m.last["fedbaf_c"])
        scale = max(np.abs(agg).max(), np.abs(pre).max())  # where w' ≈ −c·w_pre, absolute
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6 * scale)
        assert not np.array_equal(out, agg)


def test_r_is_the_same_a_piece_at_a_time_and_zero_vectors_normalise_to_zero(monkeypatch):
    """``unit_distance`` in pieces (as for a model of more than 4M values) against r_float64."""
    from raysim.algorithms.fedbaf import mixer

    rng = np.random.default_rng(5)
    a, b = rng.normal(size=1001).astype(np.float32), rng.normal(size=1001).astype(np.float32)
    whole = mixer.unit_distance(torch.from_numpy(a), torch.from_numpy(b))
    monkeypatch.setattr(mixer, "PIECE", 64)
    pieces = mixer.unit_distance(torch.from_numpy(a), torch.from_numpy(b))
    assert pieces == pytest.approx(whole, rel=1e-12)
    assert whole == pytest.approx(r_float64(b, a, np.arange(1001)), rel=1e-12)
    zero = torch.zeros(1001)
    assert mixer.unit_distance(torch.from_numpy(a), zero) == pytest.approx(1.0)
    assert mixer.unit_distance(zero, zero) == 0.0


@pytest.mark.parametrize("psi", [1.0, 0.0])
def test_each_broadcast_s_closeness_to_the_foundation_is_logged(tmp_path, psi):
    """Issue 45 (8): the version a round publishes, against w_pre on the matched coordinates:
    its cosine and relative distance, as numpy computes them in float64, mixed or not."""
    rng = np.random.default_rng(7)
    pre = rng.normal(size=300)
    m = mixer_on(tmp_path, pre, psi=psi)
    prev = rng.normal(size=300).astype(np.float32)
    for t in range(3):
        agg = (prev + 0.3 * rng.normal(size=300)).astype(np.float32)
        sent = m.mix(t, prev, agg).astype(np.float64)
        p32 = pre.astype(np.float32).astype(np.float64)  # the server's float32 copy
        cosine = sent @ p32 / (np.linalg.norm(sent) * np.linalg.norm(p32))
        assert m.last["fedbaf_pre_cosine"] == pytest.approx(cosine, rel=1e-9)
        distance = np.linalg.norm(sent - p32) / np.linalg.norm(p32)
        assert m.last["fedbaf_pre_distance"] == pytest.approx(distance, rel=1e-9)
        prev = sent.astype(np.float32)
    if psi:
        assert m.last["fedbaf_pre_cosine"] > 0.5  # pulled towards w_pre
    else:
        assert abs(m.last["fedbaf_pre_cosine"]) < 0.3  # unrelated random vectors


@pytest.mark.parametrize("tau_scope", ["matched", "all"])
def test_slices_mix_bit_for_bit_as_the_index_gather_does(tmp_path, tau_scope, monkeypatch):
    """Matched tensors are read and written as contiguous runs of the global vector (slices);
    with the runs refused (``MAX_RUNS`` 0) the mixer gathers by index, and both give the same
    bits, r_t and c_t included. A ViT whose foundation lacks a tensor: three runs."""
    import raysim.algorithms.fedbaf.mixer as mixer

    torch.manual_seed(0)
    vit = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
           "intermediate_size": 32}  # fmt: skip
    cfg = load_config(tiny(model={"name": "vit", "vit": vit, "image": {"size": 8}}))
    handle = build_handle(cfg.model, DataSpec("dense", (3, 8, 8), 10))
    layout, flat = handle.layout(), handle.get_global()
    rng = np.random.default_rng(1)
    found = {k: v + rng.normal(0, 0.02, v.shape) for k, v in layout.unflatten(flat).items()}
    names = [n for n in found if ".layers.0." in n]
    found.pop(names[len(names) // 2])  # a hole among the matched tensors
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in found.items()},
              str(tmp_path / "f.safetensors"))  # fmt: skip
    built = []
    for max_runs in (mixer.MAX_RUNS, 0):
        monkeypatch.setattr(mixer, "MAX_RUNS", max_runs)
        m = FedBaF(FedBaFParams(foundation=str(tmp_path / "f.safetensors"), tau_scope=tau_scope))
        m.setup(ServerContext(0, layout, 4))
        built.append(m)
    assert built[0].runs is not None and len(built[0].runs) >= 2 and built[1].runs is None
    prev = flat.astype(np.float32)
    prev.flags.writeable = False  # a published version
    for t in range(3):
        agg = (prev + rng.normal(0, 1e-3, prev.shape)).astype(np.float32)
        sliced, gathered = (m.mix(t, prev, agg) for m in built)
        assert np.array_equal(sliced, gathered) and built[0].last == built[1].last
        assert not np.array_equal(sliced, agg)
        prev = sliced


# --------------------------------------------------------------------------- inv. 5, 6, 8
def test_tau_on_hand_made_vectors_and_the_schedule(tmp_path):
    m = mixer_on(tmp_path, np.zeros(2), psi=1.0)
    m.mix(0, np.array([1, 0], np.float32), np.array([0, 1], np.float32))
    first = dict(m.last)
    assert first["fedbaf_r"] == pytest.approx(math.sqrt(2), rel=FP32)
    assert first["fedbaf_tau"] == pytest.approx(math.sqrt(2), rel=FP32)  # t = 0
    assert 1.0 <= first["fedbaf_c"] / 1.0 <= 2.0  # c_0 ∈ [ψ, 2ψ]
    m.mix(3, np.array([1, 0], np.float32), np.array([1, 1], np.float32))
    last = m.last
    r3 = float(np.linalg.norm(np.array([1, 1]) / math.sqrt(2) - np.array([1, 0])))
    assert last["fedbaf_tau"] == pytest.approx(r3 / 2, rel=FP32)  # sqrt(t + 1) = 2
    want = 1.0 * last["fedbaf_u"] * (r3 / first["fedbaf_r"]) / 2
    assert last["fedbaf_c"] == pytest.approx(want, rel=FP32)
    assert 1 <= last["fedbaf_alpha"] * last["fedbaf_tau0"] / 1.0 <= 2
    for x in (first, last):
        assert 0 <= x["fedbaf_r"] <= 2


def test_scaling_either_model_leaves_the_schedule_alone(tmp_path):
    """Inv. 5 and 7: positive scalings of w_t and w' give the same r_t, τ_t and c_t."""
    rng = np.random.default_rng(0)
    pairs = [(rng.normal(size=8).astype(np.float32), rng.normal(size=8).astype(np.float32))]
    pairs += [(p * 1.5, a * 1.5) for p, a in pairs]
    runs = []
    for s in (1.0, 4.0):
        m = mixer_on(tmp_path, np.zeros(8))
        seq = []
        for t, (p, a) in enumerate(pairs):
            m.mix(t, p * np.float32(s), a * np.float32(s))
            seq.append([m.last[k] for k in ("fedbaf_r", "fedbaf_tau", "fedbaf_c")])
        runs.append(np.array(seq))
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-6)


def test_zero_vectors_give_no_nan_and_no_mixing(tmp_path):
    """Inv. 8: τ_0 = 0 and zero-norm models stay finite, with c_0 = 0."""
    m = mixer_on(tmp_path, np.ones(4))
    same = np.ones(4, np.float32)
    out = m.mix(0, same, same.copy())  # r_0 = 0: no τ_0 yet, and c_0 = 0
    assert m.last["fedbaf_c"] == 0.0 and np.array_equal(out, same)
    m2 = mixer_on(tmp_path, np.ones(4))
    out = m2.mix(0, np.zeros(4, np.float32), np.zeros(4, np.float32))
    assert all(math.isfinite(v) for v in m2.last.values()) and not out.any()
    # later rounds, τ_0 set: a zero model on either side stays finite, and both zero mix nothing
    m3 = mixer_on(tmp_path, np.ones(4))
    m3.mix(0, np.array([1, 2, 3, 4], np.float32), np.array([2, 1, 3, 4], np.float32))
    assert m3.tau0 > 0
    zero, some = np.zeros(4, np.float32), np.array([1, -1, 2, 0], np.float32)
    for t, (prev, agg) in enumerate([(zero, zero), (zero, some), (some, zero)], start=1):
        out = m3.mix(t, prev, agg)
        assert all(math.isfinite(v) for v in m3.last.values()) and np.isfinite(out).all()
        if not agg.any() and not prev.any():
            assert m3.last["fedbaf_c"] == 0.0 and not out.any()
        else:  # one unit vector against zero: r_t = 1
            assert m3.last["fedbaf_r"] == pytest.approx(1.0) and m3.last["fedbaf_c"] > 0


def test_the_schedule_ablations_of_section_3(tmp_path):
    """§3's ablations: ``tau_decay: false`` gives c_t = ψ·u_t·r_t/r_0 (no √(t+1));
    ``schedule: decay_only`` gives c_t = ψ·u_t/√(t+1) whatever the models (r_t still logged);
    the default is r_t/√(t+1) against r_0."""
    rng = np.random.default_rng(4)
    pre = rng.normal(size=64)
    steps = [(rng.normal(size=64).astype(np.float32), rng.normal(size=64).astype(np.float32))
             for _ in range(4)]  # fmt: skip
    seen = {}
    for name, params in {
        "default": {},
        "no_decay": {"tau_decay": False},
        "decay_only": {"schedule": "decay_only"},
    }.items():
        m = mixer_on(tmp_path, pre, **params)
        rows = []
        for t, (prev, agg) in enumerate(steps):
            m.mix(t, prev, agg)
            rows.append(dict(m.last))
        seen[name] = rows
    for name, rows in seen.items():
        r0 = rows[0]["fedbaf_r"]
        for t, row in enumerate(rows):
            want = {
                "default": row["fedbaf_r"] / np.sqrt(t + 1) / r0,
                "no_decay": row["fedbaf_r"] / r0,
                "decay_only": 1 / np.sqrt(t + 1),
            }[name] * row["fedbaf_u"]
            assert row["fedbaf_c"] == pytest.approx(want, rel=1e-12), (name, t)
            assert row["fedbaf_r"] == pytest.approx(seen["default"][t]["fedbaf_r"])
    assert seen["no_decay"][3]["fedbaf_c"] != pytest.approx(seen["default"][3]["fedbaf_c"])


# --------------------------------------------------------------------------- inv. 2, 3, 11
def test_the_mix_is_the_convex_combination_with_weight_c_over_1_plus_c(tmp_path):
    rng = np.random.default_rng(1)
    pre = rng.normal(size=50)
    m = mixer_on(tmp_path, pre)
    prev, agg = rng.normal(size=50).astype(np.float32), rng.normal(size=50).astype(np.float32)
    out = m.mix(0, prev, agg).astype(np.float64)
    c = m.last["fedbaf_c"]
    pre32 = pre.astype(np.float32).astype(np.float64)
    lo, hi = np.minimum(agg, pre32), np.maximum(agg, pre32)
    assert ((out >= lo - 1e-6) & (out <= hi + 1e-6)).all()  # inv. 3: between w' and w_pre
    lam = np.linalg.lstsq((pre32 - agg)[:, None], out - agg, rcond=None)[0][0]
    assert lam == pytest.approx(c / (1 + c), rel=1e-6)  # float32 output, so 1e-6
    # inv. 11 (App. G.1): the two distance identities
    d = np.linalg.norm(agg - pre32)
    assert np.linalg.norm(out - agg) == pytest.approx(c / (1 + c) * d, rel=1e-5)
    assert np.linalg.norm(out - pre32) == pytest.approx(d / (1 + c), rel=1e-5)
    fixed = mixer_on(tmp_path, pre)  # inv. 2: w' = w_pre is a fixed point
    np.testing.assert_allclose(fixed.mix(0, prev, pre32.astype(np.float32)), pre32, rtol=1e-6)


def test_proposition_2_s_bound_holds_for_random_points(tmp_path):
    """Issue 45 (9), §5.3 Prop. 2 (inv. 11): with δ = max_k ‖w^k − w*‖ over the round's client
    models and γ = ‖w_pre − w*‖ ≤ δ, the mixed model satisfies ‖w_{t+1} − w*‖ ≤ (δ + c·γ)/(1 + c)
    ≤ δ, in float64, for the mixer's own output and c, over random w*, clients and w_pre (some
    with γ = δ, the tight case). Control: a w_pre farther than δ can break the outer bound."""
    rng = np.random.default_rng(12)
    d, broken = 400, 0
    for trial in range(40):
        star = rng.normal(size=d)
        clients = star + rng.normal(scale=rng.uniform(0.1, 2.0), size=(5, d))
        delta = max(np.linalg.norm(w - star) for w in clients)
        direction = rng.normal(size=d)
        far = 3.0 if trial % 4 == 3 else (1.0 if trial % 4 == 2 else rng.uniform(0.1, 1.0))
        pre = star + far * delta * direction / np.linalg.norm(direction)
        m = mixer_on(tmp_path, pre)
        agg = clients.mean(axis=0).astype(np.float32)
        out = m.mix(0, (star + rng.normal(size=d)).astype(np.float32), agg).astype(np.float64)
        c = m.last["fedbaf_c"]
        pre32 = pre.astype(np.float32).astype(np.float64)
        gamma = np.linalg.norm(pre32 - star)
        dist = np.linalg.norm(out - star)
        slack = 1e-6 * max(delta, gamma)  # float32 weights
        if far <= 1.0:
            assert dist <= (delta + c * gamma) / (1 + c) + slack
            assert (delta + c * gamma) / (1 + c) <= delta + slack
        else:
            broken += dist > delta
    assert broken  # γ > δ: the premise matters


# --------------------------------------------------------------------------- inv. 4, matching
def test_unmatched_and_integer_tensors_are_left_exactly_as_aggregated():
    layout = Layout(
        [
            ("body.weight", (3, 4), SHARED),
            ("head.weight", (10, 3), SHARED),
            ("bn.num_batches_tracked", (), "buffers"),
        ]
    )
    pre = {"body.weight": (3, 4), "head.weight": (20, 3), "bn.num_batches_tracked": ()}
    matches, unmatched = match_layers(layout, pre, "exact")
    assert [m.name for m in matches] == ["body.weight"]  # a new head (20 → 10 classes) is not
    assert set(unmatched) == {"head.weight", "bn.num_batches_tracked"}
    sliced, _ = match_layers(layout, pre, "leading_slice")
    assert {m.name: m.block for m in sliced} == {"body.weight": (3, 4), "head.weight": (10, 3)}
    head = sliced[1].global_indices(layout)
    assert head.tolist() == list(range(12, 42))
    excluded, _ = match_layers(layout, pre, "exact", exclude=["^body"])
    assert excluded == []
    in_order, _ = match_layers(layout, {"a": (3, 4), "b": (10, 3)}, "shape_in_order")
    assert [(m.name, m.foundation) for m in in_order] == [
        ("body.weight", "a"),
        ("head.weight", "b"),
    ]


@pytest.mark.parametrize("tau_scope", ["all", "matched"])
def test_the_mixer_moves_matched_coordinates_only(tmp_path, tau_scope):
    """The mixer itself on a layout with a matched body, a head of another shape (a new
    classifier: unmatched) and an integer buffer: the head's and the buffer's values leave
    ``mix`` bit for bit as aggregated; the body's move to (w' + c·w_pre)/(1 + c). Control:
    with ``leading_slice`` the head's shared block moves too."""
    layout = Layout(
        [
            ("body.weight", (3, 4), SHARED),
            ("head.weight", (10, 3), SHARED),
            ("bn.num_batches_tracked", (), "buffers"),
        ]
    )
    rng = np.random.default_rng(11)
    pre = {
        "body.weight": rng.normal(size=(3, 4)).astype(np.float32),
        "head.weight": rng.normal(size=(20, 3)).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
    }
    save_file(pre, str(tmp_path / "pre.safetensors"))
    ctx = ServerContext(0, layout, 4)
    prev = rng.normal(size=layout.size).astype(np.float32)
    agg = rng.normal(size=layout.size).astype(np.float32)
    agg[-1] = 3.0  # the buffer's count, as aggregated
    moved = {}
    for match in ("exact", "leading_slice"):
        m = FedBaF(
            FedBaFParams(foundation=str(tmp_path / "pre.safetensors"), match=match,
                         tau_scope=tau_scope)
        )  # fmt: skip
        m.setup(ctx)
        out = m.mix(0, prev, agg)
        c = m.last["fedbaf_c"]
        assert 1.0 <= c <= 2.0
        body = slice(0, 12)
        want = (agg[body].astype(np.float64) + c * pre["body.weight"].ravel()) / (1 + c)
        np.testing.assert_allclose(out[body], want, rtol=1e-6)
        assert out[-1] == agg[-1] == 3.0  # the integer buffer, bit for bit
        moved[match] = not np.array_equal(out[12:42], agg[12:42])
    assert moved == {"exact": False, "leading_slice": True}


def test_leading_slice_mixes_only_the_shared_block(tmp_path):
    save_file({"w": np.ones((4, 6), np.float32)}, str(tmp_path / "wide.safetensors"))
    ctx = ServerContext(0, Layout([("w", (3, 3), SHARED), ("b", (3,), SHARED)]), 4)
    m = FedBaF(FedBaFParams(foundation=str(tmp_path / "wide.safetensors"), match="leading_slice"))
    m.setup(ctx)
    prev = np.zeros(12, np.float32)
    agg = np.full(12, -1.0, np.float32)
    out = m.mix(0, prev, agg)
    c = m.last["fedbaf_c"]
    np.testing.assert_allclose(out[:9], (-1 + c) / (1 + c), rtol=1e-6)  # W_pre[:3, :3]
    assert np.array_equal(out[9:], agg[9:])  # no foundation tensor "b": untouched
    assert "leading block [3, 3]" not in m.report and "not mixed" in m.report


# --------------------------------------------------------------------------- privacy, streams
def test_the_foundation_refuses_to_be_pickled_and_stays_out_of_the_state(tmp_path):
    m = mixer_on(tmp_path, np.arange(5.0))
    with pytest.raises(PrivateStateError):
        pickle.dumps(m.pre)
    import cloudpickle

    def payload():  # a closure that captures the server's mixer (§2.8's Ray pitfall)
        return m.pre

    with pytest.raises(PrivateStateError):
        cloudpickle.dumps(payload)
    assert set(m.state_dict()) == {"tau0", "stream", "last"}  # no foundation, no indices
    pickle.dumps(m.state_dict())


def test_the_foundation_s_arrays_and_the_auditor_s_copies_refuse_to_be_pickled(tmp_path):
    """Issue 45 (7): a closure that captured the foundation's array itself, a slice of it, a
    float32 copy, a ``Secret`` (the auditor's copy of a block, ``Secret.values``) or the
    auditor shipped w_pre as plain arrays. Each now fails to pickle; the values still compute
    in the server's process, and the deliberate plain copy (``np.ascontiguousarray``, the
    ``log_private`` artifact's way) is an ordinary array. Control: the plain copy pickles."""
    import cloudpickle

    from raysim.security.audit import LeakAuditor

    pre = np.arange(200.0)
    m = mixer_on(tmp_path, pre)
    held = m.pre["w_pre"]
    secrets = m.secrets()
    auditor = LeakAuditor(secrets, size=len(pre))
    leaks = {
        "the array": held,
        "a slice": held[10:20],
        "a float32 copy": held.astype(np.float32),
        "a Secret": secrets[0],
        "its values": secrets[0].values,
        "the auditor": auditor,
    }
    escaped = []
    for what, value in leaks.items():
        for dump in (pickle.dumps, lambda v: cloudpickle.dumps(lambda: v)):  # a closure too
            try:
                dump(value)
                escaped.append(what)
            except PrivateStateError:
                pass
    assert not escaped
    assert float(held.sum()) == float(pre.sum()) and not held.flags.writeable
    plain = np.ascontiguousarray(secrets[0].values)
    assert type(plain) is np.ndarray
    mixed = np.zeros(200, np.float32) + np.float32(0.01) * held  # a model the server mixes
    assert type(mixed) is np.ndarray and pickle.loads(pickle.dumps(mixed)).shape == (200,)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(plain)), pre.astype(np.float32))


def test_the_seeded_stream_resumes_and_the_secure_one_does_not_repeat(tmp_path):
    rng = np.random.default_rng(2)
    calls = [(rng.normal(size=6).astype(np.float32), rng.normal(size=6).astype(np.float32))]
    calls *= 6

    def cs(m, start=0):
        out = []
        for t in range(start, 6):
            m.mix(t, *calls[t])
            out.append(m.last["fedbaf_c"])
        return out

    whole = cs(mixer_on(tmp_path, np.zeros(6)))
    half = mixer_on(tmp_path, np.zeros(6))
    for t in range(3):
        half.mix(t, *calls[t])
    state = pickle.loads(pickle.dumps(half.state_dict()))
    resumed = FedBaF(half.params)
    resumed.load_state_dict(state)
    resumed.setup(ServerContext.minimal(seed=0, size=6, num_clients=4))
    assert cs(resumed, 3) == whole[3:]  # bit-identical continuation
    assert cs(mixer_on(tmp_path, np.zeros(6))) == whole  # seeded: reproducible
    secure = [cs(mixer_on(tmp_path, np.zeros(6), rng="secure")) for _ in range(2)]
    assert secure[0] != secure[1]


def test_u_is_uniform_on_one_to_two(tmp_path):
    from scipy import stats

    m = mixer_on(tmp_path, np.zeros(3))
    prev, agg = np.array([1, 0, 0], np.float32), np.array([0, 1, 0], np.float32)
    u = []
    for t in range(10_000):
        m.coefficient(t, prev, agg)
        u.append(m.last["fedbaf_u"])
    assert stats.kstest(np.array(u) - 1.0, "uniform").pvalue > 0.01


# --------------------------------------------------------------------------- inv. 1 on runs
def run_cfg(algorithm, hooks=None):
    return load_config(tiny(algorithm=algorithm, hooks={"server": hooks or []}))


def foundation_for(cfg, path, seed=123):
    """The run's architecture with other random weights, saved under the layout's names."""
    torch.manual_seed(seed)
    handle = build_handle(cfg.model, DataSpec("dense", (64,), 10))
    tensors = {k: v.detach().numpy().copy() for k, v in handle.module.state_dict().items()}
    save_file(tensors, str(path))
    return tensors


def finish(cfg):
    core = local_core(cfg)
    while not core.done:
        core.step()
    return core


@pytest.mark.parametrize(
    "algorithm", [{"name": "fedavg"}, {"name": "fedprox", "mu": 0.01}, {"name": "fedadam"}]
)
def test_psi_zero_is_the_base_algorithm_bit_for_bit(tmp_path, algorithm):
    path = tmp_path / "pre.safetensors"
    foundation_for(run_cfg(algorithm), path)
    base = finish(run_cfg(algorithm))
    mixed = finish(run_cfg(algorithm, [{"name": "fedbaf", "foundation": str(path), "psi": 0}]))
    assert mixed.digest() == base.digest()
    assert [h["accuracy"] for h in mixed.history if "accuracy" in h] == [
        h["accuracy"] for h in base.history if "accuracy" in h
    ]


def test_psi_one_pulls_the_run_towards_the_foundation(tmp_path):
    path = tmp_path / "pre.safetensors"
    cfg = run_cfg({"name": "fedavg"})
    pre = foundation_for(cfg, path)
    base = finish(cfg)
    mixed = finish(run_cfg({"name": "fedavg"}, [{"name": "fedbaf", "foundation": str(path)}]))
    layout = base.strategy.ctx.layout
    w_pre = layout.flatten(pre)
    assert np.linalg.norm(mixed.weights - w_pre) < np.linalg.norm(base.weights - w_pre)
    m = mixed.strategy.metrics()
    assert 0 < m["fedbaf_c"] and m["fedbaf_tau0"] > 0


# --------------------------------------------------------------------------- the method
@pytest.mark.parametrize(
    "base, base_params",
    [("fedavg", {}), ("fedprox", {"mu": 0.01}), ("fedadam", {})],
)
def test_the_fedbaf_method_with_psi_zero_is_its_base(tmp_path, base, base_params):
    """Inv. 1 through ``algorithm: {name: fedbaf, base: ...}``; FedProx in its standard server
    mode (the paper_damped one adds the damping of §2.6, so it must differ)."""
    path = tmp_path / "pre.safetensors"
    plain = run_cfg({"name": base, **base_params})
    foundation_for(plain, path)
    algo = {"name": "fedbaf", "base": base, "base_params": base_params, "foundation": str(path)}
    mode = {"fedprox_server_mode": "standard"} if base == "fedprox" else {}
    mixed = finish(run_cfg({**algo, **mode, "psi": 0}))
    assert mixed.digest() == finish(plain).digest()
    if base == "fedprox":
        damped = finish(run_cfg({**algo, "psi": 0}))
        damp = finish(run_cfg({"name": "fedprox", "mu": 0.01}, [{"name": "damp", "mu": 0.01}]))
        assert damped.digest() == damp.digest() != mixed.digest()


def test_fedadam_moments_see_client_deltas_only(tmp_path):
    """Inv. 12: after every round, FedAdam's m and v under FedBaF equal a plain FedAdam's fed
    the same client deltas round by round (its own model never mixed): the mix moves only the
    model, and the moments never see the foundation's pull, in later rounds too, where the
    clients start from mixed models."""
    path = tmp_path / "pre.safetensors"
    foundation_for(run_cfg({"name": "fedadam"}), path)
    core = local_core(
        run_cfg({"name": "fedbaf", "base": "fedadam", "foundation": str(path), "psi": 1.0})
    )
    strategy = core.strategy
    seen: list = []
    on_arrival = strategy.base.on_arrival
    strategy.base.on_arrival = lambda u: (seen.append(u), on_arrival(u))[1]
    from raysim.algorithms.general.fedadam import FedAdam

    replay = FedAdam(strategy.base.params, strategy.base.weights.copy(), 20)
    replay.setup(strategy.base.ctx)
    for k in range(core.cfg.rounds):
        seen.clear()
        core.step()
        for u in seen:
            replay.on_arrival(u)
        replay.on_round_end(k)
        np.testing.assert_array_equal(replay.m, strategy.base.m)
        np.testing.assert_array_equal(replay.v, strategy.base.v)
        assert not np.array_equal(replay.weights, strategy.weights)  # the mix moved the model
    assert core.cfg.rounds >= 3


def test_fedbaf_refuses_a_base_it_cannot_wrap_and_bad_base_params(tmp_path):
    from raysim.config import ConfigError

    with pytest.raises(ConfigError, match="base"):
        run_cfg({"name": "fedbaf", "base": "ditto", "foundation": "x"})
    with pytest.raises(ConfigError, match="base_params"):
        run_cfg({"name": "fedbaf", "base": "fedprox", "base_params": {"muu": 1}, "foundation": "x"})


# --------------------------------------------------------------------------- inv. 10, the auditor
def audited(algorithm):
    raw = run_cfg(algorithm).model_dump(mode="json")
    raw["audit"] = {"leaks": True}
    return load_config(raw)


@pytest.mark.parametrize("base", ["fedavg", "fedprox", "fedadam"])
def test_no_payload_carries_the_foundation_and_round_zero_is_the_random_init(tmp_path, base):
    path = tmp_path / "pre.safetensors"
    foundation_for(run_cfg({"name": base}), path)
    core = local_core(audited({"name": "fedbaf", "base": base, "foundation": str(path)}))
    plain = local_core(run_cfg({"name": base}))
    first = core._current_handle().weights  # what round 0 sends (published, and audited)
    np.testing.assert_array_equal(first, plain._current_handle().weights)  # the random init
    while not core.done:
        core.step()
    assert core.auditor.checked >= core.cfg.rounds  # every broadcast was checked
    assert core.strategy.metrics()["fedbaf_c"] > 0  # and the foundation was mixed in


@pytest.fixture(scope="module")
def digits_foundation(tmp_path_factory):
    """The mini example's foundation, as ``raysim pretrain digits`` makes it (seconds)."""
    from raysim.models.pretrain_digits import DigitsPretrainConfig, pretrain_digits

    out = tmp_path_factory.mktemp("foundations") / "digits"
    pretrain_digits(DigitsPretrainConfig(), out)
    return out


@pytest.mark.parametrize("base", ["fedavg", "fedprox", "fedadam"])
def test_the_mini_example_runs_whole_under_the_auditor_over_each_base(digits_foundation, base):
    """Issue 25: no false positive on a FedBaF example, its whole run, the auditor on as the
    example has it (benchmarks/audit_examples.py runs mini-lm too, on Ray)."""
    over = [f"algorithm.base={base}", f"algorithm.foundation={digits_foundation}"]
    cfg = load_config(EXAMPLES / "fedbaf" / "mini.yaml", [*over, "tracking.enabled=false"])
    assert cfg.audit.leaks and cfg.audit.on_leak == "stop"
    core = local_core(cfg)
    while not core.done:
        core.step()
    assert core.auditor.checked >= cfg.rounds
    assert core.strategy.metrics()["fedbaf_c"] > 0


def test_every_rounds_audit_time_is_counted_where_it_was_spent(digits_foundation):
    """A version published for a round's evaluation is audited in that round: with an evaluation
    every round, each round's ``audit_wall_s`` holds the check of the version it published (it
    was lost, 0 after round 0, when the check ran after the round's metrics were taken)."""
    over = [f"algorithm.foundation={digits_foundation}", "tracking.enabled=false"]
    cfg = load_config(EXAMPLES / "fedbaf" / "mini.yaml", [*over, "rounds=4", "eval.every=1"])
    core = local_core(cfg, evaluate=True)  # evaluated on the workers, as a run on Ray is
    while not core.done:
        core.step()
    assert all(h["audit_wall_s"] > 0 for h in core.history), core.history


def test_the_weight_init_baseline_trips_the_auditor(tmp_path):
    """The positive control: w_0 = w_pre on matched layers is sent in round 0."""
    from raysim.security.audit import LeakError

    path = tmp_path / "pre.safetensors"
    foundation_for(run_cfg({"name": "fedavg"}), path)
    algo = {"name": "fedbaf", "foundation": str(path), "variant": "weight_init"}
    with pytest.raises(LeakError, match="server-private"):
        local_core(audited(algo)).step()
    with pytest.raises(LeakError, match="server-private"):  # on by default: FedBaF has secrets
        local_core(run_cfg(algo)).step()
    quiet = local_core(load_config(run_cfg(algo), ["audit.leaks=false"]))  # the baseline runs
    quiet.step()
    rows = quiet.strategy.tables()["fedbaf_matching"]
    assert rows[-1]["line"].startswith("4 tensors mixed")  # the MLP's 2 weights and 2 biases


def round_zero_rejected(path, audit: bool, **params):
    """A FedBaF core whose every round-0 update is corrupted (so rejected): r_0 = 0."""
    from raysim.sim.clock import Schedule
    from raysim.sim.delays import build_delay_model

    cfg = run_cfg({"name": "fedavg"})
    delays = build_delay_model(cfg.delays, cfg.clients.num, cfg.seed)
    first = Schedule(cfg.clients.num, cfg.clients.per_round, delays, cfg.seed).dispatch(0)
    raw = run_cfg({"name": "fedbaf", "foundation": str(path), **params}).model_dump(mode="json")
    raw["faults"] = {"corrupt_updates": [{"client": c, "round": 0} for c in first.clients.tolist()]}
    raw["audit"] = {"leaks": audit}
    return local_core(load_config(raw))


@pytest.mark.parametrize("audit", [True, False])
def test_a_round_zero_that_does_not_move_leaves_c_at_zero_not_the_foundation(tmp_path, audit):
    """Issue 45 (6): with every round-0 update rejected, r_0 = 0. τ_0 floored at 1e-12 there
    (``tau0_from: round_zero``, the spec's letter) made c_1 about 1e11 and the broadcast the
    foundation: the auditor stops that run, and without the auditor it sends w_pre. The default
    keeps c = 0 until τ_t first moves, takes τ_0 there (c ∈ [ψ, 2ψ] in that round, as c_0 is
    normally) and runs to the end, the auditor on or off, never near the foundation."""
    from raysim.security.audit import LeakError

    path = tmp_path / "pre.safetensors"
    plain = local_core(run_cfg({"name": "fedavg"}))
    pre = foundation_for(plain.cfg, path)
    core = round_zero_rejected(path, audit)
    core.step()
    assert core.history[0]["rejected_updates"] == core.cfg.clients.per_round
    assert core.strategy.metrics()["fedbaf_c"] == 0.0
    core.step()
    m = core.strategy.metrics()
    assert m["fedbaf_tau0"] == m["fedbaf_tau"] > 0 and 1.0 <= m["fedbaf_c"] <= 2.0
    while not core.done:
        core.step()
    flat = plain.strategy.ctx.layout.flatten(pre)
    gap = np.linalg.norm(core.weights - flat) / np.linalg.norm(flat)
    assert gap > 0.1
    literal = round_zero_rejected(path, audit, tau0_from="round_zero")
    if audit:
        with pytest.raises(LeakError):
            while not literal.done:
                literal.step()
        return
    literal.step()
    literal.step()
    assert literal.strategy.metrics()["fedbaf_c"] > 1e9
    leaked = np.linalg.norm(literal.weights - flat) / np.linalg.norm(flat)
    assert leaked < 1e-6 < gap


# --------------------------------------------------------------------------- on Ray
@pytest.mark.slow
@pytest.mark.matrix  # suite time: the auditor on raysim run in tests/test_audit.py
def test_fedbaf_through_raysim_run_on_two_workers_with_the_auditor(
    tmp_path, ray_cluster, mlflow_uri
):
    """The CI smoke: ``raysim run`` on Ray, 2 workers and one killed, the auditor on, ends on the
    in-process digest; c_t and the matching report reach MLflow; the weight-init baseline fails
    the run on its first broadcast."""
    from mlflow.tracking import MlflowClient

    import raysim

    path = tmp_path / "pre.safetensors"
    foundation_for(run_cfg({"name": "fedavg"}), path)
    raw = audited({"name": "fedbaf", "base": "fedprox", "foundation": str(path)})
    cfg = load_config({**raw.model_dump(mode="json"), "tracking": {"experiment": "fedbaf-smoke"}})
    # groups of 2, so that both workers train batched groups and the killed one had work
    cfg = load_config(cfg, ["workers.group_size=2"])
    faults = ["faults.kill_worker.round=1", "faults.kill_worker.worker=1"]
    res = raysim.run(cfg, ["workers.count=2", *faults])
    assert res.weights_digest == finish(cfg).digest()
    assert sum(h["worker_restarts"] for h in res.history) == 1
    client = MlflowClient(mlflow_uri)
    assert "fedbaf_c" in client.get_run(res.run_id).data.metrics
    names = {a.path for a in client.list_artifacts(res.run_id, "strategy")}
    assert "strategy/fedbaf_matching.csv" in names
    assert "raysim.restricted" not in client.get_run(res.run_id).data.tags
    assert not client.list_artifacts(res.run_id, "private")  # never, unless asked
    from raysim.security.audit import LeakError

    with pytest.raises(LeakError, match="server-private"):  # Ray's wrapper is a LeakError too
        raysim.run(
            cfg, ["algorithm.variant=weight_init", "workers.count=2", "algorithm.log_private=true"]
        )
    exp = client.get_experiment_by_name("fedbaf-smoke").experiment_id
    (restricted,) = client.search_runs([exp], "tags.`raysim.restricted` = 'true'")
    assert restricted.info.status == "FAILED"  # the leak stopped it; the artifact was asked for
    assert [a.path for a in client.list_artifacts(restricted.info.run_id, "private")] == [
        "private/foundation.safetensors"
    ]


# --------------------------------------------------------------------------- inv. 13, harness
def three_rounds(tmp_path, d=2000, **params):
    """w_0 → (w'_1, w_1) → (w'_2, w_2) through the mixer, every coordinate matched; each
    aggregate is the mean of 4 clients' local models; also client 0's model of round 1."""
    from raysim.algorithms.fedbaf.mixer import FedBaF, FedBaFParams

    rng = np.random.default_rng(5)
    pre = rng.normal(size=d)
    save_file({"weights": pre.astype(np.float32)}, str(tmp_path / "pre.safetensors"))
    m = FedBaF(FedBaFParams(foundation=str(tmp_path / "pre.safetensors"), **params))
    m.setup(ServerContext.minimal(seed=0, size=d, num_clients=4))
    w0 = rng.normal(size=d).astype(np.float32)
    local1 = w0 + rng.normal(0, 0.3, (4, d))
    agg1 = local1.mean(axis=0).astype(np.float32)
    w1 = m.mix(0, w0, agg1)
    agg2 = (w1 + rng.normal(0, 0.3, (4, d)).mean(axis=0)).astype(np.float32)
    w2 = m.mix(1, w1, agg2)
    return pre.astype(np.float32), w0, agg1, w1, agg2, w2, local1[0].astype(np.float32)


def test_full_collusion_recovers_the_foundation_exactly(tmp_path):
    """E2 (random α, two rounds) and E0 (static α) recover w_pre to < 1e-6 (§6.2): a property of
    the algorithm the harness documents, not a raysim bug. With a small share δ of the second
    aggregate unknown to the colluders (an honest client), E2's error is first order in δ: it
    doubles with δ (at larger δ it grows faster). One curious client knows only its own model,
    not the aggregate: E1 from it is approximate (error of the clients' spread over c), yet
    nearer w_pre than the broadcast it received; given the true aggregate and c, exact."""
    from raysim.security.extraction import (
        Closeness,
        e0_static_alpha,
        e1_one_round,
        e2_two_rounds,
    )

    pre, w0, agg1, w1, agg2, w2, own = three_rounds(tmp_path)
    e2 = Closeness.of(e2_two_rounds(w1, agg1, w2, agg2), pre)
    assert e2.relative_error < 1e-6 and e2.cosine > 1 - 1e-9
    delta = np.random.default_rng(6).normal(0, 3e-5, agg2.shape)  # small: the linear regime
    errors = [
        Closeness.of(e2_two_rounds(w1, agg1, w2, agg2 + k * delta), pre).relative_error
        for k in (1, 2)
    ]
    assert 20 * e2.relative_error < errors[0] < 1e-5
    assert errors[1] / errors[0] == pytest.approx(2.0, rel=0.05)
    pre0, w0, agg1_s, w1_s, agg2_s, w2_s, _ = three_rounds(tmp_path, alpha_random=False)
    e0 = Closeness.of(e0_static_alpha(w0, agg1_s, w1_s, agg2_s, w2_s), pre0)
    assert e0.relative_error < 1e-6
    with_own = Closeness.of(e1_one_round(w1, own, c_guess=1.5), pre)  # what one client has
    alone = Closeness.of(w1, pre)
    assert 1e-2 < with_own.relative_error < alone.relative_error
    c_true = float(
        np.dot(w1 - agg1, pre - w1) / np.dot(pre - w1, pre - w1)
    )  # w1 = (w' + c·p)/(1+c)
    oracle = Closeness.of(e1_one_round(w1, agg1, c_guess=c_true), pre)
    assert oracle.relative_error < 1e-5


def test_the_auditor_finds_the_foundation_bytes_anywhere_in_a_payload():
    """§6.3 (ii): a matched tensor's float32 bytes inside any payload array trip the auditor,
    wherever they sit, and so does a scaled copy (issue 25); the values with 1 % noise each, or
    a block under 64 values, do not."""
    from raysim.algorithms.base import Secret
    from raysim.security.audit import LeakAuditor, LeakError

    rng = np.random.default_rng(7)
    pre = rng.normal(size=100).astype(np.float32)
    auditor = LeakAuditor([Secret("body.weight", np.arange(100), pre)], size=1000)
    hidden = np.concatenate([rng.normal(size=37), pre, rng.normal(size=5)]).astype(np.float32)
    with pytest.raises(LeakError, match="body.weight's bytes"):
        auditor.check([{"extra": hidden}], "a downlink")
    with pytest.raises(LeakError, match=r"as 1·x \+ 0, in order\) at positions 37–136"):
        auditor.check({"extra": hidden * np.float32(1.001)}, "a downlink")  # scaled: a copy
    noisy = hidden * (1 + rng.normal(0, 0.01, hidden.shape)).astype(np.float32)
    auditor.check({"extra": noisy}, "a downlink")  # 1 % noise on each value: no copy
    short = LeakAuditor([Secret("bias", np.arange(10), pre[:10])], size=1000)
    short.check(hidden, "a downlink")
    assert auditor.checked == 3 and short.checked == 1
    smuggled = np.frombuffer(b"\x07" + pre.tobytes() + b"\x01\x02", dtype=np.uint8)
    with pytest.raises(LeakError, match="bytes"):  # not a float32 array: a plain byte search
        auditor.check({"blob": smuggled}, "a downlink")
    for shift in (0, 1):  # both parities of the float32 word search, in a 2-D payload
        grid = np.concatenate([np.zeros(shift, np.float32), pre, np.zeros(3, np.float32)])
        with pytest.raises(LeakError, match="bytes"):
            auditor.check(grid.reshape(-1, 1), "a downlink")


# --------------------------------------------------------------------------- inv. 9, inv. 14
def test_sampling_takes_max_floor_c_k_distinct_clients_and_weights_sum_to_one():
    """§7.2 inv. 9: m = max(⌊C·K⌋, 1) distinct clients a round; p_k = n_k / Σ n sums to 1 and is
    the plain mean for equal n_k."""
    from raysim.algorithms.general.fedavg import FedAvg
    from raysim.algorithms.registry import get_method
    from tests.test_interface import upd

    assert load_config(tiny(clients={"num": 10, "fraction": 0.05})).clients.per_round == 1
    cfg = load_config(tiny(rounds=5, clients={"num": 20, "fraction": 0.33}))
    assert cfg.clients.per_round == 6
    with pytest.raises(ValueError, match="contradicts"):
        load_config(tiny(clients={"num": 20, "fraction": 0.33, "per_round": 5}))
    core = local_core(cfg)
    by_round: dict[int, list[int]] = {}
    orig = core.strategy.on_arrival
    core.strategy.on_arrival = lambda u: (
        by_round.setdefault(u.dispatch_round, []).append(u.client_id),
        orig(u),
    )[1]
    while not core.done:
        core.step()
    assert [len(set(c)) for c in by_round.values()] == [6] * 5
    assert all(len(c) == 6 for c in by_round.values())
    fedavg = FedAvg(get_method("fedavg").params(), np.zeros(3, np.float32), 4)
    deltas = [np.array([1.0, 2.0, 3.0]), np.array([3.0, 0.0, -1.0]), np.array([2.0, 2.0, 2.0])]
    for k, d in enumerate(deltas):
        fedavg.on_arrival(upd(k, d, n=7))
    np.testing.assert_allclose(fedavg.round_delta(), np.mean(deltas, axis=0), rtol=1e-6)
    fedavg.pending = [upd(0, deltas[0], n=1), upd(1, deltas[1], n=3)]
    np.testing.assert_allclose(fedavg.round_delta(), 0.25 * deltas[0] + 0.75 * deltas[1])


def test_a_bf16_model_is_mixed_in_fp32_and_stays_within_bf16_rounding(tmp_path):
    """§7.2 inv. 14: the mix of a bf16 model's weights runs in wider precision; the result, cast
    back to bf16, differs from an fp64 reference by at most bf16's rounding (half an ulp)."""
    rng = np.random.default_rng(8)
    d = 4096
    pre = torch.tensor(rng.normal(size=d)).to(torch.bfloat16)
    m = mixer_on(tmp_path, pre.float().numpy())
    w = torch.tensor(rng.normal(size=d)).to(torch.bfloat16)
    agg = torch.tensor(rng.normal(size=d)).to(torch.bfloat16)
    mixed = m.mix(0, w.float().numpy(), agg.float().numpy())  # what the handle hands the server
    out = torch.from_numpy(mixed).to(torch.bfloat16)  # what set_global writes into the model
    assert out.dtype == torch.bfloat16
    c = m.last["fedbaf_c"]
    ref = (agg.double() + c * pre.double()) / (1 + c)
    ulp = torch.finfo(torch.bfloat16).eps * ref.abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    assert torch.all((out.double() - ref).abs() <= ulp / 2 + 1e-12 + ref.abs() * 2**-24)
    assert not torch.equal(out, agg)  # the foundation did move it


def test_a_missing_foundation_says_how_to_make_it(tmp_path):
    """The examples' foundations come from ``raysim pretrain``: the error names the command."""
    from raysim.algorithms.fedbaf.mixer import load_foundation

    with pytest.raises(
        FileNotFoundError, match=r"raysim pretrain digits --out .*foundations/digits"
    ):
        load_foundation(tmp_path / "foundations" / "digits")
    with pytest.raises(FileNotFoundError, match=r"raysim pretrain markov --out"):
        load_foundation(tmp_path / "markov")
    with pytest.raises(FileNotFoundError, match=r"raysim pretrain digits\|markov --out PATH"):
        load_foundation(tmp_path / "mine.safetensors")


def test_a_bf16_model_runs_fedbaf_end_to_end_within_bf16_rounding(tmp_path, monkeypatch):
    """§7.2 inv. 14 through raysim: a config-built LLaMA in bf16 with its LoRA adapters in bf16
    too (``model.lora.adapter_dtype: model``) trains; the server mixes the bf16 values in fp32;
    the tensors the clients then train from are bf16, each within bf16's rounding (half an ulp)
    of an fp64 mix of the same inputs, and the foundation moved them."""
    from raysim.models.pretraining import save_foundation
    from raysim.sim.build import data_spec, method_resident, run_dataset

    over = [
        "model.dtype=bfloat16",
        "model.lora.adapter_dtype=model",
        "rounds=2",
        "clients.per_round=3",
        "eval.every=10",
        "tracking.enabled=false",
    ]
    smoke = str(EXAMPLES / "fedoa" / "smoke.yaml")
    seeded = load_config(smoke, [*over, "seed=7", "algorithm={name: fedit}"])
    foundation = tmp_path / "foundation"
    save_foundation(method_resident(seeded, data_spec(run_dataset(seeded))), foundation, {})
    cfg = load_config(
        smoke, [*over, f"algorithm={{name: fedbaf, base: fedavg, foundation: {foundation}}}"]
    )
    mixes = []
    real_mix = FedBaF.mix

    def recorded(self, round_index, previous, aggregated):
        out = real_mix(self, round_index, previous, aggregated)
        pre = np.asarray(self.pre["w_pre"], dtype=np.float64)  # the server's private copy
        mixes.append((aggregated.copy(), self.last["fedbaf_c"], out.copy(), self.indices, pre))
        return out

    monkeypatch.setattr(FedBaF, "mix", recorded)
    core = local_core(cfg)
    model = core.executor.runner.model
    assert {p.dtype for p in model.global_parameters()} == {torch.bfloat16}
    while not core.done:
        core.step()
    assert len(mixes) == 2
    agg, c, mixed, indices, pre = mixes[-1]
    ref = torch.from_numpy(agg).double()
    ref[indices] = (ref[indices] + c * torch.from_numpy(pre.copy())) / (1 + c)
    model.set_global(mixed)  # what a client's worker writes into its bf16 adapters
    out = torch.from_numpy(model.get_global()).double()
    ulp = torch.finfo(torch.bfloat16).eps * ref.abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    assert torch.all((out - ref).abs() <= ulp / 2 + ref.abs() * 2**-20)
    assert c > 0 and not torch.equal(out, torch.from_numpy(agg).double())
