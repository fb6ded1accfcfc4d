"""The method interface of issue 8: server context, parameter groups and buffers, side channels,
private state through ``state_dict``, composable hooks and plugin methods."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml

import raysim
from raysim.actors.executor import InProcessExecutor
from raysim.actors.local import local_core
from raysim.algorithms.base import Update
from raysim.algorithms.context import ServerContext
from raysim.algorithms.general.fedadam import FedAdam
from raysim.algorithms.general.fedavg import FedAvg
from raysim.algorithms.general.fedopt import FedOptParams
from raysim.algorithms.hooks import ComposedStrategy
from raysim.algorithms.interface import INTERFACE_VERSION, InterfaceError
from raysim.algorithms.private import PrivateStateError, PrivateTensors
from raysim.algorithms.registry import MIXERS
from raysim.config import ConfigError, load_config
from raysim.models.layout import BUFFERS, SHARED
from raysim.state import checkpoint
from tests.conftest import ROOT, fresh_cli, tiny

PLUGINS = ROOT / "tests" / "plugins"
PLUGIN = PLUGINS / "echo_method.py"


def run_local(cfg, rounds=None):
    core = local_core(cfg)
    while not core.done and (rounds is None or core.round < rounds):
        core.step()
    return core


def upd(client, delta, n=10, base=None, k=0):
    delta = np.asarray(delta, dtype=np.float32)
    base = np.zeros_like(delta) if base is None else base
    return Update(client, delta, n, k, 0, k + 0.5, k, 0, base)


# --------------------------------------------------------------------------- server context
def test_server_streams_are_named_and_seeded():
    a, b = ServerContext.minimal(7, 3, 4), ServerContext.minimal(7, 3, 4)
    assert a.rng("x").random() == b.rng("x").random()
    assert a.rng("x").random() != a.rng("y").random()
    assert ServerContext.minimal(8, 3, 4).rng("x").random() != a.rng("x").random()


def test_server_data_id_split_is_carved_from_the_test_split():
    cfg = load_config(tiny(data={"name": "digits", "server": {"id_size": 30, "ood": [{}]}}))
    core = local_core(cfg)
    plain = local_core(load_config(tiny()))
    ctx = core.server
    assert len(ctx.data.id) == 30 and ctx.data.id.num_classes == 10
    assert len(ctx.data.ood["shapes"]) == 1000 and ctx.data.ood["shapes"].num_classes == 4
    assert plain.server.data.id is None
    # the evaluation set is the rest of the test split
    from raysim.data import build_federated_dataset

    with_id = build_federated_dataset(cfg.data, 20, cfg.seed)
    without = build_federated_dataset(load_config(tiny()).data, 20, 3)
    assert len(with_id.y_test) + 30 == len(without.y_test)
    rows = {r.tobytes() for r in without.x_test}
    assert all(r.tobytes() in rows for r in with_id.server_id[0])
    with pytest.raises(ConfigError, match="id_size"):
        load_config(tiny(data={"name": "digits", "server": {"id_siz": 3}}))


def test_server_wall_seconds_and_server_metrics_are_logged():
    cfg = load_config(
        tiny(
            rounds=2,
            algorithm={"name": "center", "server_epochs": 2},
            data={"name": "digits", "server": {"id_size": 40}},
        )
    )
    core = run_local(cfg)
    assert core.history[0]["server_wall_s"] > 0
    assert np.isfinite(core.history[0]["server_train_loss"])


# --------------------------------------------------------------------------- groups and buffers
def test_batchnorm_buffers_travel_in_the_global_vector():
    cfg = load_config(
        tiny(model={"name": "cnn", "channels": [4], "hidden": [16], "batch_norm": True}, rounds=2)
    )
    core = run_local(cfg)
    layout = core.server.layout
    assert layout.groups == [SHARED, BUFFERS]
    names = [t.name for t in layout.select(BUFFERS)]
    assert any("running_mean" in n for n in names) and any("num_batches" in n for n in names)
    mean = layout.mask(BUFFERS, "running_mean")
    assert np.abs(core.weights[mean]).sum() > 0  # the clients' statistics reached the server
    # an integer buffer is averaged like the rest on the server, and loads rounded on a client
    handle = core.executor.runner.model
    handle.set_global(core.weights)
    tracked = dict(handle.module.named_buffers())[[n for n in names if "num_batches" in n][0]]
    assert tracked.dtype.is_floating_point is False and int(tracked) > 0


def test_personal_group_on_a_plain_module_never_leaves_the_client():
    from torch import nn

    from raysim.models.handle import ModelHandle
    from raysim.models.layout import ParamGroup

    module = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    h = ModelHandle(module, (ParamGroup("body", "shared"), ParamGroup("head", "personal", r"^2\.")))
    assert [t.name for t in h.layout().tensors] == ["0.weight", "0.bias"]
    assert sorted(h.get_state()) == ["2.bias", "2.weight"]
    first = h.get_state()
    h.set_group("head", np.ones(10, dtype=np.float32))
    h.set_state(None, seed=0)  # a first visit starts from the built values
    np.testing.assert_array_equal(h.get_state()["2.weight"], first["2.weight"])


# --------------------------------------------------------------------------- side channels
def test_side_channels_round_trip_and_are_counted():
    cfg = load_config(tiny(rounds=3, algorithm={"name": "echo", "module": str(PLUGIN)}))
    plain = run_local(load_config(tiny(rounds=3)))
    core = run_local(cfg)
    h = core.history[-1]
    assert core.strategy.received == 15 and core.strategy.mismatches == 0
    assert h["echo_mismatches"] == 0
    per_job_down = 4 * 4 + 2 * 4  # probe (4 floats) + own (2 floats)
    per_job_up = 4 * 4 + 2 * 4  # echo + own_echo
    assert h["bytes_down"] == plain.history[-1]["bytes_down"] + 5 * per_job_down
    assert h["bytes_up"] == plain.history[-1]["bytes_up"] + 5 * per_job_up


# --------------------------------------------------------------------------- private state
class SpyExecutor(InProcessExecutor):
    """Records every byte that would travel to a worker."""

    def __init__(self, runner):
        super().__init__(runner)
        self.payloads: list[bytes] = []

    def put(self, value):
        self.payloads.append(pickle.dumps(value))
        return super().put(value)

    def submit(self, handle, jobs):
        self.payloads.append(pickle.dumps(jobs))
        super().submit(handle, jobs)


def test_private_state_never_reaches_a_payload_and_resumes(tmp_path):
    raw = tiny(
        rounds=5,
        algorithm={"name": "echo", "module": str(PLUGIN)},
        delays={"kind": "half_normal", "sigma": 1.5},
    )
    cfg = load_config(raw)
    spy_core = local_core(cfg)
    spy = SpyExecutor(spy_core.executor.runner)
    spy_core.executor = spy
    while not spy_core.done:
        spy_core.step()
    secret = np.asarray(spy_core.strategy.secret["w"])
    blob = secret.tobytes()
    assert spy.payloads and not any(blob[:64] in p for p in spy.payloads)
    with pytest.raises(PrivateStateError):
        pickle.dumps(spy_core.strategy.secret)
    # checkpoint after round 2 (the secret is rebuilt by setup), resume, same end
    half = run_local(cfg, rounds=2)
    state = half.state_dict()
    assert "secret" not in state["strategy"] and not state["strategy_private"]
    files = checkpoint.pack({"core": state}, cfg, 2)
    assert blob[:64] not in files[checkpoint.STATE] + files[checkpoint.ARRAYS]
    _, loaded = checkpoint.unpack(files)
    resumed = local_core(cfg)
    resumed.load_state_dict(loaded["core"])
    while not resumed.done:
        resumed.step()
    assert resumed.digest() == spy_core.digest()


def test_persisted_private_state_goes_to_its_own_file_only(tmp_path):
    cfg = load_config(
        tiny(rounds=3, algorithm={"name": "echo", "module": str(PLUGIN), "persist": True})
    )
    full = run_local(cfg)
    half = run_local(cfg, rounds=1)
    state = half.state_dict()
    private = state.pop("strategy_private")
    files = checkpoint.pack({"core": state}, cfg, 1, private=private)
    blob = np.asarray(half.strategy.secret["w"]).tobytes()[:64]
    assert blob in files[checkpoint.PRIVATE]
    assert blob not in files[checkpoint.STATE] + files[checkpoint.ARRAYS]
    _, loaded = checkpoint.unpack(files)
    resumed = local_core(cfg)
    resumed.load_state_dict({**loaded["core"], "strategy_private": loaded["private"]})
    while not resumed.done:
        resumed.step()
    assert resumed.digest() == full.digest()
    writer = checkpoint.Checkpointer(load_config(tiny(checkpoint={"every": 1})), tracker=object())
    with pytest.raises(RuntimeError, match="checkpoint.dir"):
        writer.save({"core": state}, 1, private)


def test_private_tensors_refuse_every_serialiser():
    import copy

    p = PrivateTensors({"w": np.ones(3)})
    assert float(p["w"].sum()) == 3 and "withheld" in repr(p)
    for dump in (pickle.dumps, copy.deepcopy):
        with pytest.raises(PrivateStateError):
            dump(p)
    with pytest.raises(ValueError):
        p["w"][0] = 2  # read-only


# --------------------------------------------------------------------------- mixers
def test_damp_mixer_composed_on_fedavg():
    w0 = np.array([1.0, 2.0], dtype=np.float32)
    mixed = ComposedStrategy(FedAvg(None, w0, 2), [MIXERS.get("damp").build({"mu": 0.25})])
    plain = FedAvg(None, w0, 2)
    for s in (mixed, plain):
        s.on_arrival(upd(0, [1.0, 1.0]))
        s.on_arrival(upd(1, [3.0, -1.0]))
        assert s.on_round_end(0)
    np.testing.assert_allclose(mixed.weights, 0.75 * plain.weights + 0.25 * w0, rtol=1e-6)


def test_mixer_on_fedadam_keeps_moments_from_client_deltas_only():
    w0 = np.zeros(3, dtype=np.float32)
    p = FedOptParams(server_lr=0.1)
    clip = MIXERS.get("clip_step").build({"max_norm": 0.05})
    mixed, plain = ComposedStrategy(FedAdam(p, w0, 2), [clip]), FedAdam(p, w0, 2)
    for k in range(3):
        for s in (mixed, plain):
            prev = s.weights
            s.on_arrival(upd(0, [1.0, -2.0, 0.5], k=k))
            s.on_round_end(k)
            if s is mixed:
                assert np.linalg.norm(s.weights - prev) <= 0.05 + 1e-6
    np.testing.assert_array_equal(mixed.base.m, plain.m)  # the mix never enters the moments
    np.testing.assert_array_equal(mixed.base.v, plain.v)
    assert not np.array_equal(mixed.weights, plain.weights)
    assert mixed.metrics()["clip_step_clipped"] == 3


def test_server_hooks_from_config_and_resume(tmp_path):
    raw = tiny(
        rounds=4,
        algorithm={"name": "fedadam", "server_lr": 0.05},
        hooks={"server": [{"name": "damp", "mu": 0.5}, {"name": "clip_step"}]},
    )
    cfg = load_config(raw)
    assert [h.name for h in cfg.hooks.server] == ["damp", "clip_step"]
    with pytest.raises(ConfigError, match="did you mean 'damp'"):
        load_config(tiny(hooks={"server": [{"name": "dump"}]}))
    with pytest.raises(ConfigError, match="did you mean 'mu'"):
        load_config(tiny(hooks={"server": [{"name": "damp", "muu": 1}]}))
    full = run_local(cfg)
    bare = run_local(load_config(tiny(rounds=4, algorithm={"name": "fedadam", "server_lr": 0.05})))
    assert full.digest() != bare.digest()
    half = run_local(cfg, rounds=2)
    _, loaded = checkpoint.unpack(checkpoint.pack({"core": half.state_dict()}, cfg, 2))
    resumed = local_core(cfg)
    resumed.load_state_dict(loaded["core"])
    while not resumed.done:
        resumed.step()
    assert resumed.digest() == full.digest()


# --------------------------------------------------------------------------- client behaviours
def test_label_shuffle_changes_only_the_chosen_client():
    def deltas(hooks):
        cfg = load_config(tiny(rounds=1, hooks={"clients": hooks}))
        core = local_core(cfg)
        seen = {}
        orig = core.strategy.on_arrival
        core.strategy.on_arrival = lambda u: (seen.__setitem__(u.client_id, u.delta), orig(u))[1]
        core.step()
        return seen

    clean = deltas([])
    attacked = deltas([{"name": "label_shuffle", "clients": [sorted(clean)[0]]}])
    victim = sorted(clean)[0]
    assert not np.array_equal(clean[victim], attacked[victim])
    for c in clean:
        if c != victim:
            np.testing.assert_array_equal(clean[c], attacked[c])


def test_corrupt_behaviour_equals_the_fault_it_generalises():
    via_hook = run_local(
        load_config(
            tiny(
                rounds=3,
                hooks={
                    "clients": [
                        {
                            "name": "corrupt",
                            "clients": list(range(20)),
                            "rounds": [1],
                            "value": "inf",
                        }
                    ]
                },
            )
        )
    )
    via_fault = run_local(
        load_config(
            tiny(
                rounds=3,
                faults={
                    "corrupt_updates": [
                        {"client": c, "round": 1, "value": "inf"} for c in range(20)
                    ]
                },
            )
        )
    )
    assert via_hook.digest() == via_fault.digest()
    assert via_hook.totals["rejected_updates"] == via_fault.totals["rejected_updates"] > 0


def test_scale_update_boosts_the_delta():
    def first(hooks):
        core = local_core(load_config(tiny(rounds=1, hooks={"clients": hooks})))
        got = []
        orig = core.strategy.on_arrival
        core.strategy.on_arrival = lambda u: (got.append(u), orig(u))[1]
        core.step()
        return {u.client_id: u.delta for u in got}

    a, b = first([]), first([{"name": "scale_update", "factor": 3.0}])
    for c in a:
        np.testing.assert_allclose(b[c], 3 * a[c], rtol=1e-6)


# --------------------------------------------------------------------------- plugins
def test_config_is_validated_once_per_process():
    from raysim.config import config_from_wire

    wire = load_config(tiny(algorithm={"name": "echo", "module": str(PLUGIN)})).to_dict()
    first = config_from_wire(wire)
    assert config_from_wire(dict(reversed(list(wire.items())))) is first  # key order is moot
    assert config_from_wire({**wire, "seed": 4}) is not first


def test_plugin_module_errors_are_clear():
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tiny(algorithm={"name": "x", "module": "./nope.py"}))
    with pytest.raises(ConfigError, match="cannot be imported"):
        load_config(tiny(algorithm={"name": "x", "module": "no_such_pkg.mod"}))


@pytest.mark.matrix  # suite time (~16 s on 2 vCPUs): the fast suite's budget
@pytest.mark.slow
def test_plugin_method_runs_on_ray_workers_from_a_fresh_process(tmp_path):
    """A method module known only through ``algorithm.module`` is registered in the driver, the
    coordinator and every worker (a fresh interpreter, a real Ray)."""
    script = textwrap.dedent(
        f"""
        import raysim
        cfg = {tiny(rounds=2, algorithm={"name": "echo", "module": str(PLUGIN)})!r}
        cfg["tracking"] = {{"enabled": False}}
        res = raysim.run(cfg)
        h = res.history[-1]
        print("RESULT", h["echo_received"], h["echo_mismatches"])
        """
    )
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")][0]
    assert line.split()[1:] == ["10.0", "0.0"]


def test_entry_point_plugin_is_found_in_a_fresh_process(tmp_path):
    pkg = tmp_path / "raysim_ep_demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        from raysim.algorithms import Method, register
        from raysim.algorithms.general.fedavg import FedAvg
        register(Method(name="ep_demo", strategy=FedAvg, reference="entry point test"))
    """)
    )
    dist = tmp_path / "raysim_ep_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: raysim-ep-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[raysim.methods]\nep_demo = raysim_ep_demo\n")
    code = "from raysim.algorithms import get_method; print(get_method('ep_demo').reference)"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "entry point test"


