"""The figures of one ``gpu_e2e.sh`` call, from its steps' files, whatever steps finished.

Each step writes ``WORK/<step>.json`` stamped with the call's run id (``RAYSIM_E2E_RUN``), after
each of its runs; the orchestrator writes ``WORK/steps.json`` (each step's status and seconds).
``report`` reads only files stamped with this call's id, so a report never shows a figure from an
earlier call's files, and names the files it left out. It tolerates any step missing, failed, cut
or half done: a ratio is written only where both of its runs finished. ``publish`` copies the
report into ``$OUT`` beside and renames it, so a call killed at any moment leaves the report of
the last save whole.

Only the standard library here: the orchestrator and every step import this.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

RUN_KEY = "_run"
STEP_FILES = ("preflight", "plain", "fedit", "fedit_more", "backends", "backends_more",
              "fedbaf", "gpu_tests", "fedoa", "tune")  # fmt: skip
#: FedIT's placements, as their rows read
PLACEMENT_NAMES = {
    "w1_seq": "1 worker at 1.0 GPU, one client after another",
    "w4_seq": "4 workers at 0.25 GPU",
    "w1_lora8": "1 worker, multi-LoRA groups of 8",
    "w1_seq_fast": "1 worker, workers.cuda_deterministic=false",
    "w4_lora2": "4 workers, multi-LoRA groups of 2",
}


def run_id() -> str:
    return os.environ.get("RAYSIM_E2E_RUN", "adhoc")


def write_atomic(path: Path, text: str) -> None:
    """``path`` replaced whole: written beside, flushed, renamed."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(work: Path, step: str, result: dict[str, Any]) -> None:
    """A step's figures so far, stamped with this call's id; then the report, republished."""
    write_atomic(work / f"{step}.json", json.dumps({**result, RUN_KEY: run_id()}, indent=1,
                                                   default=str))  # fmt: skip
    out = os.environ.get("RAYSIM_E2E_PUBLISH")
    if out:
        report(work, run_id(), quiet=True)
        publish(work, Path(out))


def load(work: Path, step: str, run: str, stale: list[str] | None = None) -> dict[str, Any] | None:
    """``WORK/<step>.json`` if this call (``run``) wrote it; else None, its name in ``stale``."""
    path = work / f"{step}.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if data.get(RUN_KEY) != run:
        if stale is not None:
            stale.append(f"{path.name} (run {data.get(RUN_KEY, 'unstamped')})")
        return None
    data.pop(RUN_KEY)
    return data


def publish(work: Path, out: Path) -> None:
    """The report into ``out`` (each file replaced whole), unless ``out`` is ``work``."""
    if out.resolve() == work.resolve():
        return
    out.mkdir(parents=True, exist_ok=True)
    for name in ("figures.md", "figures.json"):
        src = work / name
        if src.is_file():
            tmp = out / f".{name}.tmp{os.getpid()}"
            shutil.copyfile(src, tmp)
            os.replace(tmp, out / name)


def _ok(r: Any) -> bool:
    """A run that finished: a dict with its throughput, no error."""
    return isinstance(r, dict) and "error" not in r and "skipped" not in r


def _ratio(a: Any, b: Any, key: str = "tokens_per_s") -> float | None:
    if _ok(a) and _ok(b) and a.get(key) and b.get(key):
        return a[key] / b[key]
    return None


def _gib(b: Any) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _split(r: dict[str, Any]) -> str:
    s = r.get("split_s", {})
    parts = ("client_compute", "transfer_and_scheduling", "aggregation", "other")
    return " / ".join(_f(s.get(p)) for p in parts)


def _row(name: str, r: Any, plain: Any) -> str:
    if not isinstance(r, dict):
        return f"| {name} | not run | | | | | | |"
    if "error" in r:
        return f"| {name} | **failed**: {r['error'].splitlines()[0][:120]} | | | | | | |"
    if "skipped" in r:
        return f"| {name} | not started: {r['skipped']} | | | | | | |"
    vs = _ratio(r, plain)
    peaks = ", ".join(_gib(w.get("peak_gpu_bytes")) for w in r.get("workers", []))
    return (
        f"| {name} | {_f(r.get('tokens_per_s'), '.0f')} | {_f(vs)} | {_f(r.get('round_s'))} | "
        f"{_split(r)} | {_f(r.get('split_s', {}).get('evaluation_total'), '.2f')} | {peaks} | "
        f"{str(r.get('digest', ''))[:8]} ({r.get('rounds', '?')}) |"
    )


def _steps_table(steps: dict[str, Any]) -> list[str]:
    lines = ["| step | status | planned s | limit s | wall s |", "|---|---|---|---|---|"]
    for name, s in steps.get("steps", {}).items():
        lines.append(
            f"| `{name}` | {s.get('status', '?')} | {_f(s.get('planned_s'), '.0f')} | "
            f"{_f(s.get('limit_s'), '.0f')} | {_f(s.get('wall_s'), '.1f')} |"
        )
    return lines


