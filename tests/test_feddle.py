"""Feddle-ID (Feddle spec §3) against its §7.2 invariants I-6 … I-11, in process (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.actors.local import local_core
from raysim.algorithms.feddle.atlas import Atlas
from raysim.algorithms.feddle.search import Objective, SearchConfig, mean_loss, search
from raysim.training.tasks import ClassificationTask
from tests.conftest import EXAMPLES
from tests.test_feddle_baselines import cfg_for, run


def searched(atlas: Atlas, scores) -> None:
    atlas.record_search(np.asarray(scores, dtype=np.float64))


# --------------------------------------------------------------------------- I-7
def test_a_full_atlas_replaces_the_least_important_searched_anchor():
    atlas = Atlas(3)
    for j in range(3):
        assert atlas.insert(np.full(4, j + 1.0), 0, j, 0) == j
    searched(atlas, [0.5, 0.1, 0.1])  # a tie between slots 1 and 2: the older goes
    assert atlas.insert(np.ones(4), 1, 7, 0) == 1
    # the new anchor is protected until searched: the next arrival takes slot 2, not slot 1
    assert atlas.insert(np.ones(4), 1, 8, 0) == 2
    assert len(atlas) == 3 and atlas.evictions == 2
    # more than M arrivals in one round: only then may an unsearched anchor go
    assert atlas.insert(np.ones(4), 1, 9, 0) == 0
    assert atlas.insert(np.ones(4), 1, 10, 0) in (1, 2)
    assert len(atlas) == 3


def test_fifo_and_literal_inherit_eviction():
    fifo = Atlas(2, eviction="fifo")
    for j in range(2):
        fifo.insert(np.ones(3) * (j + 1), 0, j, 0)
    searched(fifo, [9.0, 0.0])  # importance is ignored: the oldest goes
    assert fifo.insert(np.ones(3), 1, 5, 0) == 0
    assert fifo.insert(np.ones(3), 1, 6, 0) == 1
    literal = Atlas(2, new_anchor_score="inherit")
    for j in range(2):
        literal.insert(np.ones(3), 0, j, 0)
    searched(literal, [0.3, 0.2])
    assert literal.insert(np.ones(3), 1, 5, 0) == 1  # inherits 0.2, stays the minimum ...
    assert literal.insert(np.ones(3), 1, 6, 0) == 1  # ... so the next arrival evicts it (A6)


def test_negligible_deltas_are_not_anchors():
    atlas = Atlas(2)
    assert atlas.insert(np.zeros(5), 0, 0, 0) == -1 and len(atlas) == 0


# --------------------------------------------------------------------------- I-8
def test_normalised_anchors_have_the_median_norm_and_keep_their_directions():
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(4, 50)) * np.array([[1.0], [2.0], [5.0], [9.0]])
    atlas = Atlas(4)
    for j, a in enumerate(raw):
        atlas.insert(a, 0, j, 0)
    anchors, rho = atlas.normalized()
    norms = np.linalg.norm(raw.astype(np.float32).astype(np.float64), axis=1)
    assert rho == pytest.approx(np.mean(np.sort(norms)[1:3]))  # even |A|: the two middle ones
    np.testing.assert_allclose(np.linalg.norm(anchors, axis=1), rho, rtol=1e-6)
    np.testing.assert_allclose(
        anchors / np.linalg.norm(anchors, axis=1, keepdims=True),
        raw / norms[:, None],
        rtol=1e-5,
        atol=1e-6,
    )
    scaled = Atlas(4)
    for j, a in enumerate(raw * 7.0):
        scaled.insert(a, 0, j, 0)
    anchors7, rho7 = scaled.normalized()
    np.testing.assert_allclose(anchors7 / rho7, anchors / rho, rtol=1e-5, atol=1e-6)
    one = Atlas(3)
    one.insert(raw[2], 0, 0, 0)
    np.testing.assert_allclose(one.normalized()[0][0], raw[2].astype(np.float32))
    raw_anchors, _ = atlas.normalized("none")
    np.testing.assert_allclose(raw_anchors, raw.astype(np.float32))


# --------------------------------------------------------------------------- I-9
def test_the_stop_gradient_coefficient_gradient_is_the_chain_rule():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    module = module.double()
    params = list(module.parameters())
    d = sum(p.numel() for p in params)
    base = torch.nn.utils.parameters_to_vector(params).detach().clone()
    anchors = torch.randn(4, d, dtype=torch.float64) * 0.1
    c = torch.randn(4, dtype=torch.float64)
    batch = (torch.randn(16, 5, dtype=torch.float64), torch.randint(0, 3, (16,)))
    task = ClassificationTask()
    grad, _ = Objective(module, params, task, None, base, anchors).gradient(batch, c)

    names = [n for n, _ in module.named_parameters()]
    shapes = [p.shape for p in params]

    def loss_of(coef: torch.Tensor) -> torch.Tensor:
        flat = base + anchors.T @ coef
        tensors, offset = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            k = int(np.prod(shape))
            tensors[name] = flat[offset : offset + k].view(shape)
            offset += k
        logits = torch.func.functional_call(module, tensors, (batch[0],))
        return torch.nn.functional.cross_entropy(logits, batch[1])

    want = torch.func.grad(loss_of)(c)
    torch.testing.assert_close(grad, want, rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- I-10, I-11
def toy():
    """Softmax regression on separable-ish data: a convex search problem."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 6, generator=gen)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    module = torch.nn.Linear(6, 2)
    torch.nn.init.zeros_(module.weight)
    torch.nn.init.zeros_(module.bias)
    params = list(module.parameters())
    base = torch.nn.utils.parameters_to_vector(params).detach().clone()
    anchors = torch.randn(3, base.numel(), generator=gen)
    return module, params, (x, y), base, anchors


