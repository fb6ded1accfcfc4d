"""Reliability matrix: bad inputs and faults, tried as a user would meet them; a table at the end.

Bad inputs run ``raysim`` in a fresh process on a fresh store. Each must end with exit 2, exactly
one line on stderr, no traceback, and nothing written to the store. Faults run real runs. Each
must end with the digest of an uninterrupted run, or a clear refusal, and no run left RUNNING.
The table reports, per row, how many tries there were, how many survived, and how many were lost.

    python benchmarks/reliability.py                 # everything (about 3 h on 2 CPUs)
    python benchmarks/reliability.py --only inputs   # the bad-input half (about 3 min)
    python benchmarks/reliability.py --only faults   # the fault half (about 15-20 min)
    python benchmarks/reliability.py --only store    # personal state on disk (about 3 min)
    python benchmarks/reliability.py --only full-disk     # a disk that fills mid-checkpoint
    python benchmarks/reliability.py --only locked-store  # "database is locked" mid-run
    python benchmarks/reliability.py --only shared-folder # two runs, one checkpoint.dir
    python benchmarks/reliability.py --only methods  # method x example (about 2.5 h: ~25 s a run)
    python benchmarks/reliability.py --only methods --examples quickstart  # one example's row

The method matrix runs ``raysim run EXAMPLE 'algorithm={name: M}' rounds=1`` for every registered
method on every example that runs offline, and ``--dry-run`` on the paper-scale configs (their
data and weights come from the hub): each pair must run (exit 0, a digest), or be refused in one
line with exit 2 before Ray starts.

``tests/test_first_hour.py`` runs a fast subset of these in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common import machine

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "examples" / "quickstart.yaml")
RAYSIM = [sys.executable, "-m", "raysim.cli"]


@dataclass
class Row:
    kind: str
    name: str
    tried: int = 0
    survived: int = 0
    lost: int = 0
    note: str = ""


def raysim(
    args: list[str], store: Path, timeout: float = 600, env: dict[str, str] | None = None, **kw
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RAYSIM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**_env(store), **(env or {})},
        cwd=store,
        **kw,
    )


# --------------------------------------------------------------------------- bad inputs
def _write(name: str, text: str | bytes) -> Callable[[Path], str]:
    def make(d: Path) -> str:
        p = d / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return str(p)

    return make


#: label → argv builder given a scratch dir (or argv and environment variables)
BAD_INPUTS: dict[str, Callable[[Path], list[str] | tuple[list[str], dict[str, str]]]] = {
    # YAML files
    "missing file": lambda d: ["run", str(d / "nope.yaml")],
    "empty file": lambda d: ["run", _write("e.yaml", "")(d)],
    "comment-only file": lambda d: ["run", _write("c.yaml", "# nothing\n")(d)],
    "unclosed mapping": lambda d: ["run", _write("b.yaml", "clients: {num: 5\n")(d)],
    "bad indentation": lambda d: ["run", _write("i.yaml", "rounds: 3\n  seed: 1\n")(d)],
    "tab indentation": lambda d: ["run", _write("t.yaml", "clients:\n\tnum: 5\n")(d)],
    "top level is a list": lambda d: ["run", _write("l.yaml", "- 1\n- 2\n")(d)],
    "top level is a scalar": lambda d: ["run", _write("s.yaml", "42\n")(d)],
    "binary garbage": lambda d: ["run", _write("g.yaml", b"\xff\xfe\x00\x01")(d)],
    "a directory, not a file": lambda d: ["run", str(d)],
    "unknown top-level key": lambda d: ["run", _write("u.yaml", "roundz: 3\n")(d)],
    "unknown nested key": lambda d: ["run", _write("n.yaml", "clients: {nun: 5}\n")(d)],
    "wrong type": lambda d: ["run", _write("w.yaml", "rounds: many\n")(d)],
    # overrides
    "override without =": lambda d: ["run", QUICK, "rounds"],
    "rounds=0": lambda d: ["run", QUICK, "rounds=0"],
    "negative seed type": lambda d: ["run", QUICK, "seed=abc"],
    "per_round > num": lambda d: ["run", QUICK, "clients.per_round=500"],
    "unknown algorithm": lambda d: ["run", QUICK, "algorithm.name=fedavgg"],
    "unknown algorithm parameter": lambda d: ["run", QUICK, "algorithm.mu=1"],
    "unknown model": lambda d: ["run", QUICK, "model.name=resnet999"],
    "unknown dataset": lambda d: ["run", QUICK, "data.name=imagenet-1m"],
    "unknown delay kind": lambda d: ["run", QUICK, "delays.kind=sometimes"],
    "negative lr": lambda d: ["run", QUICK, "local.lr=-1"],
    "batch not divisible": lambda d: [
        "run",
        QUICK,
        "local.batch_size=10",
        "local.grad_accumulation=3",
    ],
    "bad partition": lambda d: ["run", QUICK, "data.partition.kind=random"],
    "alpha <= 0": lambda d: ["run", QUICK, "data.partition.alpha=0"],
    "fault beyond clients": lambda d: [
        "run",
        QUICK,
        "faults.corrupt_updates=[{client: 999, round: 1}]",
    ],
    "fault beyond rounds": lambda d: [
        "run",
        QUICK,
        "faults.corrupt_updates=[{client: 1, round: 99}]",
    ],
    "kill beyond rounds": lambda d: ["run", QUICK, "faults.kill_worker.round=99"],
    "checkpoint with nowhere to go": lambda d: [
        "run",
        QUICK,
        "checkpoint.every=2",
        "tracking.enabled=false",
    ],
    "plugin module missing": lambda d: [
        "run",
        QUICK,
        "algorithm={name: x, module: no.such.module}",
    ],
    "plugin file missing": lambda d: ["run", QUICK, f"algorithm={{name: x, module: {d}/x.py}}"],
    "unknown server hook": lambda d: ["run", QUICK, "hooks.server=[{name: nope}]"],
    # resources
    "too many workers": lambda d: ["run", QUICK, "workers.count=64"],
    "GPU workers, no GPU": lambda d: ["run", QUICK, "workers.num_gpus=0.5"],
    "coordinator too big": lambda d: ["run", QUICK, "coordinator.num_cpus=64"],
    "per_client too many": lambda d: ["run", QUICK, "workers.count=per_client"],
    "fractional num_gpus > 1": lambda d: ["run", QUICK, "workers.num_gpus=1.5"],
    "a typo in the method's own parameter": lambda d: [
        "run",
        QUICK,
        "algorithm.name=fedbuff",
        "algorithm.buffer_sise=3",
    ],
    "another tool's name (learning_rate)": lambda d: ["run", QUICK, "local.learning_rate=0.1"],
    # personal state (issue 43)
    "a manifest of a store in memory": lambda d: [
        "run",
        QUICK,
        "algorithm.name=ditto",
        "tracking.client_states=manifest",
    ],
    # CLI flags and clusters (no Ray cluster runs on the machine)
    "run without config": lambda d: ["run"],
    "unreachable --address": lambda d: ["run", QUICK, "--address", "127.0.0.1:7"],
    "--address of a port nobody serves": lambda d: ["run", QUICK, "--address", "127.0.0.1:6399"],
    "--address auto, no cluster": lambda d: ["run", QUICK, "--address", "auto"],
    "RAY_ADDRESS=auto, no cluster": lambda d: (["run", QUICK], {"RAY_ADDRESS": "auto"}),
    "tune --address auto --dry-run, no cluster": lambda d: [
        "tune",
        str(ROOT / "examples" / "tune-async.yaml"),
        "--address",
        "auto",
        "--dry-run",
    ],
    # checkpoints
    "resume an unknown run id": lambda d: ["run", "--resume", "0123456789abcdef0123456789abcdef"],
    "resume a missing dir": lambda d: ["run", "--resume", str(d / "no-ckpt")],
    "resume a dir without checkpoint": lambda d: ["run", "--resume", str(d)],
    "resume a corrupt checkpoint": lambda d: [
        "run",
        "--resume",
        str(_corrupt_checkpoint(d)),
    ],
}


def _corrupt_checkpoint(d: Path) -> Path:
    ckpt = d / "ckpt"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "meta.json").write_text("{not json")
    return ckpt


def bad_inputs(rows: list[Row]) -> None:
    for label, build in BAD_INPUTS.items():
        row = Row("bad input", label, tried=1)
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            built = build(d)
            argv, env = built if isinstance(built, tuple) else (built, None)
            res = raysim(argv, d, timeout=120, env=env)
            lines = res.stderr.strip().splitlines()
            problems = []
            if res.returncode != 2:
                problems.append(f"exit {res.returncode}")
            if len(lines) != 1:
                problems.append(f"{len(lines)} stderr lines")
            if "Traceback" in res.stderr:
                problems.append("traceback")
            if (d / "mlflow.db").exists() or (d / "mlruns").exists():
                problems.append("wrote to the store")
            row.survived = int(not problems)
            row.lost = 0  # nothing ran: nothing to lose
            row.note = "; ".join(problems) or (lines[0][:90] if lines else "")
        rows.append(row)
        print(f"  {label}: {row.note}", flush=True)


# --------------------------------------------------------------------------- method x example
def method_matrix(rows: list[Row], only: str = "") -> None:
    """``only``: a substring an example's path must contain (all examples when empty)."""
    from raysim.algorithms.registry import method_names

    examples = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if p.name != "methods.yaml")
    examples = [e for e in examples if only in str(e.relative_to(ROOT))]
    found = tempfile.TemporaryDirectory()  # the FedBaF foundations, as their examples make them
    if any("foundations/" in e.read_text() for e in examples):
        for kind in ("digits", "markov"):
            raysim(["pretrain", kind, "--out", f"foundations/{kind}"], Path(found.name))
    for example in examples:
        offline = "paper" not in example.relative_to(ROOT).parts[
            :-1
        ] and not example.stem.startswith("paper")
        label = str(example.relative_to(ROOT / "examples")) + ("" if offline else " (dry run)")
        row = Row("method x example", label)
        ran, refused, failed = 0, 0, []
        for name in method_names():
            row.tried += 1
            extra = ["rounds=1"] if offline else ["--dry-run"]
            with tempfile.TemporaryDirectory() as tmp:
                d = Path(tmp)
                if (Path(found.name) / "foundations").is_dir():
                    (d / "foundations").symlink_to(Path(found.name) / "foundations")
                t0 = time.perf_counter()
                res = raysim(["run", str(example), f"algorithm={{name: {name}}}", *extra], d)
                took = time.perf_counter() - t0
                lines = res.stderr.strip().splitlines()
                if res.returncode == 0 and (not offline or _final_digest(res.stdout)):
                    ran += 1
                    verdict = f"ran ({took:.0f} s)"
                elif res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr:
                    refused += 1
                    verdict = "refused: " + lines[0][:110]
                else:
                    failed.append(name)
                    verdict = f"FAILED exit {res.returncode}, {len(lines)} stderr lines: " + (
                        lines[-1][:110] if lines else ""
                    )
            print(f"  {label} · {name}: {verdict}", flush=True)
        row.survived = ran + refused
        row.lost = len(failed)
        row.note = f"{ran} ran, {refused} refused in one line" + (
            f"; failed: {', '.join(failed)}" if failed else ""
        )
        rows.append(row)
    found.cleanup()


