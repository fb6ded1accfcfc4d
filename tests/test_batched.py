"""Client-batched local training (``raysim.training.batched``) against ``train_local`` run one
client at a time: the same batches, so the same weights up to float reassociation."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from raysim.models import DataSpec, ModelConfig
from raysim.models.handle import ModelHandle
from raysim.models.small import build_mlp
from raysim.training.batched import stacked_forward, train_batched, unbatchable
from raysim.training.chain import chain_forward, linear_chain, stacked_backward, written_out
from raysim.training.loop import train_local
from raysim.training.penalties import Proximal
from raysim.training.settings import LocalTrainingConfig
from raysim.training.tasks import ClassificationTask

#: batched kernels reassociate float32 sums; after a few steps weights agree to this
ATOL = 2e-5


class Wrapped(torch.nn.Module):
    """Not a plain Sequential: trained through ``vmap`` instead of batched matmuls."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def clients(sizes, d=10, classes=4, seed=0, wrapped=False):
    g = torch.Generator().manual_seed(seed)
    spec = DataSpec("dense", (d,), classes)
    torch.manual_seed(seed)
    base = build_mlp(ModelConfig(name="mlp", hidden=[16]), spec)
    if wrapped:
        base = Wrapped(base)
    modules = []
    for i, _ in enumerate(sizes):
        m = copy.deepcopy(base)
        with torch.no_grad():  # each client starts somewhere of its own (personal state)
            for p in m.parameters():
                p.add_(0.01 * i * torch.randn(p.shape, generator=g))
        modules.append(m)
    datas = [(torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g))
             for n in sizes]  # fmt: skip
    return modules, datas


def both(sizes, penalty=None, wrapped=False, **local):
    """Each client trained alone by ``train_local``, and all of them by ``train_batched``."""
    cfg = LocalTrainingConfig(**{"batch_size": 4, "epochs": 2, "lr": 0.05, **local})
    modules, datas = clients(sizes, wrapped=wrapped)
    alone = [copy.deepcopy(m) for m in modules]
    task = ClassificationTask()
    seq = [
        train_local(
            m, list(m.parameters()), task, d, cfg, torch.Generator().manual_seed(i), penalty
        )  # fmt: skip
        for i, (m, d) in enumerate(zip(alone, datas, strict=True))
    ]
    gens = [torch.Generator().manual_seed(i) for i in range(len(sizes))]
    starts = [list(m.parameters()) for m in modules]
    finals, bat = train_batched(ModelHandle(modules[0]), starts, task, datas, cfg, gens, penalty)
    return alone, finals, seq, bat


def assert_same(alone, finals, seq, bat):
    for a, final, s, t in zip(alone, finals, seq, bat, strict=True):
        assert t["local_steps"] == s["local_steps"]
        assert t["train_loss"] == pytest.approx(s["train_loss"], abs=1e-5)
        for p, q in zip(a.parameters(), final, strict=True):
            torch.testing.assert_close(q, p.detach(), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "local",
    [
        {"optimizer": "sgd"},
        {"optimizer": "sgd", "momentum": 0.9, "weight_decay": 1e-3},
        {"optimizer": "adam", "lr": 0.01, "weight_decay": 1e-3},
        {"optimizer": "adamw", "lr": 0.01, "weight_decay": 0.1},
        {"optimizer": "sgd", "max_grad_norm": 0.05},
        {"optimizer": "adam", "lr": 0.01, "lr_schedule": "linear"},
        {"optimizer": "sgd", "momentum": 0.5, "sampling": "independent", "max_steps": 5},
    ],
    ids=["sgd", "momentum", "adam", "adamw", "clip", "linear", "independent"],
)
@pytest.mark.parametrize("wrapped", [False, True], ids=["bmm", "vmap"])
def test_batched_clients_end_where_sequential_ones_do_with_uneven_data(local, wrapped):
    """Sizes 1–13: clients run out of batches at different steps and take no step afterwards
    (their parameters and optimiser state untouched); short last batches are padded (batched
    matmuls) or form their own group (vmap)."""
    assert stacked_forward(clients([1], wrapped=wrapped)[0][0]) is None or not wrapped
    assert_same(*both([13, 1, 7, 4, 9], wrapped=wrapped, **local))