def test_full_batch_descent_on_c_never_raises_the_server_loss():
    module, params, data, base, anchors = toy()
    task, c, gen = ClassificationTask(), torch.zeros(3), torch.Generator()
    cfg = SearchConfig(lr=0.05, epochs=1, batch_size=64, optimizer="sgd")
    losses = []
    for _ in range(30):  # SGD keeps no state: 30 calls are 30 steps of one descent
        c = search(Objective(module, params, task, data, base, anchors), c, c * 0, cfg, gen)
        losses.append(mean_loss(module, task, data, 64))
    assert losses[-1] < losses[0]
    assert all(b <= a + 1e-7 for a, b in zip(losses, losses[1:], strict=False))


def test_a_huge_lambda_keeps_the_fallback_coefficients():
    """I-10 (λ half), at the control's own step size: without λ the SGD search moves c by more
    than 1e-2; with λ = 1e12 (the tie's exact proximal step) it stays at c' within 1e-6. Both
    start from c' on the same batches."""
    module, params, data, base, anchors = toy()
    task, c_fb = ClassificationTask(), torch.tensor([0.3, -0.2, 0.1])
    obj = Objective(module, params, task, data, base, anchors)

    def searched(lam: float) -> torch.Tensor:
        cfg = SearchConfig(0.05, 3, 16, "sgd", lam, tie_step="proximal")
        return search(obj, c_fb, c_fb, cfg, torch.Generator().manual_seed(0))

    assert float((searched(0.0) - c_fb).abs().max()) > 1e-2  # the control: λ = 0 moves c
    torch.testing.assert_close(searched(1e12), c_fb, rtol=0, atol=1e-6)


def test_the_proximal_tie_step_is_the_explicit_one_to_first_order():
    """For small η·λ the two tie steps agree to O((η·λ)²) per step."""
    module, params, data, base, anchors = toy()
    task, c_fb = ClassificationTask(), torch.tensor([0.3, -0.2, 0.1])
    obj = Objective(module, params, task, data, base, anchors)
    start = c_fb + 0.05
    out = [
        search(obj, start, c_fb, SearchConfig(0.05, 1, 16, "sgd", 0.1, tie_step=kind),
               torch.Generator().manual_seed(0))
        for kind in ("explicit", "proximal")
    ]  # fmt: skip
    gap = float((out[0] - out[1]).abs().max())
    assert 0 < gap < 1e-3