# --------------------------------------------------------------------------- faults
def _final_digest(stdout: str) -> str | None:
    for line in stdout.splitlines():
        if line.startswith("weights sha256: "):
            return line.split()[-1]
    return None


def _runs(store: Path) -> list:
    """The store's runs, newest first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, order_by=["attributes.start_time DESC"]) if exps else []


def _statuses(store: Path) -> list[str]:
    return [r.info.status for r in _runs(store)]


def _run_id(store: Path) -> str | None:
    runs = _runs(store)
    return runs[0].info.run_id if runs else None


def driver_signals(
    rows: list[Row], reference: str, tries: int, rng: random.Random, run_s: float
) -> None:
    """Stop the driver at a random moment of a run (``run_s``: the reference run's wall time;
    start-up included), then resume until it finishes."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        row = Row("fault", f"driver {sig.name} at a random point, then resume")
        attempts = 0
        while row.tried < tries and attempts < 3 * tries:
            attempts += 1
            row.tried += 1
            with tempfile.TemporaryDirectory() as tmp:
                store = Path(tmp)
                proc = _popen(["run", QUICK, "checkpoint.every=3"], store)
                at = rng.uniform(1.0, 0.9 * run_s)  # within the run, start-up included
                time.sleep(at)
                if proc.poll() is not None:  # it ended first: no fault struck, try again
                    row.tried -= 1
                    continue
                proc.send_signal(sig)
                _, stop_err = proc.communicate(timeout=180)
                run_id = _run_id(store)
                if run_id is None:  # stopped before the run existed: start again
                    res = raysim(["run", QUICK, "checkpoint.every=3"], store)
                else:
                    extra = ["--force"] if sig == signal.SIGKILL else []
                    res = raysim(["run", "--resume", run_id, *extra], store)
                    if res.returncode == 2 and "no checkpoint" in res.stderr:
                        res = raysim(["run", QUICK, "checkpoint.every=3"], store)
                digest = _final_digest(res.stdout)
                left_running = [s for s in _statuses(store) if s == "RUNNING"]
                if digest == reference and not left_running:
                    row.survived += 1
                else:
                    row.lost += 1
                    row.note = (
                        f"at {at:.1f} s: rc {proc.returncode} ({_tail(stop_err)}), then rc "
                        f"{res.returncode} ({_tail(res.stderr)}), digest {digest}, RUNNING left: "
                        f"{len(left_running)}"
                    )
        rows.append(row)
        print(f"  {row.name}: {row.survived}/{row.tried}", flush=True)