def figures_of(data: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """The figures the issue asks for, from whichever steps finished (``data``: step → file)."""
    pre, plain = data.get("preflight") or {}, data.get("plain")
    fedit, more = data.get("fedit") or {}, data.get("fedit_more") or {}
    backends = {**(data.get("backends") or {}), **(data.get("backends_more") or {})}
    fedoa, tune, fedbaf = data.get("fedoa"), data.get("tune"), data.get("fedbaf")
    tests = data.get("gpu_tests")
    ref = more.get("w1_seq") if _ok(more.get("w1_seq")) else fedit.get("w1_seq")
    out: dict[str, Any] = {}
    if pre:
        out["gpus_counted"] = pre.get("gpus", {}).get("raysim")
        out["preflight_s"] = pre.get("preflight_s")
    candidates = {
        "fm_e2e_ratio": _ratio(ref, plain),
        "four_workers_vs_one": _ratio(fedit.get("w4_seq"), ref),
        "multilora_vs_sequential": _ratio(fedit.get("w1_lora8"), ref),
        "fm_e2e_ratio_fast_kernels": _ratio(more.get("w1_seq_fast"), plain),
        "deterministic_kernels_cost": _ratio(more.get("w1_seq_fast"), ref),
        "four_workers_lora2_vs_one": _ratio(more.get("w4_lora2"), ref),
        "fedoa_cost_vs_fedit": _ratio(ref, fedoa),
    }
    out.update({k: v for k, v in candidates.items() if v is not None})
    for key in ("placement_digest_equal", "placement_weight_gap", "four_workers_gpu_ids",
                "four_workers_one_gpu"):  # fmt: skip
        for step in (fedit, more):  # part 1's placements, or part 2's
            if key in step:
                out[key] = step[key]
    for name, r in backends.items():
        vs = _ratio(r, ref)
        if vs is not None:
            out[f"{name}_vs_torch"] = vs
        if _ok(r) and "engine_s_per_call" in r:
            out[f"{name}_engine_s_per_call"] = r["engine_s_per_call"]
            out[f"{name}_engine_share"] = r["engine_share_of_training"]
    if tune and "error" not in tune:
        out["tune_sweep_wall_s"] = tune.get("sweep_wall_s")
        out["tune_trials"] = tune.get("trials")
    if _ok(fedbaf):
        out["fedbaf_round_s"] = fedbaf.get("round_s")
        out["fedbaf_server_share"] = fedbaf.get("server_share")
        out["fedbaf_audit_share"] = fedbaf.get("audit_share")
    if tests and "summary" in tests:
        out["cuda_tests"] = tests["summary"]
    return {k: v for k, v in out.items() if v is not None}


def report(work: Path, run: str, quiet: bool = False) -> dict[str, Any]:
    """``WORK/figures.md`` and ``figures.json`` from this call's files; the figures."""
    stale: list[str] = []
    data = {step: load(work, step, run, stale) for step in STEP_FILES}
    steps = load(work, "steps", run, stale) or {}
    pre = data["preflight"] or {}
    lines = [
        f"# gpu_e2e: run {run}, shape {steps.get('shape', pre.get('shape', '?'))}, "
        f"part {steps.get('part', '?')}",
        "",
        f"Device: {pre.get('device', '?')}; {pre.get('machine', '?')}.",
        "",
    ]
    lines += [f"- {name} {where}" for name, where in pre.get("libraries", {}).items()]
    if pre.get("environment"):
        lines.append(f"- {pre['environment']}")
    lines += ["", "## Steps", "", *_steps_table(steps), ""]
    plain = data["plain"]
    rows = []
    if isinstance(plain, dict):
        if "error" in plain:
            rows.append(f"| plain PEFT loop | **failed**: {plain['error'][:120]} | | | | | | |")
        else:
            rows.append(
                f"| plain PEFT loop | {_f(plain.get('tokens_per_s'), '.0f')} | 1 | "
                f"{_f(plain.get('round_s'))} | - | - | {_gib(plain.get('peak_gpu_bytes'))} | - |"
            )
    for step in ("fedit", "fedit_more"):
        for key, r in (data[step] or {}).items():
            if key in PLACEMENT_NAMES:
                rows.append(_row(f"FedIT {key}: {PLACEMENT_NAMES[key]}", r, plain))
    for step in ("backends", "backends_more"):
        for key, r in (data[step] or {}).items():
            rows.append(_row(f"FedIT w1_seq, {key}", r, plain))
    if data["fedoa"] is not None:
        rows.append(_row("FedOA w1_seq", data["fedoa"], plain))
    if rows:
        lines += [
            "## Runs",
            "",
            "| run | tokens/s | vs plain PEFT | round s | compute / transfer / aggregation / "
            "other s | eval s (total) | peak GiB per worker | digest (rounds) |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    figures = figures_of(data)
    lines += ["## Figures", "", "| figure | value |", "|---|---|"]
    lines += [
        f"| `{k}` | {v:.4g} |" if isinstance(v, float) else f"| `{k}` | {v} |"
        for k, v in figures.items()
    ]
    if stale:
        lines += ["", f"Left out, written by another call: {', '.join(stale)}."]
    text = "\n".join(lines) + "\n"
    write_atomic(work / "figures.md", text)
    write_atomic(work / "figures.json", json.dumps({"run": run, **figures}, indent=1))
    if not quiet:
        print(text, flush=True)
    return figures
