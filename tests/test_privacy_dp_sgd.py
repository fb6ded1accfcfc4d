"""Sample-level DP-SGD inside a client (``local.dp_sgd``): per-example gradients against Opacus's,
the clip and the noise of a step, batched groups against one client at a time, the per-client
accountant against dp-accounting, and what a run refuses."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import rdp_privacy_accountant
from torch import nn

from raysim.config import ConfigError, load_config
from raysim.errors import PrivacyError
from raysim.privacy.sample_level import SampleLevelLedger
from raysim.training.chain import linear_chain
from raysim.training.dp_sgd import PerExampleClip, chain_of, clipped_sum
from raysim.training.loop import train_local
from raysim.training.settings import LocalTrainingConfig
from raysim.training.tasks import ClassificationTask
from tests.conftest import EXAMPLES

X = torch.randn(60, 8, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (60,), generator=torch.Generator().manual_seed(1))
BASE = {"sampling": "independent", "epochs": 2, "batch_size": 10, "lr": 0.1}


def mlp(seed: int = 1) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))


def cnn(seed: int = 1) -> nn.Module:
    """Convolutions with and without a bias, stride 2, padding 1, dilation 2, a pool."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(4, 6, 3, padding=1, dilation=2, bias=False), nn.MaxPool2d(2), nn.Tanh(),
        nn.Flatten(), nn.Linear(6 * 2 * 2, 3),
    )  # fmt: skip


IMAGES = torch.randn(60, 2, 12, 12, generator=torch.Generator().manual_seed(2))
#: model, its inputs, a clip some examples' gradients are over and some under
MODELS = {"mlp": (mlp, X, 2.0), "cnn": (cnn, IMAGES, 1.7)}


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def trained(cfg: LocalTrainingConfig, data=(X, Y), seed: int = 3, penalty=None):
    m = mlp()
    out = train_local(m, list(m.parameters()), ClassificationTask(), data, cfg,
                      torch.Generator().manual_seed(seed), penalty)  # fmt: skip
    return flat(m), out