#: a run long enough to stop in each phase: a checkpoint after every round
STOP_RUN = ["run", QUICK, "rounds=60", "checkpoint.every=1"]


def _descendants(pid: int) -> list[str]:
    import psutil

    names = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            names.append(" ".join(child.cmdline()) or child.name())
        except psutil.Error:
            continue
    return names


def _tagged_run(store: Path, tag: str | None = None) -> bool:
    if not (store / "mlflow.db").exists():
        return False
    try:
        runs = _runs(store)
    except Exception:  # noqa: BLE001 - the store is being made
        return False
    return bool(runs) and (tag is None or tag in runs[0].data.tags)


def _set_up_for(store: Path, seconds: float) -> bool:
    """The run's set-up ended (its placement logged) at least ``seconds`` ago."""
    placed = list(store.glob("mlruns/*/*/artifacts/placement.json"))
    return bool(placed) and time.time() - placed[0].stat().st_mtime >= seconds


def _finished(store: Path) -> bool:
    return _tagged_run(store) and _statuses(store)[0] == "FINISHED"


#: phase → (what says the run is in it, given the driver's pid and the store)
STOP_PHASES: dict[str, Callable[[int, Path], bool]] = {
    "Ray starting": lambda pid, store: any("gcs_server" in c for c in _descendants(pid)),
    "workers starting": lambda pid, store: any("Coordinator" in c for c in _descendants(pid)),
    # the run's placement is its set-up's last record: the first round follows at once
    "first round": lambda pid, store: _set_up_for(store, 0.1),
    "mid-run, checkpoints every round": lambda pid, store: _tagged_run(
        store, "raysim.checkpoint_round"
    ),
    "at the end": lambda pid, store: _finished(store),
}