def test_registering_a_different_method_under_a_taken_name_fails():
    from raysim.algorithms import Method, register
    from raysim.algorithms.base import Strategy

    class Other(Strategy):
        pass

    with pytest.raises(ValueError, match="registered twice"):
        register(Method(name="fedavg", strategy=Other))


def test_every_builtin_implementation_agrees_with_its_torch_free_spec():
    """A config is checked against the specs (``*/params.py``); the workers build from the
    implementations. Each built-in method and hook must be what its spec says, registered by the
    module the spec names."""
    import dataclasses
    import sys

    from raysim.algorithms.registry import BEHAVIOURS, MIXERS, get_method, method_names, method_spec

    # the built-ins only: a user's module another test of this process registered is not one
    builtin = [n for n in method_names() if method_spec(n).module.startswith("raysim.")]
    assert len(builtin) >= 29
    for name in builtin:
        spec, method = method_spec(name), get_method(name)
        assert dataclasses.replace(method.spec, module=spec.module) == spec, name
        assert any(v is method for v in vars(sys.modules[spec.module]).values()), name
    for registry in (MIXERS, BEHAVIOURS):
        for name in registry.names():
            spec, hook = registry.spec(name), registry.get(name)
            if not spec.module.startswith("raysim."):
                continue
            assert (hook.params, hook.reference) == (spec.params, spec.reference), name
            assert hook.cls.__module__ == spec.module, name