def test_a_client_out_of_batches_keeps_its_weights_bit_for_bit():
    _, finals, _, bat = both([12, 0, 3], optimizer="adam", lr=0.01)
    assert bat[1]["local_steps"] == 0
    start, _ = clients([12, 0, 3])
    for p, q in zip(start[1].parameters(), finals[1], strict=True):
        assert torch.equal(p, q)


def test_clipping_uses_each_clients_own_norm():
    """A client with a huge gradient is clipped; the others are not pulled down with it."""
    assert_same(*both([8, 8], max_grad_norm=1.0, lr=0.1))


@pytest.mark.parametrize("wrapped", [False, True], ids=["bmm", "vmap"])
def test_a_penalty_is_each_clients_own(wrapped):
    anchor = [torch.zeros(())]

    def prox(params):
        return 0.5 * sum(((p - anchor[0]) ** 2).sum() for p in params)

    assert_same(*both([6, 10, 3], penalty=prox, wrapped=wrapped))


def test_a_proximal_penalty_batches_through_its_written_out_gradient():
    """FedProx's and Ditto's term (``Proximal``) gives each client its value and gradient
    without autograd; the batched step ends where sequential steps do, and the written-out
    gradient is autograd's."""
    start, _ = clients([1])
    centre = [p.detach() + 0.1 for p in start[0].parameters()]
    prox = Proximal(0.7, centre)
    assert_same(*both([6, 10, 3], penalty=prox))
    stacks = [torch.stack([c + 0.3 * i for i in range(3)]).requires_grad_() for c in centre]
    values, grads = prox.stacked_with_gradient([s.detach() for s in stacks])
    expected = torch.stack([prox([s[i] for s in stacks]) for i in range(3)])
    torch.testing.assert_close(values, expected.detach())
    for g, e in zip(grads, torch.autograd.grad(expected.sum(), stacks), strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("bias", [True, False])
def test_a_stacked_chain_written_out_backward_is_autograds(bias):
    """``chain.stacked_backward`` (Flatten, Linear, ReLU, Identity) = autograd on the same
    stacked forward, for any ∂loss/∂output."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(6, 5, bias=bias), torch.nn.ReLU(),
        torch.nn.Identity(), torch.nn.Linear(5, 3, bias=bias),
    )  # fmt: skip
    layers = linear_chain(module)
    assert written_out(layers)
    assert not written_out(
        linear_chain(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh()))
    )
    k = 4
    params = {n: torch.stack([p.detach() + 0.1 * torch.randn(p.shape) for _ in range(k)])
              for n, p in module.named_parameters()}  # fmt: skip
    x, up = torch.randn(k, 7, 2, 3), torch.randn(k, 7, 3)
    _, grads = stacked_backward(layers, params, x, lambda out: (None, up))
    leaves = {n: p.clone().requires_grad_() for n, p in params.items()}
    out = chain_forward(layers, leaves, x, stacked=True)
    expected = torch.autograd.grad((out * up).sum(), list(leaves.values()))
    assert set(grads) == set(leaves)
    for n, e in zip(leaves, expected, strict=True):
        torch.testing.assert_close(grads[n], e)


@pytest.mark.parametrize("local", [{}, {"lr_schedule": "linear"}], ids=["constant", "linear"])
def test_clients_whose_steps_are_capped_apart_batch_and_end_where_each_alone_does(local):
    """Devices' partial work gives each job its own max_steps: the group still trains in one
    pass, each client stopping at its own cap (its schedule over its own steps)."""
    base = LocalTrainingConfig(batch_size=4, epochs=3, lr=0.05, **local)
    caps = [None, 2, 5]
    configs = [base.model_copy(update={"max_steps": c}) for c in caps]
    modules, datas = clients([12, 12, 12])
    assert unbatchable(ModelHandle(modules[0]), ClassificationTask(), configs) == ""
    alone = [copy.deepcopy(m) for m in modules]
    task = ClassificationTask()
    seq = [train_local(m, list(m.parameters()), task, d, c, torch.Generator().manual_seed(i))
           for i, (m, d, c) in enumerate(zip(alone, datas, configs, strict=True))]  # fmt: skip
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    starts = [list(m.parameters()) for m in modules]
    finals, bat = train_batched(ModelHandle(modules[0]), starts, task, datas, configs, gens)
    assert [b["local_steps"] for b in bat] == [9.0, 2.0, 5.0]
    assert_same(alone, finals, seq, bat)
    other = configs[:2] + [base.model_copy(update={"lr": 0.1})]
    assert "differ" in unbatchable(ModelHandle(modules[0]), task, other)


def test_what_cannot_be_batched_says_why():
    model = ModelHandle(clients([3])[0][0])
    cfg = LocalTrainingConfig()
    task = ClassificationTask()
    assert unbatchable(model, task, [cfg, cfg]) == ""
    assert "differ" in unbatchable(model, task, [cfg, cfg.model_copy(update={"lr": 0.1})])
    assert "accumulation" in unbatchable(model, task, [LocalTrainingConfig(batch_size=4,
                                                        grad_accumulation=2)])  # fmt: skip
    drop = ModelHandle(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))
    assert "dropout" in unbatchable(drop, task, [cfg])
    bn = ModelHandle(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
    assert "BatchNorm" in unbatchable(bn, task, [cfg])


# ------------------------------------------------------------------ through the runtime
QUICK = ["rounds=4", "eval.every=4", "tracking.enabled=false"]
SEQUENTIAL = "workers.execution=sequential"


def quickstart(*overrides):
    from raysim.config import load_config
    from tests.conftest import EXAMPLES

    return load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides])


def finish(cfg):
    from raysim.actors.local import local_core

    core = local_core(cfg)
    while not core.done:
        core.step()
    return core


@pytest.mark.parametrize("algorithm", ["{name: fedavg}", "{name: fedprox, mu: 0.1}"])
def test_a_batched_run_ends_where_the_sequential_one_does(algorithm):
    """The quickstart (Dir(0.3) sizes 1–45, 5 epochs, momentum): 4 rounds of 10 clients in
    groups of 4, against one client after another."""
    seq = finish(quickstart(f"algorithm={algorithm}", SEQUENTIAL))
    bat = finish(quickstart(f"algorithm={algorithm}", "workers.execution=batched",
                            "workers.group_size=4"))  # fmt: skip
    assert bat.digest() != "" and np.abs(bat.weights - seq.weights).max() < 1e-5
    assert np.abs(bat.weights - seq.weights).max() > 0 or bat.digest() == seq.digest()


@pytest.mark.matrix  # suite time: tests/test_late_jobs.py runs 1 and 3 Ray workers, one killed
def test_batched_digest_is_the_same_on_1_and_3_workers_and_through_a_killed_worker(ray_cluster):
    import raysim

    cfg = quickstart("workers.execution=batched", "workers.group_size=3").to_dict()
    reference = finish(quickstart("workers.execution=batched", "workers.group_size=3")).digest()
    one = raysim.run(cfg, ["workers.count=1"])
    kill = ["workers.count=3", "workers.num_cpus=0.5"]
    kill += ["faults.kill_worker.round=1", "faults.kill_worker.worker=1"]
    three = raysim.run(cfg, kill)
    assert sum(h["worker_restarts"] for h in three.history) == 1
    assert one.weights_digest == three.weights_digest == reference


def test_batched_execution_refuses_per_client_actors_in_one_line():
    from raysim.config import ConfigError

    with pytest.raises(ConfigError, match="set workers.count to a number"):
        quickstart("workers.execution=batched", "workers.count=per_client")


def test_a_client_that_trains_its_own_way_runs_sequentially_and_says_so(capsys):
    """Local-only overrides ``train``: batched execution trains its clients one after another,
    with a one-line notice, and ends exactly where sequential execution does."""
    local = ["algorithm={name: local_only}", "rounds=2", "eval.every=2"]
    seq = finish(quickstart(*local, SEQUENTIAL))
    bat = finish(quickstart(*local, "workers.execution=batched"))
    assert bat.digest() == seq.digest()
    assert "local_only's clients train one after another" in capsys.readouterr().out


@pytest.mark.parametrize("init", ["fresh", "copy_global"])
def test_ditto_batches_its_personal_copies_and_ends_where_sequential_does(init, capsys):
    """Ditto (FedOA spec §3.7) on the quickstart MLP: the personal phase (task loss plus
    (λ/2)‖v − φ_g‖²) and the global phase each run as batched passes, the personal copies
    stacked like the global tensors."""
    ditto = [f"algorithm={{name: ditto, lambda: 0.5, personal_init: {init}}}", "rounds=3",
             "eval.every=3", "clients.num=20"]  # fmt: skip
    seq = finish(quickstart(*ditto, SEQUENTIAL))
    bat = finish(quickstart(*ditto, "workers.execution=batched", "workers.group_size=4"))
    assert "one after another" not in capsys.readouterr().out
    assert np.abs(bat.weights - seq.weights).max() < 1e-5
    a, b = seq.materialized_states(), bat.materialized_states()
    assert sorted(a) == sorted(b) and len(a) > 4
    for c in a:
        for name in a[c]:
            np.testing.assert_allclose(b[c][name], a[c][name], atol=1e-5)
    moved = [h["client_param_distance"] for h in bat.history if "client_param_distance" in h]
    assert moved and moved == pytest.approx(
        [h["client_param_distance"] for h in seq.history if "client_param_distance" in h], rel=1e-4
    )


def test_fedit_on_a_tiny_llama_batches_through_multi_lora_and_ends_where_sequential_does(
    monkeypatch,
):
    """FedIT (FedOA spec §3.1) on the FedOA smoke: 6 LoRA clients in groups of 3, each step one
    multi-LoRA pass over their concatenated batches (each padded to the group's longest)."""
    import raysim.training.batched as batched
    from raysim.config import load_config
    from tests.conftest import EXAMPLES

    groups = []
    multilora = batched._train_multilora

    def counted(model, starts, *args):
        groups.append(len(starts))
        return multilora(model, starts, *args)

    monkeypatch.setattr(batched, "_train_multilora", counted)
    over = ["algorithm={name: fedit}", "model.lora.dropout=0", "rounds=2", "eval.every=50",
            "tracking.enabled=false", "data.text.n_train=36"]  # fmt: skip
    smoke = EXAMPLES / "fedoa" / "smoke.yaml"
    seq = finish(load_config(smoke, [*over, SEQUENTIAL]))
    bat = finish(load_config(smoke, [*over, "workers.execution=batched", "workers.group_size=3"]))
    gap = np.abs(bat.weights - seq.weights).max()
    assert gap < 1e-5 and np.abs(bat.weights).max() > 0, gap
    assert groups == [3, 3, 3, 3]  # 2 rounds × 2 groups


def test_fedbaf_batches_as_its_base_method(tmp_path):
    """FedBaF's client is its base method's (FedBaF spec §2): FedAvg's clients batch."""
    from raysim.algorithms.registry import get_method

    labels = {m: get_method(m).batching for m in ("fedavg", "fedbaf", "ditto", "fedoa", "fedot")}
    assert labels == {
        "fedavg": "one pass",
        "fedbaf": "one pass (its own)",
        "ditto": "one pass (its own)",
        "fedoa": "one after another",
        "fedot": "one pass (its own)",
    }
    client = get_method("fedbaf").build_client({"base": "fedavg", "foundation": str(tmp_path)})
    model = ModelHandle(clients([3])[0][0])
    assert client.unbatchable([_ctx(model)]) == ""


def _ctx(model):
    from raysim.algorithms.base import ClientContext

    data = (torch.zeros(3, 10), torch.zeros(3, dtype=torch.long))
    return ClientContext(model, ClassificationTask(), data, LocalTrainingConfig(),
                         torch.Generator(), 0, 0)  # fmt: skip


def test_a_lora_classifier_on_a_transformer_runs_one_after_another_and_says_why(capsys):
    """``lm_classifier`` (a LoRA LLaMA with a head) cannot run under ``vmap``: batched execution
    trains its clients one after another, with the same digest."""
    from raysim.config import load_config
    from tests.conftest import EXAMPLES

    over = ["algorithm={name: fedavg}", "rounds=1", "clients.num=3", "clients.per_round=3",
            "tracking.enabled=false", "eval.every=1", "data.max_tokens=16"]  # fmt: skip
    fm = EXAMPLES / "fedot" / "fm-mini.yaml"
    seq = finish(load_config(fm, [*over, SEQUENTIAL]))
    bat = finish(load_config(fm, [*over, "workers.execution=batched"]))
    assert bat.digest() == seq.digest()
    assert "does not run under vmap" in capsys.readouterr().out