def _hint(err: str) -> list[str] | None:
    """The command the stop's last line names, as argv for this Python."""
    import re
    import shlex

    lines = err.strip().splitlines()
    found = re.findall(r"`(raysim [^`]+)`", lines[-1]) if lines else []
    return [*RAYSIM, *shlex.split(found[-1])[1:]] if found else None


def group_stops(rows: list[Row], tries: int) -> None:
    """SIGTERM or SIGINT to the run's whole process group (``timeout``, ``kill -TERM -PGID``, a
    terminal's Ctrl-C) in each phase of a run: it must exit within 2 s, leave no run RUNNING and
    print a command that, run, ends with the uninterrupted run's weights."""
    with tempfile.TemporaryDirectory() as tmp:
        reference = _final_digest(raysim(STOP_RUN, Path(tmp)).stdout)
    for phase, reached in STOP_PHASES.items():
        for sig in (signal.SIGTERM, signal.SIGINT):
            row = Row("stop", f"{sig.name} to the process group: {phase}")
            for _ in range(tries):
                row.tried += 1
                with tempfile.TemporaryDirectory() as tmp:
                    row_ok, note = _stop_once(Path(tmp), reference, sig, reached)
                row.survived += int(row_ok)
                row.lost += int(not row_ok)
                row.note = note if not row_ok or not row.note else row.note
            rows.append(row)
            print(f"  {row.name}: {row.survived}/{row.tried} ({row.note})", flush=True)