def test_a_spec_that_misstates_its_client_is_refused():
    """``Method.of`` checks the spec's ``batchable`` and ``own_training`` against the client
    class, so a config never plans batched training, or allows DP-SGD, for a client that trains
    its own way."""
    from raysim.algorithms import Method
    from raysim.algorithms.fedoa.personal import FedOAClient
    from raysim.algorithms.general.fedavg import FedAvg
    from raysim.algorithms.spec import MethodSpec

    with pytest.raises(ValueError, match="batchable=True"):
        Method.of(MethodSpec("mine", "m", batchable=True, sums=True), FedAvg, client=FedOAClient)
    with pytest.raises(ValueError, match="own_training=False"):  # DP-SGD would be allowed
        Method.of(MethodSpec("mine", "m", batchable=False, sums=True), FedAvg, client=FedOAClient)
    assert Method.of(
        MethodSpec("mine", "m", batchable=False, sums=True, own_training=True), FedAvg,
        client=FedOAClient,
    )  # fmt: skip


def test_a_client_that_says_trains_together_itself_is_refused():
    """``trains_together`` is read from the params, before any model loads; a client class that
    overrides it (the earlier interface) would be coupled on the workers but not planned as one
    batch, so its method is refused at registration, with where to say it."""
    from raysim.algorithms import ClientAlgorithm, Method
    from raysim.algorithms.general.fedavg import FedAvg

    class Coupled(ClientAlgorithm):
        @property
        def trains_together(self) -> bool:
            return True

    with pytest.raises(ValueError, match="say it on the params class"):
        Method(name="coupled", strategy=FedAvg, client=Coupled)
    assert Method(name="coupled", strategy=FedAvg, client=ClientAlgorithm)


