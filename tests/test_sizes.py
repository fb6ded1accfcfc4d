"""Sizes are checked before anything starts (``raysim.launch.sizes``): a run the machine cannot
hold is
refused in one line by ``raysim run`` (a dry run too), before Ray starts or anything is
allocated, and the plan shows the estimates."""

from __future__ import annotations

import time

import pytest

import raysim
from raysim import cli
from raysim.cli.common import EXIT_USAGE
from raysim.config import ConfigError, load_config
from raysim.launch import session as api
from raysim.launch import sizes
from raysim.launch.plan import plan_run
from tests.conftest import EXAMPLES

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
OFF = ["tracking.enabled=false"]

#: what each refusal names: (overrides, the quantity, the config key to change)
REFUSED = {
    "a trillion clients": (["clients.num=1000000000000"], "memory", "clients.num"),
    "two layers of 10^9": (["model.hidden=[1000000000,1000000000]"], "beyond", "model.hidden"),
    "10^15 rounds, checkpointed each": (
        ["rounds=1000000000000000", "checkpoint.every=1"],
        "exceeds what any machine holds",
        "rounds",
    ),
    "10^6 clients' state on disk": (
        [
            "algorithm.name=ditto",
            "clients.state.store=disk",
            "clients.num=1000000",
            "rounds=100000",
            "model.hidden=[100000]",
        ],
        "personal-state store",
        "clients.num",
    ),
}


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A run's folder, no override, no GPU, and the CLI's imports done (so a call is timed
    alone)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(sizes.OVERRIDE, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    load_config(QUICKSTART)
    return tmp_path


@pytest.fixture
def ray_inits(monkeypatch) -> list:
    """Every ``ray.init`` call the test makes (refused): none may start Ray, whether or not a
    Ray of the test session is up already."""
    import ray

    calls: list = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("ray.init was called")

    monkeypatch.setattr(ray, "init", refuse)
    return calls


def timed_cli(argv: list[str]) -> tuple[int, float]:
    t0 = time.perf_counter()
    rc = cli.main(argv)
    return rc, time.perf_counter() - t0


@pytest.mark.parametrize("case", list(REFUSED))
def test_sizes_no_machine_holds_are_refused_by_the_dry_run(here, capsys, case, ray_inits):
    """Each of these passed ``--dry-run`` and failed only once started; now the dry run
    refuses it in one line that names the quantity and the key to change, quickly, without
    Ray."""
    overrides, quantity, key = REFUSED[case]
    rc, took = timed_cli(["run", QUICKSTART, *overrides, *OFF, "checkpoint.dir=ck", "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == EXIT_USAGE and not out, out
    assert err.count("\n") == 1 and err.startswith("raysim: error: "), err
    assert quantity in err and key in err, err
    assert took < 1.0 and not ray_inits


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_real_run_is_refused_before_anything_starts(here, capsys, monkeypatch, case, ray_inits):
    """``raysim run`` and ``raysim.run`` refuse the same configs before Ray starts (and a run
    that got past the check stops at its preflight here, before it allocates anything)."""

    def would_start(*args, **kwargs):
        raise AssertionError("the run got past its plan: it would start")

    monkeypatch.setattr(api, "preflight", would_start)
    overrides = [*REFUSED[case][0], *OFF, "checkpoint.dir=ck"]
    rc, took = timed_cli(["run", QUICKSTART, *overrides])
    assert rc == EXIT_USAGE and took < 1.0
    assert capsys.readouterr().err.count("\n") == 1
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=REFUSED[case][2]):
        raysim.run(QUICKSTART, overrides)
    assert time.perf_counter() - t0 < 1.0 and not ray_inits
    assert not (here / "ck").exists() and not (here / "raysim-states").exists()


def test_a_small_run_passes_and_its_plan_shows_the_estimates(here, capsys):
    rc = cli.main(["run", QUICKSTART, "checkpoint.every=5", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(x for x in out.splitlines() if x.startswith("sizes: "))
    # 64 digits' pixels → 128 → 10 classes: (64·128 + 128) + (128·10 + 10)
    assert line.startswith("sizes: model 9,610 parameters; memory ~"), line
    assert " MiB of " in line and "GiB; checkpoint ~" in line and " free" in line, line


def disk_config(tmp_path, *extra: str):
    """The quickstart with its personal state on disk (no estimate depends on the method)."""
    return load_config(
        QUICKSTART, [*OFF, "clients.state.store=disk", f"clients.state.dir={tmp_path}", *extra]
    )


def test_memory_just_over_what_is_available_is_refused_and_under_the_margin_passes(
    here, monkeypatch
):
    cfg = disk_config(here)
    monkeypatch.setattr(sizes, "memory", lambda: (1 << 60, 1 << 60))
    need = sizes.total(plan_run(cfg).sizes.estimate.memory)  # for the pool the plan sizes
    total = int(need / sizes.MARGIN) + 4096  # the estimate just under the margin
    monkeypatch.setattr(sizes, "memory", lambda: (total, total))
    assert "memory ~" in plan_run(cfg).describe()
    monkeypatch.setattr(sizes, "memory", lambda: (total, need - 4096))  # just over available
    with pytest.raises(ConfigError, match="available now") as refused:
        plan_run(cfg)
    assert "\n" not in str(refused.value) and sizes.OVERRIDE in str(refused.value)
    over = int(need / sizes.MARGIN) - 4096  # just over the margin of the machine's memory
    monkeypatch.setattr(sizes, "memory", lambda: (over, over))
    with pytest.raises(ConfigError, match="exceeds 80% of this machine's"):
        plan_run(cfg)


def test_a_checkpoint_just_over_the_free_disk_margin_is_refused(here, monkeypatch):
    cfg = load_config(QUICKSTART, [*OFF, "checkpoint.every=5", f"checkpoint.dir={here}/ck"])
    need = sizes.total(sizes.estimate(cfg).without_maybe().checkpoint)  # fedavg: no state
    monkeypatch.setattr(sizes, "free_disk", lambda path: int(need / sizes.MARGIN) + 4096)
    assert "checkpoint ~" in plan_run(cfg).describe()
    monkeypatch.setattr(sizes, "free_disk", lambda path: int(need / sizes.MARGIN) - 4096)
    with pytest.raises(ConfigError, match=r"checkpoint ~.* free at .*ck: lower"):
        plan_run(cfg)


def test_the_override_runs_what_the_machine_seems_too_small_for(here, monkeypatch, capsys):
    """``RAYSIM_IGNORE_SIZES=1`` lets through what exceeds this machine, not what no machine
    holds."""
    monkeypatch.setenv(sizes.OVERRIDE, "1")
    overrides = REFUSED["a trillion clients"][0]
    assert cli.main(["run", QUICKSTART, *overrides, *OFF, "--dry-run"]) == 0
    assert f"(not enforced: {sizes.OVERRIDE}=1)" in capsys.readouterr().out
    overrides = REFUSED["two layers of 10^9"][0]
    assert cli.main(["run", QUICKSTART, *overrides, *OFF, "--dry-run"]) == EXIT_USAGE


def test_the_estimated_parameters_are_the_built_models(here):
    """The counts from the config alone are those of the models the run would build."""
    from raysim.models.registry import DataSpec, build_handle

    cases = [
        (["model.hidden=[32,16]"], DataSpec("dense", (64,), 10)),
        (["model.name=cnn", "model.batch_norm=true"], DataSpec("dense", (64,), 10)),
        (
            ["model.name=preact_resnet", "model.resnet.hidden_sizes=[4,8]",
             "model.resnet.depths=[1,1]", "data.name=synthetic", "data.synthetic.features=48"],
            DataSpec("dense", (3, 4, 4), 10),
        ),
    ]  # fmt: skip
    for overrides, spec in cases:
        cfg = load_config(QUICKSTART, [*overrides, "model.device=cpu"])
        handle = build_handle(cfg.model, spec)
        assert sizes.model_size(cfg).shared == len(handle.get_global()), overrides
