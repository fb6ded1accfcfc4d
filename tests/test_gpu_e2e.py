"""The GPU call's script (benchmarks/gpu_e2e.sh): its plan fits the call, its preflight ends a
broken environment in under a minute with one line, and its report keeps every finished step
and no other call's figure.

The tests marked ``e2e`` run the whole script on the tiny shape (minutes); ``make gpu-check``
runs them under Python 3.12 with the GPU image's packages and the cp312 bundle (the variables
PYTHON, RAYSIM_BUNDLE, RAYSIM_SITE and RAYSIM_IMAGE_GUARD it sets pass through); the others run
in seconds with the suite."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_e2e_plan as plans  # noqa: E402
import gpu_e2e_report as reports  # noqa: E402
from gpu_e2e_run import stop_ray  # noqa: E402

GOLDEN = ROOT / "tests" / "goldens" / "gpu_e2e_tiny"
SCRIPT = ROOT / "benchmarks" / "gpu_e2e.sh"
#: a step's figures, as the report shows them once the step has finished
STEP_FIGURES = {
    "preflight": ["gpus_counted", "preflight_s"],
    "plain": [],  # the reference: a row of figures.md, and every ratio's denominator
    "fedit": ["fm_e2e_ratio", "four_workers_vs_one", "multilora_vs_sequential",
              "placement_digest_equal", "four_workers_one_gpu"],
    "backends": ["deepspeed_zero2_vs_torch", "accelerate_vs_torch",
                 "deepspeed_zero2_engine_s_per_call"],
    "fedbaf": ["fedbaf_round_s", "fedbaf_server_share", "fedbaf_audit_share"],
    "gpu_tests": ["cuda_tests"],
}  # fmt: skip


# --- the plan ---------------------------------------------------------------------------------


def test_part_one_fits_450_seconds_on_the_h200_and_each_step_has_its_cost():
    assert plans.planned_total("7b", 1) <= plans.PART1_MAX_S
    for shape in plans.COSTS:
        for part in plans.PARTS:
            names = [name for name, _ in plans.plan(shape, part)]
            assert names[0] == "preflight"
            for name, cost in plans.plan(shape, part):
                assert cost.seconds > 0 and plans.step_limit(shape, name) >= cost.seconds
    # the order of value: the reference, FedIT, a DeepSpeed stage and Accelerate, FedBaF
    assert plans.PARTS[1] == ["preflight", "plain", "fedit", "backends", "fedbaf", "gpu_tests"]
    assert set(plans.COST_7B["fedit"].runs) == {"w1_seq", "w4_seq", "w1_lora8"}
    assert set(plans.COST_7B["backends"].runs) == {"deepspeed_zero2", "accelerate"}


def test_every_run_the_plan_names_is_one_the_steps_know():
    import gpu_e2e

    for shape in plans.COSTS:
        for step in ("fedit", "fedit_more"):
            assert set(plans.COSTS[shape][step].runs) <= set(gpu_e2e.PLACEMENTS)
        for step in ("backends", "backends_more"):
            assert set(plans.COSTS[shape][step].runs) <= set(gpu_e2e.BACKENDS)
        assert set(plans.COSTS[shape]) - {"preflight"} == set(gpu_e2e.STEPS)


def test_docs_show_the_cost_model_as_the_script_plans_it():
    doc = (ROOT / "docs" / "gpu.md").read_text()
    for part in plans.PARTS:
        assert plans.table("7b", part) in doc, f"docs/gpu.md: part {part}'s table is stale"
    assert f"{plans.planned_total('7b', 1):.0f} s" in doc


# --- the report -------------------------------------------------------------------------------


def golden_work(tmp_path: Path, run: str = "golden", steps: list[str] | None = None) -> Path:
    """A work folder holding a real tiny call's files (tests/goldens/gpu_e2e_tiny), as ``run``."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    for path in GOLDEN.glob("*.json"):
        if steps is None or path.stem in steps or path.stem == "steps":
            data = json.loads(path.read_text())
            data["_run"] = run
            (work / path.name).write_text(json.dumps(data))
    return work


