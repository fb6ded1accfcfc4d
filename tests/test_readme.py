"""Every command in the README and in the docs site's pages runs as written on a 2-core machine.

Each ``raysim`` command of the bash blocks of ``README.md`` and ``docs/**/*.md`` goes through the
real CLI with ``--dry-run`` (config validated, resources planned against 2 CPUs and no GPU,
nothing started). A few need something a reader supplies first (a run id, a cluster, the paper's
data) or are long jobs that other tests run; each is listed in ``ELSEWHERE`` with where it is
covered, and the list must match those pages exactly, so a new command is never skipped silently.
"""

from __future__ import annotations

import re
import shlex

import pytest

from raysim import cli
from tests.conftest import ROOT

README = ROOT / "README.md"
#: the README first, then the site's pages (a command may use what an earlier one made)
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

#: command (as written, comment stripped) → why it is not dry-run here / where it is tested
ELSEWHERE = {
    "make demo": "the quickstart run (tests/test_runtime.py, tests/test_regression.py)",
    "make test": "what CI runs",
    "source .venv/bin/activate": "the shell's (tests/test_tutorials.py runs the tutorials with "
    ".venv/bin first on PATH)",
    "raysim run CONFIG.yaml --address auto": "a placeholder config and a cluster to join "
    "(tests/test_first_hour.py, tests/test_multinode.py)",
    "raysim ui": "tests/test_ui_browser.py (serves on 127.0.0.1; the runs view in Chromium)",
    "raysim ui --uri sqlite:///runs/mlflow.db --port 5001": "serves until stopped: "
    "tests/test_ui_browser.py",
    "raysim run --resume RUN_ID": "tests/test_checkpoint.py (CLI resume of a real run)",
    "raysim run --resume RUN_ID workers.count=1": "tests/test_checkpoint.py",
    "raysim run --resume ./ckpt": "tests/test_checkpoint.py",
    "raysim pretrain tiny-llama --out foundations/tiny-s0": "tests/test_foundation.py (the CLI, "
    "fewer steps)",
    "raysim loto examples/fedoa/paper-table2.yaml model.path=... data.text.data_dir=...": "the "
    "paper's model and data (GPUs)",
    "python examples/fedoa/qualitative.py --seeds 0": "needs the foundation model; "
    "examples/fedoa/RESULTS.md",
    "raysim pretrain tiny-llama --seed 1 --out foundations/tiny-f1": "tests/test_foundation.py "
    "(the CLI with --seed, fewer steps)",
    "python examples/fedoa/qualitative.py --seeds 0,1 --out runs/fedoa --foundations "
    "foundations/tiny-f0,foundations/tiny-f1,foundations/tiny-f2,foundations/tiny-f3,"
    "foundations/tiny-f4": "hours on 2 cores; tests/test_foundation.py decides claims over "
    "foundations on made-up rows",
    "python examples/fedoa/report.py --results runs/fedoa/results.json --curves": "after the "
    "runs (its curves from their MLflow store); tests/test_foundation.py writes a report from "
    "made-up results, tests/test_reports.py the committed one",
    "python examples/feddle/report.py --out examples/feddle": "tests/test_reports.py (the "
    "committed report, byte for byte)",
    "python examples/fedbaf/report.py --out examples/fedbaf": "tests/test_reports.py (the "
    "committed report, byte for byte)",
    "raysim tune examples/tune-async.yaml": "a 12-trial sweep; tests/test_tune.py runs a sweep",
    "raysim pretrain digits --out foundations/digits": "tests/test_fedbaf_data.py (the CLI, "
    "fewer epochs)",
    "raysim pretrain markov --out foundations/markov": "tests/test_fedbaf_lm.py (the function, "
    "a smaller corpus)",
    "raysim extract RUN_ID --noise 0,0.5,1,2": "a finished run with observers; "
    "tests/test_extraction_harness.py runs the CLI on one",
    "python examples/robust/reproduce.py --out runs/robust": "minutes; tests/test_robust.py "
    "runs a corner of its grid and reports it; examples/robust/RESULTS.md",
    "python examples/robust/report.py runs/robust/results.json": "after the grid; "
    "tests/test_robust.py",
    "python examples/fedbaf/reproduce.py --out runs/fedbaf-mini": "about an hour; "
    "examples/fedbaf/RESULTS.md",
    "python examples/fedot/reproduce.py --out runs/fedot-mini": "hours on 2 cores, resuming from "
    "examples/fedot/results.json; examples/fedot/RESULTS.md",
    "raysim tune examples/tune-async.yaml --resume tune/tune-async-DATE": "a stopped sweep's "
    "directory; tests/test_tune.py interrupts a sweep and resumes it",
    "make gpu-bundle": "the cp312 bundle is built for the GPU machine; make gpu-check (a CI "
    "step) builds it and imports it under Python 3.12; tests/test_gpu_bundle.py",
    "bash benchmarks/gpu_e2e.sh": "a GPU (the lent device machine); make gpu-check runs every "
    "step on the CPU; tests/test_gpu_e2e.py runs its preflight here (no GPU: one line)",
    "bash benchmarks/gpu_e2e.sh --part 2 --budget 420": "a GPU; make gpu-check runs part 2 on "
    "the CPU (tests/test_gpu_e2e.py)",
    "bash benchmarks/gpu_e2e.sh --shape tiny": "make gpu-check (a CI step, .ci/run)",
    "make gpu-check": "a CI step (.ci/run)",
    "make docs": "a CI step (.ci/run); tests/test_docs.py checks the configuration reference",
    "raysim traces --fedscale CAPACITY --availability BEHAVE --out my": "FedScale's files; "
    "tests/test_devices.py runs the CLI on files in FedScale's format",
    "raysim traces --fedscale client_device_capacity --availability client_behave_trace --out "
    "my-traces": "FedScale's files; tests/test_devices.py runs the CLI on files in their format",
    "raysim traces --folder my-traces": "the folder the command before makes; "
    "tests/test_devices.py reads one back",
    "make bench": "the benchmarks (minutes); benchmarks/RESULTS.md",
    "python examples/feddle/reproduce.py --out runs/feddle-mini": "about 50 minutes; "
    "examples/feddle/RESULTS.md",
    "raysim run examples/quickstart.yaml 'algorithm={name: fedmedian, module: ./fedmedian.py}'": (
        "the page's file first; tests/test_docs.py saves it and runs this command"
    ),
    "raysim run examples/quickstart.yaml 'algorithm={name: scaffold, module: ./scaffold.py}' "
    "local.momentum=0": "the page's file first; tests/test_client_state.py saves it and runs it",
    "ray job submit --runtime-env cluster/runtime_env.yaml -- raysim run "
    "examples/quickstart.yaml workers.num_gpus=0.25": "a cluster; tests/test_cluster.py submits "
    "it to a two-node `ray start` cluster with a logical GPU",
}