def _stop_once(
    store: Path, reference: str, sig: signal.Signals, reached: Callable[[int, Path], bool]
) -> tuple[bool, str]:
    proc = _popen(STOP_RUN, store, start_new_session=True)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline and not reached(proc.pid, store):
        time.sleep(0.02)
    if proc.poll() is not None:
        return False, f"ended before the phase, rc {proc.returncode}"
    sent = time.perf_counter()
    os.killpg(proc.pid, sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    took = time.perf_counter() - sent
    left_running = [s for s in _statuses(store) if s == "RUNNING"] if _tagged_run(store) else []
    expected_rc = 143 if sig == signal.SIGTERM else 130
    if _tagged_run(store) and _statuses(store)[0] == "FINISHED":  # the signal came as it ended
        said = proc.returncode == 0 or "is FINISHED" in _tail(err)
        ok = proc.returncode in (0, expected_rc) and said and took <= 2.0
        return ok, f"exit {proc.returncode} in {took:.2f} s, the run FINISHED; {_tail(err)[:60]}"
    hint = _hint(err)
    if proc.returncode != expected_rc or took > 2.0 or left_running or hint is None:
        return False, (
            f"rc {proc.returncode} after {took:.2f} s, RUNNING left {len(left_running)}, "
            f"{_tail(err)}"
        )
    res = subprocess.run(
        hint, capture_output=True, text=True, timeout=600, env=_env(store), cwd=store
    )
    ok = res.returncode == 0 and _final_digest(res.stdout) == reference
    note = f"exit {proc.returncode} in {took:.2f} s; {_tail(err)[:90]}"
    return ok, f"{note}; hint rc {res.returncode}"


def worker_kills(rows: list[Row], reference: str, tries: int, rng: random.Random) -> None:
    row = Row("fault", "worker killed at a random round")
    for _ in range(tries):
        row.tried += 1
        with tempfile.TemporaryDirectory() as tmp:
            k = rng.randrange(0, 30)
            res = raysim(["run", QUICK, f"faults.kill_worker.round={k}"], Path(tmp))
            ok = _final_digest(res.stdout) == reference
            row.survived += int(ok)
            row.lost += int(not ok)
    rows.append(row)
    print(f"  {row.name}: {row.survived}/{row.tried}", flush=True)


def _coordinator_pid(driver: int) -> int | None:
    """The coordinator actor's process among the driver's descendants (Ray names it)."""
    import psutil

    for child in psutil.Process(driver).children(recursive=True):
        try:
            if any("ray::Coordinator" in part for part in child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return None


def coordinator_kills(
    rows: list[Row], reference: str, tries: int, rng: random.Random, run_s: float
) -> None:
    """SIGKILL the coordinator's process at a random moment of its life (``run_s``: the
    reference run's wall time); the same invocation must finish with the reference digest (the
    driver starts another coordinator and replays)."""
    row = Row("fault", "coordinator process killed at a random moment")
    for i in range(tries):
        row.tried += 1
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp)
            every = 3 * (i % 2)  # with and without checkpoints
            started = time.time()
            proc = _popen(["run", QUICK, f"checkpoint.every={every}"], store)
            killed_at, deadline = None, None
            while killed_at is None and proc.poll() is None:
                pid = _coordinator_pid(proc.pid)
                if pid is not None and deadline is None:  # a moment of its life, as it began
                    left = max(0.5, run_s - (time.time() - started))
                    deadline = time.time() + rng.uniform(0.0, 0.8 * left)
                if pid is not None and time.time() >= deadline:
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.time() - deadline
                time.sleep(0.05)
            out, err = proc.communicate(timeout=600)
            ok = proc.returncode == 0 and _final_digest(out) == reference
            ok = ok and _statuses(store) == ["FINISHED"] and killed_at is not None
            row.survived += int(ok)
            row.lost += int(not ok)
            if not ok:
                row.note = f"rc {proc.returncode}, killed: {killed_at is not None}; {_tail(err)}"
    rows.append(row)
    print(f"  {row.name}: {row.survived}/{row.tried}", flush=True)


#: Ditto on the quickstart with its personal models in a store on disk (issue 43)
DISK_RUN = ["run", QUICK, "algorithm.name=ditto", "rounds=10", "clients.state.store=disk",
            "clients.state.dir=states"]  # fmt: skip


def _checkpoint_round(store: Path) -> int:
    """The round the newest run's newest checkpoint resumes at (0: none yet)."""
    if not _tagged_run(store, "raysim.checkpoint_round"):
        return 0
    return int(_runs(store)[0].data.tags["raysim.checkpoint_round"])


def personal_store(rows: list[Row], tries: int, rng: random.Random) -> None:
    """Personal state on disk: the memory store's run; a worker killed, and the coordinator's
    process killed, at random moments, end on the same weights with every client's state there;
    a resume whose store was deleted is refused in one line, the run left KILLED."""
    with tempfile.TemporaryDirectory() as tmp:
        reference = _final_digest(raysim(DISK_RUN, Path(tmp)).stdout)
        memory = _final_digest(raysim([*DISK_RUN, "clients.state.store=memory"], Path(tmp)).stdout)
    row = Row("store", "disk store: the memory store's weights", tried=1)
    row.survived = int(reference is not None and memory == reference)
    row.lost = 1 - row.survived
    rows.append(row)
    kill = Row("store", "disk store: a worker killed at a random round")
    for _ in range(tries):
        kill.tried += 1
        with tempfile.TemporaryDirectory() as tmp:
            k = rng.randrange(0, 10)
            res = raysim([*DISK_RUN, f"faults.kill_worker.round={k}"], Path(tmp))
            ok = _final_digest(res.stdout) == reference
            kill.survived += int(ok)
            kill.lost += int(not ok)
    rows.append(kill)
    coord = Row("store", "disk store: the coordinator's process killed at a random moment")
    for _ in range(tries):
        coord.tried += 1
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp)
            proc = _popen([*DISK_RUN, "checkpoint.every=3"], store)
            killed = False
            while not killed and proc.poll() is None:
                pid = _coordinator_pid(proc.pid)
                if pid is not None and _set_up_for(store, rng.uniform(0.0, 1.5)):
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                time.sleep(0.05)
            out, err = proc.communicate(timeout=600)
            ok = killed and proc.returncode == 0 and _final_digest(out) == reference
            coord.survived += int(ok)
            coord.lost += int(not ok)
            if not ok:
                coord.note = f"rc {proc.returncode}, killed: {killed}; {_tail(err)}"
    rows.append(coord)
    gone = Row("store", "a resume whose store was deleted", tried=1)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        longer = [*DISK_RUN, "rounds=200", "checkpoint.every=1"]  # stopped long before its end
        proc = _popen(longer, store, start_new_session=True)
        while proc.poll() is None and _checkpoint_round(store) < 2:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
        for folder in (store / "states").iterdir():
            shutil.rmtree(folder)
        res = raysim(["run", "--resume", _run_id(store) or "none"], store)
        lines = res.stderr.strip().splitlines()
        ok = res.returncode == 1 and len(lines) == 1 and "is gone" in lines[0]
        ok = ok and "RUNNING" not in _statuses(store)
        gone.survived, gone.lost = int(ok), int(not ok)
        gone.note = _tail(res.stderr)[:90]
    rows.append(gone)
    for r in rows[-4:]:
        print(f"  {r.name}: {r.survived}/{r.tried} {r.note}", flush=True)


