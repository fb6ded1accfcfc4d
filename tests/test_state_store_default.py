"""``clients.state.store: auto``, the default: the plan puts clients' personal state on disk
where it would take more than ``AUTO_DISK_SHARE`` of this machine's memory, in memory below,
says so in the dry run, and the run and its checkpoints keep the choice (``raysim.launch.sizes``
``choose_store``)."""

from __future__ import annotations

import pytest

import raysim
from raysim import cli
from raysim.config import load_config
from raysim.launch import sizes, store_choice
from raysim.launch.plan import plan_run
from raysim.state import checkpoint
from raysim.state.store import DiskStateStore
from tests.conftest import EXAMPLES, ROOT, tiny

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
ECHO = ROOT / "tests" / "plugins" / "echo_method.py"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A run's folder, the size check on, no GPU, no named cluster."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(sizes.OVERRIDE, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return tmp_path


def ditto(tmp_path, store: str = "auto", folder: str | None = None, **over):
    """A few seconds' run without Ray of a method that keeps a personal model per client, its
    store (if on disk) in ``folder`` (default: ``tmp_path/states``)."""
    raw = tiny(
        rounds=6,
        clients={
            "num": 12,
            "per_round": 4,
            "state": {"store": store, "dir": folder or str(tmp_path / "states")},
        },
        **{
            "algorithm": {"name": "ditto"},
            "tracking": {"enabled": False},
            "runtime": "local",
            "workers": {"count": 1},
            **over,
        },
    )
    return load_config(raw)


def states_of(cfg) -> int:
    """The estimate's personal state of ``cfg``'s clients, in bytes."""
    return sizes.personal_state(cfg, sizes.model_size(cfg)).nbytes


def machine(monkeypatch, total: int) -> None:
    """This machine's memory, as the plan reads it."""
    monkeypatch.setattr(sizes, "memory", lambda: (total, total))


def test_auto_puts_states_beyond_a_share_of_memory_on_disk_and_keeps_the_rest_in_memory(
    here, monkeypatch
):
    cfg = ditto(here)
    assert cfg.clients.state.store == "auto"  # the default
    states = states_of(cfg)
    assert states == 12 * 4 * sizes.model_size(cfg).personal > 0
    edge = int(states / store_choice.AUTO_DISK_SHARE)  # the states are exactly the share
    machine(monkeypatch, edge)
    resolved, choice = store_choice.choose_store(cfg)
    assert resolved.clients.state.store == choice.store == "memory"
    assert "within 25% of this machine's" in choice.why
    machine(monkeypatch, edge - 64)  # just above the share
    resolved, choice = store_choice.choose_store(cfg)
    assert resolved.clients.state.store == choice.store == "disk" and choice.shown
    # the plan carries the concrete store: nothing after it sees ``auto``
    monkeypatch.setenv(sizes.OVERRIDE, "1")  # a machine this small holds no run at all
    plan = plan_run(cfg)
    assert plan.cfg.clients.state.store == "disk" and cfg.clients.state.store == "auto"
    machine(monkeypatch, 1 << 40)
    assert plan_run(cfg).cfg.clients.state.store == "memory"


def test_a_method_without_personal_state_stays_in_memory_unsaid(here, monkeypatch):
    """FedAvg keeps no personal state: however large the bound, memory, and no line."""
    cfg = ditto(here, algorithm={"name": "fedavg"})
    machine(monkeypatch, states_of(cfg))  # the bound is 4x the share
    monkeypatch.setenv(sizes.OVERRIDE, "1")
    plan = plan_run(cfg)
    assert plan.cfg.clients.state.store == "memory"
    assert "client states:" not in plan.describe()


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_an_explicit_store_is_kept_whatever_the_machine(here, monkeypatch, store):
    cfg = ditto(here, store)
    monkeypatch.setenv(sizes.OVERRIDE, "1")
    for total in (states_of(cfg), 1 << 40):  # states at 100% of memory, and a sliver of it
        machine(monkeypatch, total)
        assert store_choice.choose_store(cfg) == (cfg, None)
        plan = plan_run(cfg)
        assert plan.cfg.clients.state.store == store
        assert "client states:" not in plan.describe()