# ----------------------------------------------------------------- per-example gradients
@pytest.mark.parametrize("name", MODELS)
def test_per_example_gradients_equal_opacus_grad_sample(name):
    """``vmap``'s per-example gradients, and the clipped sum of the layers' rule (outer
    products; unfolded convolutions), against Opacus's ``GradSampleModule``."""
    from opacus import GradSampleModule

    make, x, clip = MODELS[name]
    model = make()
    clipper = PerExampleClip(model, list(model.parameters()), ClassificationTask(), clip)
    ours, losses = clipper.per_example((x[:12], Y[:12]))
    reference = GradSampleModule(make(), loss_reduction="sum")
    loss = nn.functional.cross_entropy(reference(x[:12]), Y[:12], reduction="sum")
    loss.backward()
    theirs = [p.grad_sample for p in reference._module.parameters()]
    for mine, other in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, other, rtol=1e-5, atol=1e-6)
    full = nn.functional.cross_entropy(make()(x[:12]), Y[:12], reduction="none")
    torch.testing.assert_close(losses, full.detach())
    assert clipper.chain is not None
    rule, _ = clipper((x[:12], Y[:12]))
    for mine, other in zip(rule, clipped_sum(theirs, clip), strict=True):
        torch.testing.assert_close(mine, other, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_the_three_ways_to_a_clipped_sum_give_the_same_numbers(name):
    """The layers' rule of a chain (this MLP's and this CNN's default), per-example gradients by
    ``vmap``, and example by example (a transformers model's way) agree."""
    make, x, clip = MODELS[name]
    model = make()
    clipper = PerExampleClip(model, list(model.parameters()), ClassificationTask(), clip)
    assert clipper.chain is not None
    chain, chain_loss = clipper((x[:10], Y[:10]))
    clipper.chain = None  # the vmap path
    fast, fast_loss = clipper((x[:10], Y[:10]))
    clipper.by_example = True  # the path a transformers model takes
    slow, slow_loss = clipper((x[:10], Y[:10]))
    for a, b, c in zip(chain, fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(chain_loss, fast_loss)
    torch.testing.assert_close(fast_loss, slow_loss)
    # some examples are clipped, some not: the rule is exercised on both sides of C
    norms = torch.stack([g.reshape(10, -1).pow(2).sum(1) for g in clipper.per_example(
        (x[:10], Y[:10]))[0]]).sum(0).sqrt()  # fmt: skip
    assert bool((norms > clip).any()) and bool((norms < clip).any())


def test_which_convolutional_models_take_the_layers_rule():
    """One client's CNN takes the unfold rule (a batched group's stacked chain takes no
    convolution); grouped or reflect-padded convolutions, or "same" padding that pads one side
    more, take ``vmap``, with the same numbers as the rule where both apply."""
    params = list(cnn().parameters())
    assert linear_chain(cnn()) is None  # batched.stacked_forward's walk
    assert linear_chain(nn.Sequential(nn.MaxPool2d(2), nn.Flatten())) is None
    assert chain_of(cnn(), params, ClassificationTask()) is None  # batched._PrivateGroup's
    assert [k for k, *_ in linear_chain(cnn(), convolutions=True)].count("conv") == 2
    same = nn.Sequential(nn.Conv2d(2, 3, 3, padding="same"), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(12, 3))  # fmt: skip
    assert linear_chain(same, convolutions=True)[0][4] == (1, 1)
    for odd in (nn.Conv2d(2, 4, 3, groups=2), nn.Conv2d(2, 4, 3, padding_mode="reflect"),
                nn.Conv2d(2, 4, 2, padding="same")):  # fmt: skip
        assert linear_chain(nn.Sequential(odd, nn.Flatten()), convolutions=True) is None
    clipper = PerExampleClip(same, list(same.parameters()), ClassificationTask(), 0.1)
    assert clipper.chain is not None
    rule, _ = clipper((IMAGES[:10], Y[:10]))
    clipper.chain = None
    for a, b in zip(rule, clipper((IMAGES[:10], Y[:10]))[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_batchnorm_is_refused_naming_it():
    model = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="BatchNorm"):
        PerExampleClip(model, list(model.parameters()), ClassificationTask(), 1.0)


# ----------------------------------------------------------------- one step, by hand
def by_hand_step(clip: float) -> torch.Tensor:
    """One DP-SGD step of SGD at lr 1, z = 0, on the batch the client draws first: the mean of
    the examples' gradients, each clipped to ``clip`` (Abadi et al. 2016, Alg. 1)."""
    model = mlp()
    index = torch.randperm(60, generator=torch.Generator().manual_seed(3))[:10]
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in index.tolist():
        loss = nn.functional.cross_entropy(model(X[i : i + 1]), Y[i : i + 1])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        factor = min(1.0, clip / (float(norm) + 1e-6))
        for t, g in zip(total, grads, strict=True):
            t += g * factor
    return flat(model) - torch.cat([t.flatten() for t in total]) / 10


@pytest.mark.parametrize("clip", [0.05, 1e9])
def test_a_step_is_the_mean_of_clipped_example_gradients(clip):
    cfg = LocalTrainingConfig(**BASE | {"lr": 1.0, "max_steps": 1},
                              dp_sgd={"clip": clip, "noise_multiplier": 0.0})  # fmt: skip
    got, out = trained(cfg)
    torch.testing.assert_close(got, by_hand_step(clip), rtol=1e-5, atol=1e-6)
    assert out["dp_sgd_steps"] == 1.0


def test_with_no_noise_and_no_clip_it_trains_as_without_dp():
    plain, _ = trained(LocalTrainingConfig(**BASE))
    private, out = trained(
        LocalTrainingConfig(**BASE, dp_sgd={"clip": 1e9, "noise_multiplier": 0.0})
    )
    torch.testing.assert_close(private, plain, rtol=1e-5, atol=1e-6)  # the same batches too
    assert out["dp_sgd_steps"] == out["local_steps"] == 12.0


def test_the_noise_has_std_z_c_over_the_batch():
    """A zero-gradient model (all weights 0, so every example's gradient is the same bias term
    clipped to 0 norm here by C tiny): the step is then the noise alone, std z·C/b."""
    z, c, b = 2.0, 1e-3, 10
    cfg = LocalTrainingConfig(**BASE | {"lr": 1.0, "max_steps": 1, "batch_size": b},
                              dp_sgd={"clip": c, "noise_multiplier": z})  # fmt: skip
    wide = nn.Linear(8, 3000)
    nn.init.zeros_(wide.weight)
    nn.init.zeros_(wide.bias)
    data = (X, torch.randint(0, 3000, (60,), generator=torch.Generator().manual_seed(4)))
    train_local(wide, list(wide.parameters()), ClassificationTask(), data, cfg,
                torch.Generator().manual_seed(5))  # fmt: skip
    step = flat(wide)  # = −(clipped mean + noise/b); the clipped part is ≤ C/b = 1e-4 in norm
    assert step.numel() == 27000
    assert float(step.std()) == pytest.approx(z * c / b, rel=0.03)
    # not the same noise for another job's seed
    again = nn.Linear(8, 3000)
    nn.init.zeros_(again.weight)
    nn.init.zeros_(again.bias)
    train_local(again, list(again.parameters()), ClassificationTask(), data, cfg,
                torch.Generator().manual_seed(6))  # fmt: skip
    assert not torch.equal(flat(again), step)


# ----------------------------------------------------------------- batched groups
@pytest.mark.parametrize("rule", ["outer product", "nested vmap"])
def test_a_batched_group_trains_each_client_as_alone(rule, monkeypatch):
    from types import SimpleNamespace

    from raysim.training import batched
    from raysim.training.batched import train_batched

    if rule == "nested vmap":  # the path of any model that is not a linear chain
        monkeypatch.setattr(batched, "chain_of", lambda *a: None)

    cfg = LocalTrainingConfig(**BASE | {"momentum": 0.9},
                              dp_sgd={"clip": 0.3, "noise_multiplier": 0.7})  # fmt: skip
    sizes = [12, 7, 25]  # the 7-example client takes batches of 7: a group of its own
    offsets = np.cumsum([0, *sizes])
    datas = [(X[a:e], Y[a:e]) for a, e in zip(offsets[:-1], offsets[1:], strict=True)]

    def penalty(ps):
        return 0.01 * sum((p**2).sum() for p in ps)

    model = mlp()
    start = [p.detach().clone() for p in model.parameters()]
    handle = SimpleNamespace(module=model, global_parameters=lambda: list(model.parameters()))
    finals, metrics = train_batched(handle, [start] * 3, ClassificationTask(), datas, cfg,
                                    [torch.Generator().manual_seed(10 + i) for i in range(3)],
                                    penalty)  # fmt: skip
    for i, data in enumerate(datas):
        alone, out = trained(cfg, data, seed=10 + i, penalty=penalty)
        torch.testing.assert_close(torch.cat([t.flatten() for t in finals[i]]), alone,
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        assert metrics[i]["dp_sgd_steps"] == out["dp_sgd_steps"] == out["local_steps"]


# ----------------------------------------------------------------- the accountant
def test_the_ledger_is_dp_accountings_bound_for_the_smallest_client_and_most_steps():
    ledger = SampleLevelLedger(batch_size=10, noise_multiplier=1.1, delta=1e-5)
    assert ledger.epsilon() == 0.0
    ledger.record(0, 200, {"dp_sgd_steps": 40})
    ledger.record(1, 50, {"dp_sgd_steps": 10})
    ledger.record(0, 200, {"dp_sgd_steps": 40})
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        50, 10, dp_accounting.GaussianDpEvent(0.55)
    )
    accountant.compose(event, 80)  # client 1's rate (10 of 50), client 0's 80 steps
    assert ledger.epsilon() == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    # an upper bound on each client's own ε
    own = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    own.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(
            200, 10, dp_accounting.GaussianDpEvent(0.55)
        ),
        80,
    )
    assert own.get_epsilon(1e-5) < ledger.epsilon()
    restored = SampleLevelLedger(10, 1.1, 1e-5)
    restored.load_state_dict(ledger.state_dict())
    assert restored.epsilon() == ledger.epsilon()
    unnoised = SampleLevelLedger(10, 0.0, 1e-5)
    assert unnoised.epsilon() == 0.0  # no step yet
    unnoised.record(0, 50, {"dp_sgd_steps": 1})
    assert math.isinf(unnoised.epsilon())


def test_an_update_trained_without_dp_sgd_is_an_error_naming_the_client():
    ledger = SampleLevelLedger(10, 1.0, 1e-5)
    with pytest.raises(PrivacyError, match="client 4.*without DP-SGD"):
        ledger.record(4, 30, {"train_loss": 1.0})


# ----------------------------------------------------------------- a run
QUICK = ["rounds=2", "eval.every=2", "tracking.enabled=false", "local.sampling=independent",
         "local.epochs=1"]  # fmt: skip
DP = "local.dp_sgd={clip: 1.0, noise_multiplier: 1.0}"


def run(*overrides: str):
    from raysim.actors.local import local_core

    core = local_core(load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides]))
    while not core.done:
        core.step()
    return core