def test_the_golden_call_reports_every_figure(tmp_path):
    work = golden_work(tmp_path)
    figures = reports.report(work, "golden", quiet=True)
    for keys in STEP_FIGURES.values():
        assert set(keys) <= set(figures)
    assert figures["placement_digest_equal"] is True
    md = (work / "figures.md").read_text()
    assert re.search(r"\| plain PEFT loop \| \d+ \| 1 \|", md)


#: figures of one step that are ratios against another's run
DEPENDS = {"plain": {"fm_e2e_ratio"}, "fedit": {"deepspeed_zero2_vs_torch", "accelerate_vs_torch"}}


@pytest.mark.parametrize("missing", [s for s in STEP_FIGURES if s != "preflight"])
def test_a_missing_step_costs_only_its_own_figures(tmp_path, missing):
    work = golden_work(tmp_path, steps=[s for s in STEP_FIGURES if s != missing])
    figures = set(reports.report(work, "golden", quiet=True))
    lost = set(STEP_FIGURES[missing]) | DEPENDS.get(missing, set())
    assert not lost & figures
    assert {k for keys in STEP_FIGURES.values() for k in keys} - lost <= figures


def test_a_failed_placement_shows_as_failed_and_leaves_the_others(tmp_path):
    work = golden_work(tmp_path)
    fedit = json.loads((work / "fedit.json").read_text())
    fedit["w4_seq"] = {"error": "Failed: fedit_w4_seq: raysim run exited 1: CUDA out of memory"}
    for key in ("placement_digest_equal", "placement_weight_gap", "four_workers_gpu_ids",
                "four_workers_one_gpu"):  # fmt: skip
        fedit.pop(key)
    (work / "fedit.json").write_text(json.dumps(fedit))
    figures = reports.report(work, "golden", quiet=True)
    assert "four_workers_vs_one" not in figures and "placement_digest_equal" not in figures
    assert {"fm_e2e_ratio", "multilora_vs_sequential"} <= set(figures)
    md = (work / "figures.md").read_text()
    assert "| FedIT w4_seq: 4 workers at 0.25 GPU | **failed**: Failed: fedit_w4_seq" in md


def test_a_report_never_shows_a_figure_from_another_calls_files(tmp_path):
    # an earlier call's files are all there, with real figures in them
    work = golden_work(tmp_path, run="20261127T101010-aaaaaa")
    figures = reports.report(work, "20261128T120000-bbbbbb", quiet=True)
    assert figures == {}
    md = (work / "figures.md").read_text()
    assert "plain PEFT loop" not in md and "FedIT" not in md
    assert "Left out, written by another call: preflight.json (run 20261127T101010-aaaaaa)" in md
    # one step of this call beside the earlier call's others: no ratio mixes the two
    data = json.loads((GOLDEN / "plain.json").read_text())
    data["_run"] = "20261128T120000-bbbbbb"
    (work / "plain.json").write_text(json.dumps(data))
    figures = reports.report(work, "20261128T120000-bbbbbb", quiet=True)
    assert figures == {}
    assert "| plain PEFT loop |" in (work / "figures.md").read_text()


