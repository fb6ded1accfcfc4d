"""One call of ``benchmarks/gpu_e2e.sh``: the plan's steps in order, each in its own process
under its limit, one Ray for them all, and the report republished after every step.

- The call has an id (``RAYSIM_E2E_RUN``) and a work folder of its own (a fresh temporary one
  unless ``RAYSIM_E2E_WORK`` names one); every file a step writes is stamped with the id, so a
  report holds this call's figures only.
- The preflight runs first, within a minute: a broken environment ends the call there, with
  one line naming the cause (exit 3).
- A step that fails or is cut at its limit costs only itself; a step with less than half its
  planned seconds left of the call's budget is not started, and the report says so.
- After each step: the wait until its actors have given back the GPU, the report into ``$OUT``
  (each file replaced whole) and the logs' archive (likewise), so a call killed at any moment
  keeps every step finished before it.

Only the standard library here: nothing heavy is imported before the preflight says it can be.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_e2e_plan as plans  # noqa: E402
from gpu_e2e_report import publish, report, save  # noqa: E402

#: left out of the logs' archive: the runs' stores, artifacts and models
HEAVY = {"artifacts", "mlartifacts", "mlflow.db", "tune", "foundation-vit"}
#: the Ray folders of this script's calls (an earlier call killed whole leaves its Ray running)
RAY_PREFIX = "raysim-e2e-ray-"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_pids(marker: str) -> list[int]:
    """Processes of the Ray whose folder ``marker`` names (or begins), not this one: by their
    command line, or by ``RAYSIM_E2E_RAY`` in their environment (Ray's agents rename
    themselves, and their command line no longer names the folder)."""
    pids = []
    tag = f"RAYSIM_E2E_RAY={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in cmdline or tag in environ:
            pids.append(int(entry.name))
    return pids


def stop_ray(marker: str, grace_s: float = 5.0) -> int:
    """Stops every process of the Ray whose folder ``marker`` names; how many there were."""
    pids = ray_pids(marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        end = time.time() + grace_s
        while time.time() < end and ray_pids(marker):
            time.sleep(0.2)
        if not ray_pids(marker):
            break
    return len(pids)


def archive(work: Path, out: Path) -> None:
    """Every step's log and JSON as ``out/e2e-logs.tar.gz``, replaced whole."""
    if out.resolve() == work.resolve():
        return
    tmp = out / f".e2e-logs.tar.gz.tmp{os.getpid()}"

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        return None if set(parts) & HEAVY or parts[-1].startswith(".") else info

    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(work, arcname="e2e", filter=keep)
    os.replace(tmp, out / "e2e-logs.tar.gz")


def run_step(
    cmd: list[str], limit: float, log: Path, env: dict[str, str]
) -> tuple[int | None, float, str]:
    """The step's process (its own process group, in this session: killed with the call) under
    ``limit`` seconds; (exit code or None if cut, seconds, the cause of a failure)."""
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, process_group=0)
        try:
            rc: int | None = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = None
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
    wall = time.time() - t0
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith("FAILED: ")]
    cause = failed[-1][len("FAILED: ") :] if failed else (lines[-1] if lines else "no output")
    return rc, wall, cause[:300]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(plans.COSTS), default="7b")
    parser.add_argument("--part", type=int, choices=sorted(plans.PARTS), default=1)
    parser.add_argument("--out", default="gpu-out")
    parser.add_argument("--budget", type=float, default=450.0, help="the call's seconds at most")
    args = parser.parse_args()

    t_start = time.time()
    deadline = t_start + args.budget
    run = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("RAYSIM_E2E_WORK") or tempfile.mkdtemp(prefix="raysim-gpu-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    ray_dir = tempfile.mkdtemp(prefix=RAY_PREFIX)
    address = f"127.0.0.1:{os.environ.get('RAYSIM_E2E_PORT') or free_port()}"
    env = {**os.environ, "RAYSIM_E2E_RUN": run, "RAYSIM_E2E_PUBLISH": str(out),
           "RAYSIM_E2E_RAY": ray_dir}  # fmt: skip
    os.environ.update(RAYSIM_E2E_RUN=run, RAYSIM_E2E_PUBLISH=str(out))
    with contextlib.suppress(FileNotFoundError):
        (out / "e2e-logs.tar.gz").unlink()  # an earlier call's
    only = os.environ.get("ONLY", "").split()
    only_steps = {w.split(":", 1)[0] for w in only}
    status: dict[str, Any] = {"shape": args.shape, "part": args.part, "budget_s": args.budget,
                              "work": str(work), "steps": {}}  # fmt: skip
    save(work, "steps", status)  # the report in $OUT is this call's from its first second
    print(f"gpu_e2e: run {run}, shape {args.shape}, part {args.part}, budget {args.budget:.0f} s;"
          f" work in {work}; Ray in {ray_dir}; figures in {out}", flush=True)  # fmt: skip
    if args.shape != "tiny" and shutil.which("nvidia-smi"):  # an earlier call killed whole
        stopped = stop_ray(RAY_PREFIX)
        if stopped:
            print(f"gpu_e2e: stopped {stopped} processes of an earlier call's Ray", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below stops Ray
    failed: list[str] = []
    last_line = ""
    try:
        for name, cost in plans.plan(args.shape, args.part):
            if only and name != "preflight" and name not in only_steps:
                continue
            entry = status["steps"][name] = {"planned_s": cost.seconds}
            left = deadline - time.time()
            if name != "preflight" and left < cost.seconds / 2:
                entry["status"] = (f"not started: {left:.0f} s left of the call's budget, "
                                   f"{cost.seconds:.0f} s planned")  # fmt: skip
                print(f"=== {name}: {entry['status']}", flush=True)
                save(work, "steps", status)
                continue
            limit = min(plans.step_limit(args.shape, name), max(left, 1.0))
            entry.update(status="running, or cut with the call", limit_s=limit)
            save(work, "steps", status)
            print(f"=== {name} (planned {cost.seconds:.0f} s, limit {limit:.0f} s)", flush=True)
            cmd = [sys.executable, str(HERE / "gpu_e2e.py"), name, "--shape", args.shape,
                   "--out", str(work), "--address", address,
                   "--deadline", str(time.time() + limit)]  # fmt: skip
            if name == "preflight":
                cmd += ["--ray-dir", ray_dir]
            rc, wall, cause = run_step(cmd, limit, work / f"{name}.log", env)
            entry["wall_s"] = wall
            if rc == 0:
                entry["status"] = "finished"
            elif rc is None:
                entry["status"] = f"**cut at its limit of {limit:.0f} s**: {cause}"
            else:
                entry["status"] = f"**failed** (exit {rc}): {cause}"
            print(f"{name} ({wall:.1f} s): {entry['status']}", flush=True)
            save(work, "steps", status)
            if rc != 0:
                failed.append(name)
                if name == "preflight":
                    last_line = (
                        f"gpu_e2e: preflight failed in {time.time() - t_start:.0f} s: {cause}"
                    )
                    return 3
            if name != "preflight":
                settle = [sys.executable, str(HERE / "gpu_e2e.py"), "settle", "--address",
                          address, "--out", str(work), "--wait", "30"]  # fmt: skip
                run_step(settle, 45, work / f"{name}.settle.log", env)
            archive(work, out)
    finally:
        stop_ray(ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)
        report(work, run, quiet=bool(last_line))
        publish(work, out)
        archive(work, out)
        if last_line:  # the preflight's cause, one line, last
            print(last_line, flush=True)
    if failed:
        print(f"failed steps: {' '.join(failed)} (logs in {work}, and {out}/e2e-logs.tar.gz)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