def test_an_unstable_sgd_tie_is_refused_and_a_nan_search_stops_the_run():
    """η_g·λ ≥ 2 with the explicit SGD step grows c − c' without bound: refused in one line.
    A search that still ends non-finite stops the run (``Diverged``), naming the round."""
    from raysim.algorithms.base import Diverged
    from raysim.algorithms.feddle.method import FeddleParams

    with pytest.raises(ValueError, match="diverges; lower server_lr or lam, or set tie_step"):
        FeddleParams(coef_optimizer="sgd", server_lr=0.1, lam=1e12)
    FeddleParams(coef_optimizer="sgd", server_lr=0.1, lam=1e12, tie_step="proximal")
    FeddleParams(coef_optimizer="adam", server_lr=0.1, lam=1e12)  # Adam's step is bounded
    cfg = cfg_for({**FEDDLE, "server_epochs": 1, "server_lr": 1e30}, rounds=2, id_size=32)
    with pytest.raises(Diverged, match=r"round \d+: Feddle's coefficient search diverged"):
        run(cfg)


def test_feddle_with_a_huge_lambda_is_its_fedbuff_fallback_weight_for_weight():
    """I-10 in a run: λ = 1e12 with the proximal SGD tie keeps ĉ = c' every round, so Feddle's
    model is ``fedbuff_per_round``'s at the same η_fb (the search runs: E_g = 2)."""
    delays = {"kind": "half_normal", "sigma": 2.0}
    tied = {**FEDDLE, "server_epochs": 2, "server_lr": 0.05, "coef_optimizer": "sgd"}
    tied |= {"lam": 1e12, "tie_step": "proximal"}
    feddle = cfg_for(tied, rounds=4, id_size=32, delays=delays)
    free = cfg_for({**tied, "lam": 0.0}, rounds=4, id_size=32, delays=delays)
    fedbuff = cfg_for(
        {"name": "fedbuff_per_round", "server_lr": 0.5}, rounds=4, id_size=32, delays=delays
    )
    a, b, c = run(feddle).weights, run(fedbuff).weights, run(free).weights
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert np.abs(c - b).max() > 1e-3  # the control: λ = 0 searches away from the fallback


# --------------------------------------------------------------------------- I-6, I-10, runs
FEDDLE = {"name": "feddle", "server_epochs": 0, "fallback_lr": 0.5}