def test_publish_replaces_the_report_whole(tmp_path):
    work, out = golden_work(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "figures.md").write_text("an earlier call's report, 1.266\n")
    reports.report(work, "golden", quiet=True)
    reports.publish(work, out)
    assert (out / "figures.md").read_text() == (work / "figures.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary left


# --- the preflight ----------------------------------------------------------------------------


def script_env(**extra: str) -> dict[str, str]:
    """The environment the script runs under: ``make gpu-check``'s where it sets one (Python
    3.12, the bundle, the image guard), else this Python's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYSIM_E2E", "ONLY"))}
    env.setdefault("PYTHON", sys.executable)
    env["PATH"] = f"{Path(env['PYTHON']).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run_script(tmp_path: Path, *args: str, timeout: float = 90, **extra: str):
    """``gpu_e2e.sh ARGS`` with ``$OUT`` in tmp_path; (result, seconds, peak RSS of any process
    of it in MiB)."""
    out = tmp_path / "out"
    env = script_env(OUT=str(out), RAYSIM_E2E_WORK=str(tmp_path / "work"), **extra)
    probe = (
        "import resource, subprocess, sys, time\n"
        "t = time.time()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(p.returncode, time.time() - t, peak)\n"
        "sys.stdout.write(p.stdout)\n"
        "sys.stderr.write(p.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, "bash", str(SCRIPT), *args],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
    )  # fmt: skip
    first, _, stdout = proc.stdout.partition("\n")
    rc, wall, peak = first.split()
    result = subprocess.CompletedProcess(proc.args, int(rc), stdout, proc.stderr)
    return result, float(wall), float(peak)


def assert_one_line_cause(result: subprocess.CompletedProcess, wall: float, *words: str) -> str:
    assert result.returncode == 3, result.stdout + result.stderr
    assert wall < 60
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_e2e: preflight failed"), result.stdout
    for word in words:
        assert word in last, last
    return last


def test_no_bundle_ends_the_call_at_once_naming_it(tmp_path):
    result, wall, _ = run_script(tmp_path, "--shape", "tiny", RAYSIM_BUNDLE="cp399")
    assert_one_line_cause(result, wall, "the bundle could not be used")
    assert "no " in result.stdout + result.stderr and "bundle-cp399.tar.xz" in result.stderr
    assert wall < 5


@pytest.mark.slow
def test_the_gpu_image_without_its_bundle_fails_on_the_first_import_it_lacks(tmp_path):
    # the image guard makes this Python see only the GPU image's packages: no bundle, no Ray
    empty = tmp_path / "no-bundle"
    empty.mkdir()
    result, wall, _ = run_script(
        tmp_path, "--shape", "tiny", RAYSIM_IMAGE_GUARD="1", RAYSIM_SITE=str(empty),
        RAYSIM_BUNDLE="", RAYSIM_IMAGE_BLOCKED="",
    )  # fmt: skip
    last = assert_one_line_cause(result, wall, "cannot import", "no bundle was unpacked")
    assert "pydantic" in last or "ray" in last


@pytest.mark.matrix  # suite time (~15 s on 2 vCPUs): the fast suite's budget
@pytest.mark.slow
def test_the_7b_shape_without_a_gpu_stops_in_the_preflight_having_allocated_nothing_large(
    tmp_path,
):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "figures.md").write_text("| `tune_trials` | 4 |\n")  # an earlier call's
    result, wall, peak_mib = run_script(tmp_path)  # the default: the 7B shape
    assert_one_line_cause(result, wall, "no GPU counted", "needs a CUDA GPU")
    assert peak_mib < 2048, f"a process of the call reached {peak_mib:.0f} MiB"
    md = (tmp_path / "out" / "figures.md").read_text()
    assert "tune_trials" not in md and "no GPU counted" in md


# --- the whole script on the tiny shape (make gpu-check) ---------------------------------------


@pytest.mark.e2e
def test_ray_that_cannot_start_ends_the_call_with_its_reason(tmp_path):
    deep = tmp_path / ("d" * 100)  # Ray's sockets: at most 107 bytes of path
    deep.mkdir()
    result, wall, _ = run_script(tmp_path, "--shape", "tiny", TMPDIR=str(deep))
    assert_one_line_cause(result, wall, "Ray could not start", "AF_UNIX path length")


@pytest.mark.e2e
def test_a_port_in_use_ends_the_call_naming_it(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result, wall, _ = run_script(tmp_path, "--shape", "tiny", RAYSIM_E2E_PORT=str(port))
    assert_one_line_cause(result, wall, "Ray cannot start", f"127.0.0.1:{port} is taken")


@pytest.mark.e2e
def test_a_failed_step_or_run_costs_only_itself(tmp_path):
    result, _, _ = run_script(
        tmp_path, "--shape", "tiny", timeout=300,
        ONLY="plain fedit:w1_seq fedit:w4_seq", RAYSIM_E2E_FAIL="plain fedit:w4_seq",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed steps: plain fedit" not in result.stdout  # fedit itself finished
    assert "failed steps: plain" in result.stdout
    md = (tmp_path / "out" / "figures.md").read_text()
    assert "| `plain` | **failed** (exit 1): injected failure" in md
    assert "| `fedit` | finished |" in md
    assert re.search(r"\| FedIT w1_seq: [^|]+ \| \d+ \|", md)
    assert "| FedIT w4_seq: 4 workers at 0.25 GPU | **failed**: Failed: injected failure" in md
    figures = json.loads((tmp_path / "out" / "figures.json").read_text())
    assert "fm_e2e_ratio" not in figures and "four_workers_vs_one" not in figures


def session_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def kill_session(sid: int) -> None:
    """SIGKILL to every process of session ``sid``: what the device tool does at its limit."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if session_of(int(entry.name)) == sid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue


@pytest.mark.e2e
def test_killed_at_any_step_the_call_keeps_every_step_finished_before_it(tmp_path):
    """Part 1 on the tiny shape, every step for real. Figures reach $OUT only as whole files, at
    saves, so what $OUT holds as a step starts is what a kill then leaves: it is read at each
    step's start, and the call is killed for real, whole, in its last step."""
    out = tmp_path / "out"
    env = script_env(OUT=str(out), RAYSIM_E2E_WORK=str(tmp_path / "work"))
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--shape", "tiny"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=tmp_path,
    )  # fmt: skip
    seen: dict[str, dict] = {}
    log, ray_dir = [], None
    try:
        for line in proc.stdout:
            log.append(line)
            if ray_dir is None and "Ray in " in line:
                ray_dir = line.split("Ray in ", 1)[1].split(";")[0].strip()
            m = re.match(r"=== (\w+) \(", line)
            if not m:
                continue
            step = m.group(1)
            seen[step] = {
                "figures": json.loads((out / "figures.json").read_text()),
                "md": (out / "figures.md").read_text(),
            }
            if step == "gpu_tests":
                time.sleep(1.0)
                kill_session(proc.pid)
                break
        proc.wait(timeout=30)
    finally:
        kill_session(proc.pid)
        if ray_dir:
            stop_ray(ray_dir)
    text = "".join(log)
    assert list(seen) == plans.PARTS[1], text
    order = list(STEP_FIGURES)
    for k, step in enumerate(order):
        snap = seen[step]
        for done in order[:k]:
            assert set(STEP_FIGURES[done]) <= set(snap["figures"]), (step, done, text)
            assert re.search(rf"\| `{done}` \| finished \|", snap["md"]), (step, done)
        if k > order.index("plain"):
            assert re.search(r"\| plain PEFT loop \| \d+ \| 1 \|", snap["md"])
        for later in order[k:]:
            assert not set(STEP_FIGURES[later]) & set(snap["figures"]), (step, later)
    # the kill itself: the report of the last save, whole, and the logs' archive readable
    final = json.loads((out / "figures.json").read_text())
    assert final == seen["gpu_tests"]["figures"]
    assert "| `gpu_tests` | running, or cut with the call |" in (out / "figures.md").read_text()
    with tarfile.open(out / "e2e-logs.tar.gz") as tar:
        names = tar.getnames()
    assert "e2e/fedbaf.log" in names and "e2e/fedbaf.json" in names
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert figures_are_this_calls(final, out)