def test_a_plugin_cannot_take_a_builtin_name_whose_module_is_not_loaded():
    """Built-in implementations load lazily; a plugin registering ``pfedme`` first is still
    refused, since the name is the built-in spec's."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom raysim.algorithms import Method, register\n"
        "from raysim.algorithms.base import Strategy\n"
        "assert 'raysim.algorithms.fedoa.pfedme' not in sys.modules\n"
        "try:\n    register(Method(name='pfedme', strategy=Strategy))\n"
        "except ValueError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    refused = "algorithm 'pfedme' is registered twice (it is built in)"
    assert refused in out.stdout, out.stderr[-2000:]


# --------------------------------------------------------------------------- resources
def test_plan_resources_gives_the_bundles_every_launcher_uses():
    from raysim.launch.resources import ResourceError, plan_resources

    cfg = load_config(
        tiny(
            workers={"count": 3, "num_cpus": 0.5, "num_gpus": 0.25},
            coordinator={"num_cpus": 1, "num_gpus": 0.5},
        )
    )
    plan = plan_resources(cfg, {"CPU": 4, "GPU": 2})
    assert plan.num_workers == 3
    assert plan.bundles() == [{"CPU": 1.0, "GPU": 0.5}] + [{"CPU": 0.5, "GPU": 0.25}] * 3
    assert plan.totals() == {"CPU": 2.5, "GPU": 1.25}
    with pytest.raises(ResourceError, match="coordinator asks"):
        plan_resources(cfg, {"CPU": 4, "GPU": 0.25})
    lean = plan_resources(load_config(tiny(workers={"count": 2, "num_cpus": 0})), {"CPU": 2})
    assert lean.bundles()[0] == {"CPU": 0.001}  # Ray refuses an empty bundle


# --------------------------------------------------------------------------- one evaluator
VIEWS = ROOT / "tests" / "plugins" / "eval_views.py"


def _scores(core, weights, state):
    """Accuracy of one view scored by hand: global vector + a personal state (None: built)."""
    from raysim.training.loop import evaluate

    runner = core.executor.runner
    runner.model.set_global(weights)
    runner.model.set_state(state, 0)
    x, y = (np.asarray(a) for a in (runner.dataset.x_test, runner.dataset.y_test))
    import torch

    return evaluate(runner.model.module, torch.tensor(x), torch.tensor(y, dtype=torch.long))


def test_dense_personal_state_is_what_answers_for_each_client():
    """A personal head on a plain module: each client is scored through its own head, the
    global view through the built head; the summary is the mean (and spread) over clients."""
    cfg = load_config(tiny(rounds=3, algorithm={"name": "head", "module": str(VIEWS)}))
    core = local_core(cfg, evaluate=True)
    while not core.done:
        core.step()
    ev = core.evaluations[-1]
    rows = core.evaluator.last_clients
    assert ev["clients_evaluated"] == len(core.client_states) == len(rows) > 1
    assert {r["evaluated_with"] for r in rows} == {"head"}
    w = core.weights
    for row in rows[:3]:
        own = _scores(core, w, core.client_states[row["client"]])
        assert row["accuracy"] == own["accuracy"] and row["loss"] == own["loss"]
    swapped = _scores(core, w, core.client_states[rows[1]["client"]])
    assert swapped["loss"] != rows[0]["loss"], "a client must be scored through its own head"
    assert ev["accuracy_global"] == _scores(core, w, None)["accuracy"]
    accs = [r["accuracy"] for r in rows]
    assert ev["accuracy"] == pytest.approx(np.mean(accs))
    assert ev["accuracy_min"] == min(accs) and ev["accuracy_std"] == pytest.approx(np.std(accs))


def test_adapt_hook_scores_every_client_on_its_adapted_copy():
    def run(epochs):
        algo = {"name": "tune", "module": str(VIEWS), "tune_epochs": epochs}
        core = local_core(load_config(tiny(rounds=2, algorithm=algo)), evaluate=True)
        while not core.done:
            core.step()
        return core

    none, tuned, again = run(0), run(1), run(1)
    ev0, ev1 = none.evaluations[-1], tuned.evaluations[-1]
    assert ev0["clients_evaluated"] == ev1["clients_evaluated"] == 20  # every client, not visited
    assert ev0["accuracy"] == pytest.approx(ev0["accuracy_global"], abs=1e-12)
    assert ev0["accuracy_std"] < 1e-12
    assert ev1["accuracy"] != ev1["accuracy_global"] and ev1["accuracy_std"] > 0.0
    assert ev1["accuracy_global"] == ev0["accuracy_global"]  # adapting never touches the model
    assert tuned.evaluations == again.evaluations  # seeded: deterministic
    np.testing.assert_array_equal(tuned.weights, none.weights)


def test_evaluation_is_the_same_in_process_and_on_ray_workers(ray_cluster):
    cfg = load_config(
        tiny(
            rounds=2,
            algorithm={"name": "head", "module": str(VIEWS)},
            workers={"count": 3, "num_cpus": 0.5},
        )
    )
    core = local_core(cfg, evaluate=True)
    while not core.done:
        core.step()
    res = raysim.run(cfg.to_dict(), ["tracking.enabled=false"])
    for key in ("accuracy", "accuracy_global", "accuracy_min", "loss", "clients_evaluated"):
        assert res.metrics[key] == core.evaluations[-1][key], key
    assert res.clients[0]["evaluated_with"] == "head" and "accuracy" in res.clients[0]


def test_personal_state_stays_in_the_object_store_by_reference(ray_cluster):
    """A result's personal state comes back as a reference the coordinator owns; the next visit
    trains from it on the worker exactly as from the arrays in-process."""
    import ray

    from raysim.actors.jobs import ClientJob
    from raysim.actors.pool import RayWorkerPool
    from raysim.actors.worker import ClientRunner
    from raysim.algorithms.exact_sum import HeldDelta
    from raysim.data import build_federated_dataset

    workers = {"count": 2, "partial_sums": True}  # deltas too stay where they are
    cfg = load_config(tiny(algorithm={"name": "head", "module": str(VIEWS)}, workers=workers))
    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    pool = RayWorkerPool(cfg, ray.put(ds), 2, ds.client_sizes())
    try:
        runner = ClientRunner(cfg, ds)
        w0, _ = runner.initial_global()
        handle = pool.put(w0)
        pool.submit(handle, [ClientJob(0, 4, 0, cfg.seed), ClientJob(1, 7, 0, cfg.seed)])
        first, _ = pool.result(0), pool.result(1)
        assert isinstance(first.state, ray.ObjectRef)
        local = runner.run(w0, ClientJob(0, 4, 0, cfg.seed))
        pool.submit(handle, [ClientJob(2, 4, 1, cfg.seed, first.state)])
        second = pool.result(2)
        local2 = runner.run(w0, ClientJob(2, 4, 1, cfg.seed, local.state))
        assert isinstance(second.delta, HeldDelta)  # left on its node (workers.partial_sums)
        np.testing.assert_array_equal(second.delta.fetch(), local2.delta)
        got = pool.get(second.state)
        assert sorted(got) == sorted(local2.state) == ["3.bias", "3.weight"]
        for name, value in local2.state.items():
            np.testing.assert_array_equal(got[name], value)
    finally:
        pool.close()


# --------------------------------------------------------------------------- hooks from a module
HOOKS_PLUGIN = ROOT / "tests" / "plugins" / "user_hooks.py"


def test_hook_entries_take_a_module_and_keep_it_through_a_dump():
    cfg = load_config(
        tiny(
            hooks={
                "server": [{"name": "halve_step", "module": str(HOOKS_PLUGIN), "keep": 0.25}],
                "clients": [{"name": "zero_update", "module": str(HOOKS_PLUGIN)}],
            }
        )
    )
    assert cfg.hooks.server[0].params.keep == 0.25
    again = load_config(cfg.to_dict())  # what every Ray process reads
    assert again.hooks.server[0].module == str(HOOKS_PLUGIN.resolve())
    assert again.hooks.clients[0].name == "zero_update"
    with pytest.raises(ConfigError, match="hooks.server.*no such file"):
        load_config(tiny(hooks={"server": [{"name": "halve_step", "module": "/no/such.py"}]}))


def test_a_users_mixer_halves_every_server_step():
    plain = run_local(load_config(tiny(rounds=1)))
    halved = run_local(
        load_config(
            tiny(rounds=1, hooks={"server": [{"name": "halve_step", "module": str(HOOKS_PLUGIN)}]})
        )
    )
    w0 = local_core(load_config(tiny(rounds=1))).strategy.weights
    np.testing.assert_allclose(
        halved.strategy.weights - w0, 0.5 * (plain.strategy.weights - w0), rtol=1e-5, atol=1e-7
    )


@pytest.mark.slow
def test_a_users_behaviour_runs_on_ray_workers(ray_cluster):
    """A behaviour known only through ``module:`` reaches every Ray worker (separate processes
    that import it from the config): all clients send zero deltas, so the model never moves,
    and the run ends where the in-process one does."""
    hooks = {"clients": [{"name": "zero_update", "module": str(HOOKS_PLUGIN)}]}
    cfg = tiny(rounds=2, hooks=hooks, tracking={"enabled": False})
    res = raysim.run(cfg)
    core = local_core(load_config(cfg))
    start = core.strategy.weights.copy()
    while not core.done:
        core.step()
    np.testing.assert_array_equal(core.strategy.weights, start)
    assert res.weights_digest == core.digest()


# --------------------------------------------------------------------------- interface version
def test_a_plugin_of_the_old_wrap_model_shape_is_refused_in_one_line_before_ray(tmp_path):
    """``wrap_model(module, spec)`` (before interface 2.0) is refused when the plugin registers:
    one line on stderr naming the expected signature, exit 2, no Ray started."""
    cfg = tiny(
        rounds=1, algorithm={"name": "old_wrap", "module": str(PLUGINS / "old_wrap_method.py")}
    )
    cfg["runtime"] = "ray"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = fresh_cli(["run", "c.yaml"], tmp_path, env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "add_nothing(module, spec)" in lines[0]
    assert "wrap_model(module, spec, params)" in lines[0]
    assert f"interface {INTERFACE_VERSION}" in lines[0] and "CHANGELOG.md" in lines[0]


def test_every_overridable_call_is_checked_against_the_interface():
    """A client, strategy, mixer or behaviour that overrides a call with another shape is refused
    at registration; extra parameters with defaults, ``*args`` and renamed ones are accepted."""
    from raysim.algorithms import ClientAlgorithm, Method, register
    from raysim.algorithms.general.fedavg import FedAvg
    from raysim.algorithms.hooks import ClientBehaviour, Mixer
    from raysim.algorithms.registry import BEHAVIOURS, MIXERS, Hook

    class OldClient(ClientAlgorithm):
        def train(self, ctx, global_params):  # an extra required argument
            return {}

    class OldStrategy(FedAvg):
        def on_round_end(self):  # lost its round_index
            return True

    class OldMixer(Mixer):
        def mix(self, previous, aggregated):
            return aggregated

    class OldBehaviour(ClientBehaviour):
        def on_update(self, ctx, delta, *, scale):  # a keyword the runtime never passes
            return delta

    class FineClient(ClientAlgorithm):
        def train(self, context, extra=1, *rest):
            return {}

    cases = [
        (
            lambda: register(Method(name="t_old_client", strategy=FedAvg, client=OldClient)),
            "OldClient",
            "train(self, ctx)",
        ),
        (
            lambda: register(Method(name="t_old_strategy", strategy=OldStrategy)),
            "OldStrategy",
            "on_round_end(self, round_index)",
        ),
        (
            lambda: MIXERS.register(Hook("t_old_mixer", OldMixer)),
            "OldMixer",
            "mix(self, round_index",
        ),
        (
            lambda: BEHAVIOURS.register(Hook("t_old_behaviour", OldBehaviour)),
            "OldBehaviour",
            "on_update(self, ctx",
        ),
    ]
    for call, owner, expected in cases:
        with pytest.raises(InterfaceError) as e:
            call()
        assert owner in str(e.value) and expected in str(e.value), str(e.value)
        assert "\n" not in str(e.value)
    register(Method(name="t_fine_client", strategy=FedAvg, client=FineClient))


def test_raysim_methods_prints_the_interface_version(capsys):
    from raysim.cli import main

    assert main(["methods"]) == 0
    assert f"method interface {INTERFACE_VERSION}" in capsys.readouterr().out


def test_the_changelog_names_the_current_interface_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## Method interface (\d+\.\d+)", text, flags=re.M)
    assert versions and versions[0] == INTERFACE_VERSION, versions