@pytest.mark.parametrize("normalize", ["median", "none"])
def test_feddle_without_a_search_is_fedbuff_per_round(normalize):
    """I-6: E_g = 0 with the FedBuff fallback gives fedbuff_per_round's model every round."""
    delays = {"kind": "half_normal", "sigma": 2.0}
    # Feddle needs server data even where it never searches on it (the same split for both)
    feddle = cfg_for({**FEDDLE, "normalize": normalize}, rounds=5, id_size=32, delays=delays)
    fedbuff = cfg_for(
        {"name": "fedbuff_per_round", "server_lr": 0.5}, rounds=5, id_size=32, delays=delays
    )
    a_hist, b_hist = [], []
    run(feddle, lambda core: a_hist.append(core.strategy.weights.copy()))
    run(fedbuff, lambda core: b_hist.append(core.strategy.weights.copy()))
    assert len(a_hist) == 5
    for a, b in zip(a_hist, b_hist, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(a_hist[-1], a_hist[0])  # it did move


def test_zero_init_without_a_search_leaves_the_model_alone():
    core = local_core(cfg_for({**FEDDLE, "fallback_init": "zero"}, rounds=3, id_size=32))
    start = core.strategy.weights.copy()
    while not core.done:
        core.step()
    assert len(core.strategy.atlas) > 0  # updates arrived; the zero start ignored them
    np.testing.assert_array_equal(core.strategy.weights, start)


def test_a_feddle_run_searches_on_the_server_set_and_reports_it():
    cfg = cfg_for({"name": "feddle", "server_epochs": 1, "server_lr": 1e-2}, rounds=3, id_size=64)
    core = run(cfg)
    m = core.strategy.metrics()
    assert m["feddle_atlas_size"] == min(3 * 5, 10)  # M = 2·S = 10
    assert np.isfinite(m["server_loss_before"]) and np.isfinite(m["server_loss_after"])
    assert m["server_loss_after"] < m["server_loss_before"]
    assert 0.0 <= m["feddle_coef_negative_fraction"] <= 1.0
    rows = core.strategy.tables()["coefficients"]
    assert len(rows) == 5 + 10 + 10  # |A| per round: 5, then the atlas is full (M = 10)
    assert {r["round"] for r in rows} == {0, 1, 2}
    last = rows[-10:]  # the last search's coefficients became the anchors' importance scores
    assert [abs(r["coefficient"]) for r in last] == [s.score for s in core.strategy.atlas.slots]
    d = int(core.strategy.shared.sum())
    assert m["feddle_cache_bytes"] == 10 * d * 4  # the stored deltas (Table 6), float32
    assert m["feddle_probe_bytes"] == 0  # Feddle-ID fits no probe
    assert m["feddle_anchor_matrix_bytes"] == 10 * d * 4  # the search's copy, on its device
    # 64 samples / batch 32 = 2 steps; each at least a forward and backward of the MLP on 32
    mlp_macs = 32 * sum(p.numel() for p in core.strategy.ctx.model()[0].module.parameters())
    assert m["server_gflops"] * 1e9 >= 2 * (2 * mlp_macs + 4 * 10 * d)
    again = run(cfg)
    np.testing.assert_array_equal(again.strategy.weights, core.strategy.weights)  # deterministic
    with pytest.raises(ValueError, match="data.server.id_size"):
        run(cfg_for({"name": "feddle", "server_epochs": 1}, rounds=1))


def test_a_feddle_run_resumes_bit_identically_from_a_checkpoint(tmp_path):
    """The atlas (anchors, scores, ages) comes back with the strategy's state (I-16)."""
    from raysim.state import checkpoint

    delays = {"kind": "half_normal", "sigma": 1.5}
    cfg = cfg_for({"name": "feddle", "server_epochs": 1}, rounds=4, id_size=32, delays=delays)
    ref = run(cfg)
    crashed = local_core(cfg)
    for _ in range(2):
        crashed.step()
    checkpoint.write_dir(tmp_path, checkpoint.pack({"core": crashed.state_dict()}, cfg, 2))
    saved = crashed.strategy.atlas
    del crashed
    resumed = local_core(cfg)
    resumed.load_state_dict(checkpoint.unpack(checkpoint.read_dir(tmp_path))[1]["core"])
    assert [s.seq for s in resumed.strategy.atlas.slots] == [s.seq for s in saved.slots]
    while not resumed.done:
        resumed.step()
    assert resumed.digest() == ref.digest()


# --------------------------------------------------------------------------- I-12 (OOD)
def test_ood_mechanics_probe_fits_head_gets_no_gradient_yet_moves():
    from raysim.algorithms.feddle.probe import ProbeTask, features, fit_probe, head_of, new_probe

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    ).double()
    head = head_of(module)
    assert head is module[2]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=gen, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # 3 OOD labels
    probe = new_probe(8, 3, 5, x)
    feats = features(module, head, x).detach()

    def probe_grad() -> float:
        loss = torch.nn.functional.cross_entropy(probe(feats), y)
        return max(float(g.norm()) for g in torch.autograd.grad(loss, list(probe.parameters())))

    start = probe_grad()
    fit_probe(probe, module, head, (x, y), epochs=300, lr=0.05, batch_size=64, generator=gen)
    assert probe_grad() < 0.02 * start  # θ* (Eq. 9): a convex problem, nearly solved
    theta = [q.detach().clone() for q in probe.parameters()]

    params = list(module.parameters())
    base = torch.nn.utils.parameters_to_vector(params).detach().clone()
    anchors = torch.randn(3, base.numel(), generator=gen, dtype=torch.float64)
    task = ProbeTask(probe, head)
    for q in probe.parameters():
        q.requires_grad_(False)
    c = torch.tensor([0.1, -0.1, 0.05], dtype=torch.float64)
    cfg = SearchConfig(lr=1e-2, epochs=2, batch_size=16)
    c_hat = search(Objective(module, params, task, (x, y), base, anchors), c, c, cfg, gen)
    for before, after in zip(theta, probe.parameters(), strict=True):
        torch.testing.assert_close(after, before, rtol=0, atol=0)  # θ frozen by the c-steps
    # h ignores the head's coordinates: their gradient is exactly 0 ...
    torch.nn.utils.vector_to_parameters(base + anchors.T @ c_hat, params)
    module.zero_grad()
    task.loss(module, (x, y)).backward()
    assert all(p.grad is None or not p.grad.any() for p in head.parameters())
    # ... yet the step moves the head with the body-derived coefficients
    head_coords = slice(base.numel() - sum(p.numel() for p in head.parameters()), None)
    moved = (anchors.T @ c_hat)[head_coords]
    assert float(moved.abs().max()) > 0