def readme_commands() -> list[str]:
    """Each line of the pages' bash blocks, its trailing ``  # comment`` and padding removed."""
    text = "\n".join(page.read_text() for page in PAGES)
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = (re.split(r"\s+#\s", line)[0] for b in blocks for line in b.splitlines())
    return [" ".join(line.split()) for line in lines if line.strip()]


COMMANDS = readme_commands()
DRY = [c for c in dict.fromkeys(COMMANDS) if c not in ELSEWHERE]


def test_every_readme_command_is_checked_somewhere():
    assert set(ELSEWHERE) <= set(COMMANDS), sorted(set(ELSEWHERE) - set(COMMANDS))
    assert DRY, "no commands found"
    assert all(c.startswith("raysim ") for c in DRY), [c for c in DRY if "raysim" not in c]


@pytest.mark.parametrize("command", DRY)
def test_readme_command_runs_as_written_on_two_cores(command, monkeypatch, capsys, tmp_path):
    import ray

    if command.startswith("raysim traces"):  # it writes a folder: here, not in the checkout
        monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr("raysim.launch.resources.local_resources", lambda: {"CPU": 2.0, "GPU": 0.0})
    monkeypatch.setattr("raysim.launch.resources.cpu_count", lambda: 2)
    argv = shlex.split(command)[1:]
    if argv[0] in ("run", "loto", "lodo", "tune"):
        argv.append("--dry-run")
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    made = re.search(r"does not exist .*make it with `([^`]+)`", err)
    if rc == 2 and made:  # a file an earlier README command makes (raysim pretrain ...)
        assert made.group(1) in COMMANDS[: COMMANDS.index(command)], err
        return
    assert rc == 0, err
    assert "Traceback" not in err