def figures_are_this_calls(figures: dict, out: Path) -> bool:
    md = (out / "figures.md").read_text()
    return figures.get("run", "") in md.splitlines()[0]


@pytest.mark.e2e
def test_part_two_runs_its_own_reference_and_the_rest(tmp_path):
    # the budget of a slow shared 2-vCPU machine (CI ran this part in 421 s, one step cut)
    result, _, _ = run_script(
        tmp_path, "--shape", "tiny", "--part", "2", "--budget", "720", timeout=800
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads((tmp_path / "out" / "figures.json").read_text())
    wanted = ("deterministic_kernels_cost", "four_workers_lora2_vs_one", "deepspeed_zero3_vs_torch",
              "fedoa_cost_vs_fedit", "tune_sweep_wall_s")  # fmt: skip
    for key in wanted:
        assert key in figures, (key, figures)
    assert figures["tune_trials"] == 4
    assert figures["four_workers_one_gpu"] is True
    shutil.rmtree(tmp_path / "work", ignore_errors=True)


def test_part_twos_four_workers_report_their_card(tmp_path):
    """Part 2's four workers (fedit_more) give the one-card figures as part 1's do."""
    work = golden_work(tmp_path, steps=["preflight"])
    data = json.loads((GOLDEN / "fedit.json").read_text())
    data["_run"] = "golden"
    (work / "fedit_more.json").write_text(json.dumps(data))
    figures = reports.report(work, "golden", quiet=True)
    assert figures["four_workers_one_gpu"] is True and "placement_digest_equal" in figures