def _freeze(path: Path, frozen: bool) -> None:
    """Make ``path`` unwritable, even for root (``chattr +i``), or writable again."""
    subprocess.run(["chattr", "-R", "+i" if frozen else "-i", str(path)], check=True)


def read_only_artifacts(rows: list[Row], reference: str) -> None:
    """The artifact directory turns read-only after the first checkpoint: the run must finish
    with the reference weights, saved by the driver, and the MLflow run must say FAILED."""
    row = Row("fault", "artifact directory read-only mid-run", tried=1)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        proc = _popen(["run", QUICK, "checkpoint.every=3"], store)
        deadline = time.time() + 300
        while time.time() < deadline and not list(
            store.glob("mlruns/*/*/artifacts/checkpoint/*/meta.json")
        ):
            time.sleep(0.2)
        _freeze(store / "mlruns", True)
        try:
            out, err = proc.communicate(timeout=600)
        finally:
            _freeze(store / "mlruns", False)
        saved = list(store.glob("raysim-unsaved/*/weights.safetensors"))
        ok = proc.returncode == 1 and _final_digest(out) == reference and len(saved) == 1
        ok = ok and _statuses(store) == ["FAILED"] and "Traceback" not in err
        row.survived, row.lost = int(ok), int(not ok)
        row.note = _tail(err) if not ok else "exit 1; weights saved by the driver; run FAILED"
    rows.append(row)
    print(f"  {row.name}: {row.survived}/{row.tried}", flush=True)


#: Run in a mount namespace of its own (``unshare --mount``): a small tmpfs at $1 takes the
#: checkpoints; once the first is there, a filler leaves half a checkpoint free, so the next one
#: runs out of space midway (and every one after it). The run must go on; then the filler goes,
#: and the folder is copied out (the tmpfs ends with the namespace).
FULL_DISK_SH = """
mount -t tmpfs -o size=16m none "$1" || exit 97
"$2" -c '
import os, sys, time
from pathlib import Path
d = Path(sys.argv[1]) / "ckpt"
while not (d / "LATEST").exists():
    time.sleep(0.05)
first = d / (d / "LATEST").read_text().strip()
size = sum(p.stat().st_size for p in first.iterdir())
st = os.statvfs(sys.argv[1])
with open(Path(sys.argv[1]) / "filler", "wb") as f:
    f.write(b"x" * max(0, st.f_bavail * st.f_frsize - size // 2))
print("FILLED", first.name, flush=True)
' "$1" &
shift 2
"$@"; code=$?
wait
rm -f "$DISK/filler"
cp -a "$DISK/ckpt" "$SAVE" || exit 98
exit $code
"""