def test_a_feddle_ood_run_fits_its_probe_and_searches_on_the_ood_pool():
    cfg = cfg_for(
        {"name": "feddle_ood", "server_epochs": 1, "server_lr": 1e-2, "ood_samples_per_round": 64},
        rounds=3,
        id_size=64,
        ood=[{"name": "shapes", "size": 200}],
    )
    core = run(cfg)
    m = core.strategy.metrics()
    assert core.strategy.params.tie == 0.01  # the OOD default λ (§3.5)
    assert np.isfinite(m["feddle_probe_loss"]) and -1.0 <= m["feddle_grad_cosine"] <= 1.0
    assert set(core.strategy.theta) == {"weight", "bias"}
    assert core.strategy.theta["weight"].shape == (4, 16)  # 4 shape labels × 16 features
    again = run(cfg)
    np.testing.assert_array_equal(again.strategy.weights, core.strategy.weights)


class SquaredError:
    """A quadratic loss for I-11: mean squared error of a linear model's output."""

    def num_examples(self, data):
        return len(data[1])

    def batch(self, data, index):
        return data[0][index], data[1][index]

    def loss(self, module, batch):
        return ((module(batch[0]).squeeze(-1) - batch[1]) ** 2).mean()


def test_on_a_quadratic_the_search_converges_to_least_squares():
    """I-11: c minimising ‖X(ω + Āᵀc) − y‖² is the least-squares solution of (XĀᵀ) c = y − Xω."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 5, generator=gen, dtype=torch.float64)
    y = torch.randn(40, generator=gen, dtype=torch.float64)
    module = torch.nn.Linear(5, 1, bias=False).double()
    params = list(module.parameters())
    base = torch.randn(5, generator=gen, dtype=torch.float64)
    anchors = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    cfg = SearchConfig(lr=0.05, epochs=3000, batch_size=40, optimizer="sgd")
    c0 = torch.zeros(3, dtype=torch.float64)
    obj = Objective(module, params, SquaredError(), (x, y), base, anchors)
    c = search(obj, c0, c0, cfg, gen)
    want = torch.linalg.lstsq(x @ anchors.T, y - x @ base).solution
    torch.testing.assert_close(c, want, rtol=0, atol=1e-8)


@pytest.mark.parametrize("path", sorted((EXAMPLES / "feddle").glob("*.yaml")), ids=str)
def test_feddle_example_configs_validate(path):
    from raysim.config import load_config

    cfg = load_config(path)
    assert cfg.algorithm.name.startswith("feddle")
    ood = load_config(path, ["algorithm.name=feddle_ood"])
    assert ood.data.server.ood  # the OOD variant has its pool


def test_label_disjoint_ood_pool_takes_its_labels_away_from_the_clients():
    """Feddle spec §8.1's second OOD option: clients see digits 0–4, the server's probe 5–9."""
    from raysim.data import build_federated_dataset

    ood = [{"name": "upper", "kind": "label_disjoint", "size": 300}]
    cfg = cfg_for({"name": "feddle_ood"}, id_size=30, ood=ood)
    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    assert set(np.unique(ds.y_train)) == {0, 1, 2, 3, 4}
    assert set(np.unique(ds.y_test)) <= {0, 1, 2, 3, 4}
    assert set(np.unique(ds.server_id[1])) <= {0, 1, 2, 3, 4}
    x, y, classes = ds.server_ood["upper"]
    assert classes == 5 and len(y) == 300 and set(np.unique(y)) == {0, 1, 2, 3, 4}  # 5..9 → 0..4
    assert sum(len(p) for p in np.split(ds.client_indices, ds.client_offsets[1:-1])) == len(
        ds.y_train
    )
    core = run(cfg)  # Feddle-OOD runs on it
    assert core.strategy.theta["weight"].shape[0] == 5


# --------------------------------------------------------------------------- on Ray
SMOKE = [
    {"name": "feddle", "server_epochs": 1},
    {"name": "feddle_ood", "server_epochs": 1, "ood_samples_per_round": 50},
    {"name": "feddf", "server_epochs": 1},
]


def smoke_config(algorithm: dict):
    """Groups of 2 under batched execution, so that both of 2 workers train and a killed one
    had work."""
    return cfg_for(
        algorithm,
        rounds=3,
        id_size=32,
        ood=[{"name": "shapes", "size": 100}],
        tracking={"experiment": "feddle-smoke"},
        workers={"group_size": 2},
    )


def in_process_digest(cfg) -> str:
    core = local_core(cfg)
    while not core.done:
        core.step()
    return core.digest()


@pytest.mark.matrix  # slow: a coordinator replaced mid-run; the in-process resume test runs fast
@pytest.mark.parametrize("algorithm", SMOKE, ids=lambda a: a["name"])
def test_server_methods_survive_a_killed_worker_and_a_coordinator_resumed_from_a_checkpoint(
    algorithm, ray_cluster, mlflow_uri
):
    """``raysim run`` on Ray with 2 workers, one killed in round 1 and the coordinator in round 2
    (resumed from its checkpoint), ends on the digest of the 1-process run; Feddle's diagnostics
    and coefficients reach MLflow."""
    from mlflow.tracking import MlflowClient

    import raysim

    cfg = smoke_config(algorithm)
    faulty = raysim.run(
        cfg,
        [
            "workers.count=2",
            "faults.kill_worker.round=1",
            "faults.kill_worker.worker=1",
            "checkpoint.every=1",
            "faults.kill_coordinator.round=2",
        ],
    )
    assert faulty.weights_digest == in_process_digest(cfg)
    assert sum(h["worker_restarts"] for h in faulty.history) >= 1
    client = MlflowClient(mlflow_uri)
    run = client.get_run(faulty.run_id)
    assert run.data.tags["raysim.coordinator_restarts"] == "1"
    if algorithm["name"].startswith("feddle"):
        assert {"feddle_rho", "server_gflops"} <= set(run.data.metrics)
        names = {a.path for a in client.list_artifacts(faulty.run_id, "strategy")}
        assert names == {"strategy/coefficients.csv"}


PAPER = EXAMPLES / "feddle" / "paper"


@pytest.mark.parametrize("path", sorted(PAPER.glob("*-*.yaml")), ids=lambda p: p.name)
def test_paper_scale_configs_validate_for_every_method_cell_and_ablation_row(path):
    """Tables 1–5 (Feddle spec §6): each config with each method of methods.yaml, in each column,
    and the Table 3 rows on Feddle-ID and Feddle-OOD, passes the strict config."""
    import yaml

    from raysim.config import apply_overrides, load_config

    table = yaml.safe_load((PAPER / "methods.yaml").read_text())
    methods = table["methods"]
    for feddle in ("feddle_id", "feddle_ood"):  # η_fb is the reported FedBuff's η (§3.6)
        assert methods[feddle]["fallback_lr"] == methods["fedbuff"]["server_lr"]
    raw = yaml.safe_load(path.read_text())
    assert raw["algorithm"]["fallback_lr"] == methods["fedbuff"]["server_lr"]
    leaf = raw["data"]["partition"]["kind"] == "natural"
    cells = {"σ=20": {}} if leaf else table["cells"]
    for cell in cells.values():
        for algo in table["methods"].values():
            given = apply_overrides(
                {**raw, "algorithm": algo}, [f"{k}={v}" for k, v in cell.items()]
            )
            cfg = load_config(given)
            assert cfg.algorithm.name == algo["name"]
    for row in table["ablation"].values():
        for name in ("feddle", "feddle_ood"):
            cfg = load_config({**raw, "algorithm": {"name": name, **row}})
            assert cfg.algorithm.params.normalize == row["normalize"]
    cfg = load_config(raw)
    assert cfg.rounds == 200 and cfg.data.server.ood[0].size == 250_000
    assert cfg.data.hf_image.path  # a preset names its hub id
    assert load_config(cfg.to_dict()) == cfg  # a preset survives a dump and reload


def test_search_trigger_on_new_arrivals_skips_rounds_without_arrivals():
    """§2.2, A5: ``every_round`` searches whenever the atlas is non-empty; ``on_new_arrivals``
    (the spec's name; the earlier ``new_arrivals`` still reads) only in rounds where an update
    arrived. A round's search shows as its ``server_loss_before``."""
    from raysim.algorithms.feddle.method import FeddleParams

    assert FeddleParams(search_trigger="new_arrivals").search_trigger == "on_new_arrivals"
    base = {**FEDDLE, "server_epochs": 1, "server_lr": 0.01}
    seen = {}
    for trigger in ("every_round", "on_new_arrivals"):
        cfg = cfg_for(
            {**base, "search_trigger": trigger},
            rounds=10,
            id_size=32,
            delays={"kind": "half_normal", "sigma": 6.0},
            clients={"num": 20, "per_round": 2},
        )
        history = run(cfg).history
        seen[trigger] = [("server_loss_before" in h, h["clients_arrived"] > 0) for h in history]
    arrived = [a for _, a in seen["on_new_arrivals"]]
    assert arrived == [a for _, a in seen["every_round"]]  # the same schedule
    first = arrived.index(True)
    quiet = [i for i, a in enumerate(arrived) if i > first and not a]
    assert quiet  # rounds without arrivals after the atlas filled: the test can tell them apart
    assert [s for s, _ in seen["every_round"]] == [i >= first for i in range(len(arrived))]
    assert [s for s, _ in seen["on_new_arrivals"]] == arrived


@pytest.mark.parametrize(
    "switches, want",
    [
        # §3.6: FedBuff's step over the new arrivals, each in the normalised basis (‖Δ‖/ρ)
        ({}, [0.5 * 2.0 / 2, 0.0, 0.5 * 0.5 / 2]),
        # no correction: the raw FedBuff coefficient, as if the anchors were not normalised
        ({"fallback_norm_correction": False}, [0.5 / 2, 0.0, 0.5 / 2]),
        # the whole atlas, each slot once, corrected
        ({"fallback_scope": "whole_atlas"}, [0.5 * 2.0 / 3, 0.5 * 1.0 / 3, 0.5 * 0.5 / 3]),
        # A9: w(τ) = 1/√(1+τ) on each arrival (τ = 3 for slot 0, 0 for slot 2)
        ({"staleness_weight": "inv_sqrt"}, [0.5 * 0.5 * 2.0 / 2, 0.0, 0.5 * 0.5 / 2]),
    ],
    ids=["default", "no_norm_correction", "whole_atlas", "inv_sqrt"],
)
def test_the_fallback_coefficients_follow_each_switch(switches, want):
    """c' (§3.6) for an atlas of three anchors with norms 2, 1, 0.5 (ρ = 1, the median), two of
    them this round's arrivals (slots 0 and 2): each switch changes exactly its factor."""
    from raysim.algorithms.feddle.method import Feddle, FeddleParams
    from tests.test_feddle_baselines import upd

    params = FeddleParams(fallback_lr=0.5, normalize="median", **switches)
    feddle = Feddle(params, np.zeros(4, np.float32), 10)
    new = {0: upd(0, np.ones(4), tau=3), 2: upd(1, np.ones(4))}  # τ_versions 3 and 0
    c = feddle.fallback(new, arrived=2, norms=np.array([2.0, 1.0, 0.5]), rho=1.0)
    np.testing.assert_allclose(c, want, rtol=1e-12)


SHAPES = {"name": "shapes", "size": 200}


def test_theta_init_warm_continues_the_probe_and_fresh_starts_a_new_one(monkeypatch):
    """A13: ``warm`` starts each round's probe from the previous round's fitted θ (one init
    stream); ``fresh`` draws a new probe every round from a per-round stream and loads nothing."""
    import raysim.algorithms.feddle.method as feddle

    seeds: list[int] = []
    loaded: list[dict] = []
    fitted: list[dict] = []
    new_probe, load_probe, probe_state = feddle.new_probe, feddle.load_probe, feddle.probe_state

    def spy_new(in_features, classes, seed, like):
        seeds.append(seed)
        return new_probe(in_features, classes, seed, like)

    def spy_load(probe, state):
        loaded.append({k: v.copy() for k, v in state.items()})
        load_probe(probe, state)

    def spy_state(probe):
        fitted.append(probe_state(probe))
        return fitted[-1]

    monkeypatch.setattr(feddle, "new_probe", spy_new)
    monkeypatch.setattr(feddle, "load_probe", spy_load)
    monkeypatch.setattr(feddle, "probe_state", spy_state)
    algo = {"name": "feddle_ood", "server_epochs": 1, "server_lr": 1e-2}
    algo |= {"ood_samples_per_round": 64}
    for init in ("warm", "fresh"):
        seeds.clear(), loaded.clear(), fitted.clear()
        cfg = cfg_for({**algo, "theta_init": init}, rounds=4, id_size=64, ood=[SHAPES])
        run(cfg)
        assert len(seeds) >= 3, init  # a probe fitted in most rounds
        if init == "warm":
            assert len(set(seeds)) == 1
            assert len(loaded) == len(seeds) - 1  # every round after the first continues θ
            for before, after in zip(fitted, loaded, strict=False):
                for k in before:
                    np.testing.assert_array_equal(after[k], before[k])
        else:
            assert len(set(seeds)) == len(seeds) and not loaded


def test_the_reports_histories_come_from_results_json_without_mlflow(tmp_path, monkeypatch):
    """A reproduction continued from ``results.json`` alone (another session, machine): the
    per-round metrics ``reproduce.py`` kept are what ``report.py`` reads; no MLflow store."""
    import importlib
    import json
    import sys

    monkeypatch.syspath_prepend(str(EXAMPLES / "feddle"))
    for name in ("report", "reproduce"):  # another example's modules of the same names
        sys.modules.pop(name, None)
    report = importlib.import_module("report")
    row = {"run_id": "r1", "seed": 0, "history": {"accuracy": [[0, 0.1], [5, 0.5]]}}
    (tmp_path / "results.json").write_text(json.dumps({"grid/feddle_id/a": {"table": [row]}}))
    rep = report.Report(tmp_path)
    assert rep.history("r1", "accuracy") == {0: 0.1, 5: 0.5}
    assert rep.history("r1", "feddle_coef_negative_fraction") == {}
    assert not (tmp_path / "mlflow.db").exists()
    for name in ("report", "reproduce"):
        sys.modules.pop(name, None)