def test_a_run_reports_the_worst_clients_epsilon_and_is_deterministic():
    a = run(DP)
    m = a.final_metrics()
    assert m["dp_sgd_epsilon"] > 0 and m["dp_sgd_max_steps"] > 0
    assert "dp_epsilon" not in m  # no user-level privacy asked
    sizes = [a.client_sizes[c] for c in a.stats]
    steps = max(s for s in a.strategy.sample_level.steps.values())
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    n = min(sizes)
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        n, min(10, n), dp_accounting.GaussianDpEvent(0.5)), steps)  # fmt: skip
    assert m["dp_sgd_epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    b = run(DP, "workers.execution=sequential")  # one client after another: the same numbers
    np.testing.assert_allclose(b.weights, a.weights, rtol=1e-4, atol=1e-6)
    assert run(DP).digest() == a.digest()  # the same seed, the same bits
    plain = run()
    assert not np.allclose(plain.weights, a.weights, atol=1e-3)


def test_a_method_that_trains_its_own_way_is_refused_in_one_line():
    """Before Ray starts (the config: a dry run and a sweep see it too), from the method's spec,
    which registration holds to its client's ``trains_privately``."""
    with pytest.raises(ConfigError, match="ditto's client trains its own way"):
        load_config(EXAMPLES / "quickstart.yaml", [*QUICK, DP, "algorithm.name=ditto"])
    from raysim.algorithms.registry import ALGORITHMS, get_method, method_spec

    for name in ALGORITHMS.names():  # every built-in spec agrees with its client
        assert method_spec(name).own_training != get_method(name).client.trains_privately()


@pytest.mark.parametrize(
    "override, cause",
    [
        ("local.sampling=epochs", "local.sampling independent"),
        ("local.backend=accelerate", "local.backend torch"),
        ("local.max_grad_norm=1.0", "no local.max_grad_norm"),
    ],
)
def test_settings_dp_sgd_cannot_account_are_refused(override, cause):
    with pytest.raises(ConfigError, match=cause):
        load_config(EXAMPLES / "quickstart.yaml", [*QUICK, DP, override])


@pytest.mark.slow
def test_dp_sgd_runs_resume_to_the_same_bits_and_epsilon():
    from tests.conftest import resumed_through_checkpoint

    overrides = [DP, "rounds=4", "privacy.mode=central", "privacy.noise_multiplier=0.5"]
    whole = run(*overrides)
    cfg = load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides])
    resumed, _ = resumed_through_checkpoint(cfg, 2)
    assert resumed.digest() == whole.digest()
    for key in ("dp_sgd_epsilon", "dp_sgd_max_steps", "dp_epsilon"):  # both accounts
        assert resumed.history[-1][key] == whole.history[-1][key]


@pytest.mark.matrix  # suite time: two runs on a Ray pool
def test_dp_sgd_gives_the_same_bits_on_2_and_4_ray_workers_and_through_a_kill(ray_cluster):
    """Each client's DP-SGD noise comes from its job's seed, whichever worker trains it and
    whichever group it trains in: 2 workers, and 4 with one killed in round 1, end with the
    in-process run's weights and ε."""
    import raysim

    sgd = [DP, "workers.group_size=3"]
    ref = run(*sgd)
    on_ray = [*QUICK, *sgd, "runtime=ray", "workers.transport=calls"]
    two = raysim.run(EXAMPLES / "quickstart.yaml", [*on_ray, "workers.count=2"])
    kill = ["workers.count=4", "workers.num_cpus=0.5", "faults.kill_worker.round=1",
            "faults.kill_worker.worker=1"]  # fmt: skip
    four = raysim.run(EXAMPLES / "quickstart.yaml", [*on_ray, *kill])
    assert sum(h["worker_restarts"] for h in four.history) == 1
    assert ref.digest() == two.weights_digest == four.weights_digest
    for r in (two, four):
        assert r.metrics["dp_sgd_epsilon"] == ref.history[-1]["dp_sgd_epsilon"]