def full_disk(rows: list[Row], reference: str) -> None:
    """The disk under ``checkpoint.dir`` fills during a checkpoint: the run must finish with the
    reference weights, warn, leave the previous checkpoint current and no half-written folder,
    and that checkpoint must resume to the reference weights."""
    row = Row("fault", "disk full during a checkpoint (tmpfs)", tried=1)
    with tempfile.TemporaryDirectory() as tmp:
        store, disk, save = Path(tmp), Path(tmp) / "disk", Path(tmp) / "saved"
        disk.mkdir()
        argv = [*RAYSIM, "run", QUICK, "checkpoint.every=1", f"checkpoint.dir={disk}/ckpt",
                "tracking.enabled=false"]  # fmt: skip
        res = subprocess.run(
            ["unshare", "--mount", "sh", "-c", FULL_DISK_SH, "sh", str(disk), sys.executable,
             *argv],
            capture_output=True, text=True, timeout=900, cwd=store,
            env={**_env(store), "DISK": str(disk), "SAVE": str(save)},
        )  # fmt: skip
        problems = []
        if res.returncode == 97:
            row.tried, row.note = 0, "cannot mount a tmpfs here (needs root)"
            rows.append(row)
            return
        if res.returncode != 0 or _final_digest(res.stdout) != reference:
            problems.append(f"run: exit {res.returncode}, {_tail(res.stderr)}")
        if "not written" not in res.stderr:
            problems.append("no warning")
        left = sorted(p.name for p in save.iterdir()) if save.exists() else []
        if len([n for n in left if n.startswith("round-")]) != 1 or any(
            n.startswith(".writing") for n in left
        ):
            problems.append(f"folder holds {left}")
        if not problems:
            again = raysim(["run", "--resume", str(save), f"checkpoint.dir={store}/after"], store)
            if _final_digest(again.stdout) != reference:
                problems.append(f"resume: {_tail(again.stderr)}")
        row.survived, row.lost = int(not problems), int(bool(problems))
        row.note = "; ".join(problems) or "run finished; previous checkpoint resumed to the digest"
    rows.append(row)
    print(f"  {row.name}: {row.note}", flush=True)


def locked_store(rows: list[Row], reference: str, hold_s: tuple[float, ...] = (3.0, 12.0)) -> None:
    """Another process holds the sqlite store's write lock for ``hold_s`` seconds while the run
    checkpoints every round ("database is locked"): the run must finish FINISHED with the
    reference weights."""
    import sqlite3

    for hold in hold_s:
        row = Row("fault", f"tracking store locked for {hold:g} s mid-run", tried=1)
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp)
            proc = _popen(["run", QUICK, "checkpoint.every=1"], store)
            deadline = time.time() + 300
            while time.time() < deadline and not _tagged_run(store, "raysim.checkpoint_round"):
                time.sleep(0.2)
            db = sqlite3.connect(store / "mlflow.db", timeout=60)
            db.execute("BEGIN EXCLUSIVE")
            time.sleep(hold)
            waited = proc.poll() is None  # the run was held up, not done before the lock
            db.rollback()
            db.close()
            out, err = proc.communicate(timeout=900)
            ok = proc.returncode == 0 and _final_digest(out) == reference
            ok = ok and _statuses(store) == ["FINISHED"]
            row.survived, row.lost = int(ok), int(not ok)
            row.note = (
                f"finished FINISHED, same digest; {'still running' if waited else 'done'} when "
                "the lock was released"
                if ok
                else f"exit {proc.returncode}: {_tail(err)}"
            )
        rows.append(row)
        print(f"  {row.name}: {row.note}", flush=True)


def shared_folder(rows: list[Row], reference: str) -> None:
    """Two runs given one ``checkpoint.dir``: the second is refused in one line (exit 2) while
    the first runs on to the reference weights."""
    row = Row("fault", "two runs on one checkpoint.dir", tried=1)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        folder = store / "shared"
        first = _popen(["run", QUICK, "checkpoint.every=1", f"checkpoint.dir={folder}"], store)
        deadline = time.time() + 300
        while time.time() < deadline and not (folder / "LATEST").exists():
            time.sleep(0.2)
        second = raysim(["run", QUICK, f"checkpoint.dir={folder}", "seed=5"], store)
        out, err = first.communicate(timeout=900)
        lines = second.stderr.strip().splitlines()
        problems = []
        if second.returncode != 2 or len(lines) != 1 or "in use by another run" not in lines[0]:
            problems.append(f"second: exit {second.returncode}, {_tail(second.stderr)}")
        if first.returncode != 0 or _final_digest(out) != reference:
            problems.append(f"first: exit {first.returncode}, {_tail(err)}")
        row.survived, row.lost = int(not problems), int(bool(problems))
        row.note = "; ".join(problems) or (lines[0][:90] if lines else "")
    rows.append(row)
    print(f"  {row.name}: {row.note}", flush=True)