def dry_run(capsys, overrides: list[str]) -> str:
    """``raysim run QUICKSTART OVERRIDES --dry-run``'s plan."""
    rc = cli.main(["run", QUICKSTART, "tracking.enabled=false", *overrides, "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def test_the_dry_run_says_where_the_states_go_and_why(here, monkeypatch, capsys):
    cfg = load_config(QUICKSTART, ["algorithm.name=ditto"])
    states = states_of(cfg)  # 100 clients × 4 × 9,610 parameters
    assert states == 100 * 4 * 9610
    machine(monkeypatch, 2 * states)  # the states would take half of it
    monkeypatch.setenv(sizes.OVERRIDE, "1")
    out = dry_run(capsys, ["algorithm.name=ditto"])
    line = next(x for x in out.splitlines() if x.startswith("client states: "))
    assert line == (
        f"client states: on disk (100 clients × 37.5 KiB = {sizes.human(states)}, above 25% of "
        f"this machine's {sizes.human(2 * states)} of memory; clients.state.store=memory keeps "
        "them there)"
    ), line
    assert "personal-state store ~" in out  # the sizes line counts the store on disk
    # a plugin's method may keep any state: said where it fits in memory, too (in its run's
    # plan: a dry run imports no module, so it plans no plugin's run)
    machine(monkeypatch, 1 << 40)
    plugin = f"algorithm={{name: echo, module: {ECHO}}}"
    plan = plan_run(load_config(QUICKSTART, ["tracking.enabled=false", plugin])).describe()
    line = next(x for x in plan.splitlines() if x.startswith("client states: "))
    assert line.startswith("client states: in memory (100 clients × 37.5 KiB = "), line
    assert "within 25% of this machine's 1 TiB of memory; clients.state.store=disk" in line
    # a built-in method's states that fit: memory, its implementation not imported to say so
    assert "client states:" not in dry_run(capsys, ["algorithm.name=ditto"])
    # an explicit store: nothing to decide, nothing said
    assert "client states:" not in dry_run(capsys, ["clients.state.store=memory"])


def test_states_stay_in_memory_where_no_folder_outlives_the_run(here, monkeypatch):
    """No folder the run can choose: on a named cluster (it needs one every node mounts), and
    inside a Ray job's temporary working_dir, which vanishes with the job (a resume would not
    find the states): memory, with the reason."""
    cfg = ditto(here, folder="raysim-states")  # relative: in the job's working_dir
    machine(monkeypatch, states_of(cfg))
    resolved, choice = store_choice.choose_store(cfg, here=False)
    assert resolved.clients.state.store == "memory"
    assert "every node mounts" in choice.why and not choice.shown  # ditto: not asked there
    with monkeypatch.context() as m:
        m.setattr(store_choice, "_ray_nodes", lambda: 2)  # a Ray of two nodes joined already
        resolved, choice = store_choice.choose_store(cfg)
    assert resolved.clients.state.store == "memory" and choice.shown
    assert "on a Ray of 2 nodes" in choice.why and "every node mounts" in choice.why
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {"working_dir": "."}}')
    resolved, choice = store_choice.choose_store(cfg)
    assert resolved.clients.state.store == "memory" and choice.shown
    assert "above 25%" in choice.why and "temporary working_dir" in choice.why, choice.why
    assert choice.line().startswith("client states: in memory (")


def test_a_run_on_auto_writes_its_store_on_disk_and_ends_on_the_memory_digest(here, monkeypatch):
    cfg = ditto(here)
    in_memory = raysim.run(ditto(here, "memory"))
    assert in_memory.state_store is None
    machine(monkeypatch, 2 * states_of(cfg))
    monkeypatch.setenv(sizes.OVERRIDE, "1")
    res = raysim.run(cfg)
    assert "client states: on disk" in res.plan
    assert res.state_store is not None and res.state_store.startswith(str(here / "states"))
    visited = len(res.client_states)
    assert visited > 1 and DiskStateStore(res.state_store).files() == visited  # last versions
    assert res.weights_digest == in_memory.weights_digest


def test_a_resume_keeps_the_store_its_checkpoint_was_written_with(here, monkeypatch):
    """The checkpoint's config has the store its plan chose; ``auto`` resumes with it, whatever
    this machine would choose now, and ends on the uninterrupted run's digest; an explicit
    other store is another run."""
    ck = str(here / "ck")
    cfg = ditto(here, checkpoint={"every": 2, "dir": ck})
    machine(monkeypatch, 2 * states_of(cfg))
    monkeypatch.setenv(sizes.OVERRIDE, "1")
    whole = raysim.run(ditto(here, checkpoint={"every": 2, "dir": str(here / "ck0")}))
    session = raysim.RunSession(cfg)
    assert session.cfg.clients.state.store == "disk"
    for _ in range(3):
        session.step()
    session.close()  # stopped after round 3, its checkpoint after round 2
    machine(monkeypatch, 1 << 40)  # now auto would choose memory
    resume = checkpoint.prepare_resume(ck, cfg)
    assert resume.config.clients.state.store == "disk" and resume.round == 2
    res = raysim.run(cfg, resume=ck)
    assert res.weights_digest == whole.weights_digest
    assert res.state_store is not None
    with pytest.raises(checkpoint.ResumeError, match="clients.state.store"):
        checkpoint.prepare_resume(ck, ditto(here, "memory", checkpoint={"every": 2, "dir": ck}))


def test_a_checkpoint_config_that_says_auto_matches_the_store_a_resume_names(here):
    """A checkpoint written from a config no plan resolved (``checkpoint.pack`` of the config as
    loaded) says ``auto``: a resume that names ``memory`` or ``disk`` is the same run."""
    cfg = ditto(here)
    files = checkpoint.pack({"core": {}}, cfg, 2)
    meta, _ = checkpoint.unpack(files)
    for store in ("memory", "disk"):
        assert checkpoint.same_config(ditto(here, store), meta, files)
    assert not checkpoint.same_config(ditto(here, "disk", seed=4), meta, files)


def test_state_a_plugins_client_declares_is_counted(monkeypatch):
    """The issue's case: a plugin keeping 8 MiB of ``ClientContext.state`` per client on 3,000
    clients (``benchmarks/plugins/ballast.py``, which declares it through
    ``ClientAlgorithm.state_nbytes``) goes on disk on a 24 GB machine; 300 of them stay in
    memory. Undeclared (0), the same run would stay in memory."""
    monkeypatch.setattr(sizes, "memory", lambda: (24 * 2**30, 20 * 2**30))
    plugin = ROOT / "benchmarks" / "plugins" / "ballast.py"

    def plan(clients: int):
        cfg = load_config(
            EXAMPLES / "synthetic.yaml",
            [f"clients.num={clients}", "clients.per_round=100", "rounds=40",
             f"algorithm={{name: ballast, module: {plugin}, mib: 8}}"],
        )  # fmt: skip
        return plan_run(cfg, check=False)

    many = plan(3000)
    assert many.cfg.clients.state.store == "disk"
    assert "client states: on disk (3,000 clients × 8 MiB = 23.4 GiB" in many.describe()
    assert plan(300).cfg.clients.state.store == "memory"
    from raysim.algorithms.registry import get_method

    monkeypatch.setattr(get_method("ballast").client, "state_nbytes", classmethod(lambda c, p: 0))
    assert plan(3000).cfg.clients.state.store == "memory"