def _env(store: Path) -> dict[str, str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}"}
    env.pop("RAY_ADDRESS", None)
    return env


def _popen(args: list[str], store: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*RAYSIM, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(store),
        cwd=store,
        **kw,
    )


def _tail(err: str) -> str:
    lines = err.strip().splitlines()
    return lines[-1][:160].replace("|", "/") if lines else "no stderr"


def concurrent_runs(rows: list[Row], n: int = 8) -> None:
    row = Row("fault", f"{n} concurrent runs on one fresh store", tried=n)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}"}
        env.pop("RAY_ADDRESS", None)
        procs = [
            subprocess.Popen(
                [*RAYSIM, "run", QUICK, "rounds=3", f"seed={i}", "workers.count=1"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=store,
            )
            for i in range(n)
        ]
        codes = [p.wait(timeout=900) for p in procs]
        statuses = _statuses(store)
        row.survived = sum(1 for s in statuses if s == "FINISHED")
        row.lost = n - row.survived
        row.note = f"exit codes {sorted(set(codes))}"
    rows.append(row)
    print(f"  {row.name}: {row.survived}/{row.tried}", flush=True)


def stale_cluster_file(rows: list[Row], reference: str) -> None:
    row = Row("fault", "stale Ray current-cluster file", tried=1)
    path = Path("/tmp/ray/ray_current_cluster")
    backup = path.read_bytes() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("127.0.0.1:7\n")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            res = raysim(["run", QUICK], Path(tmp), timeout=300)
        ok = _final_digest(res.stdout) == reference
        row.survived, row.lost = int(ok), int(not ok)
    finally:
        if backup is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(backup)
    rows.append(row)
    print(f"  {row.name}: {row.survived}/{row.tried}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # each fault: (reference digest, tries, rng, the reference run's wall seconds) -> rows
    faults = {
        "workers": lambda ref, t, rng, s: worker_kills(rows, ref, t, rng),
        "coordinator": lambda ref, t, rng, s: coordinator_kills(rows, ref, t, rng, s),
        "read-only": lambda ref, t, rng, s: read_only_artifacts(rows, ref),
        "signals": lambda ref, t, rng, s: driver_signals(rows, ref, t, rng, s),
        "stops": lambda ref, t, rng, s: group_stops(rows, t),
        "concurrent": lambda ref, t, rng, s: concurrent_runs(rows),
        "stale-cluster": lambda ref, t, rng, s: stale_cluster_file(rows, ref),
        "store": lambda ref, t, rng, s: personal_store(rows, t, rng),
        "full-disk": lambda ref, t, rng, s: full_disk(rows, ref),
        "locked-store": lambda ref, t, rng, s: locked_store(rows, ref),
        "shared-folder": lambda ref, t, rng, s: shared_folder(rows, ref),
    }
    parser.add_argument("--only", choices=["inputs", "methods", "faults", *faults], default=None)
    parser.add_argument("--tries", type=int, default=2, help="tries per random fault row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", default="", help="method matrix: paths containing this")
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    rows: list[Row] = []
    rng = random.Random(args.seed)
    if args.only in (None, "inputs"):
        print(f"bad inputs ({len(BAD_INPUTS)} kinds)", flush=True)
        bad_inputs(rows)
    if args.only in (None, "methods"):
        print("every method x every example config", flush=True)
        method_matrix(rows, args.examples)
    if args.only not in ("inputs", "methods"):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.time()
            ref = raysim(["run", QUICK], Path(tmp))
            run_s = time.time() - t0  # faults strike at random moments within a run this long
        reference = _final_digest(ref.stdout)
        print(
            f"reference digest (uninterrupted quickstart) = {reference}, {run_s:.1f} s", flush=True
        )
        for name, fault in faults.items():
            if args.only in (None, "faults", name):
                fault(reference, args.tries, rng, run_s)
    print("\n| kind | case | tried | survived | lost | note |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.kind} | {r.name} | {r.tried} | {r.survived} | {r.lost} | {r.note} |")
    print(
        f"\ntotal: tried={sum(r.tried for r in rows)} survived={sum(r.survived for r in rows)} "
        f"lost={sum(r.lost for r in rows)}"
    )


if __name__ == "__main__":
    main()
