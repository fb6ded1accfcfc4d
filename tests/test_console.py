"""Only raysim's progress and its own warnings reach a user's console (issue 24): a first
``raysim run`` in a fresh folder (a fresh MLflow store) and a ``raysim tune`` whose ASHA stops
trials early, each in a fresh process with its own private Ray, as a user starts them."""

from __future__ import annotations

import os

import pytest
import yaml

from tests.conftest import EXAMPLES, fresh_cli, sweep_cfg

#: what the libraries raysim drives print when they are not kept quiet
LIBRARY_CHATTER = (
    "INFO mlflow",
    "Creating initial MLflow database tables",
    "Loading weights",
    "FutureWarning",
    "UserWarning",
    "Setting accelerator to CPU",
    "Configuration for experiment",  # Tune's experiment table, printed even at verbose=0
    "View detailed results here",
)
#: Ray's C++ crash dump, printed by a process that dies holding Ray state
CRASH_DUMP = ("An unexpected system state has occurred", "StackTrace Information")


def test_a_first_run_in_a_fresh_folder_prints_no_library_chatter(tmp_path):
    store = f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"  # not the session's store
    out = fresh_cli(["run", str(EXAMPLES / "quickstart.yaml"), "rounds=2", store], tmp_path)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-3000:]
    assert (tmp_path / "mlflow.db").is_file()  # the store was made here, by this run
    assert "weights sha256:" in out.stdout
    heard = [line for line in said.splitlines() if any(c in line for c in LIBRARY_CHATTER)]
    assert not heard, heard


@pytest.mark.matrix  # suite time: ASHA's stops run fast in tests/test_tune.py
def test_a_sweep_whose_trials_asha_stops_prints_no_crash_dump(tmp_path):
    """Four trials, two at a time, ASHA from round 1: the sweep must stop some early (else
    the test proves nothing), and no stopped trial's actors may leave a crash dump."""
    cfg = sweep_cfg(
        "console-test",
        {
            "space": {"local.lr": {"grid": [0.3, 0.0001, 0.2, 0.0002]}},
            "scheduler": "asha",
            "asha": {"grace_period": 1, "reduction_factor": 2},
            "max_concurrent_trials": 2,
        },
        rounds=4,
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = fresh_cli(["tune", str(path)], tmp_path, timeout=600)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-3000:]
    assert "stopped early" in out.stdout, out.stdout[-3000:]
    assert not [c for c in CRASH_DUMP if c in said], said[-5000:]
    # the end: the best trial's swept value and where its whole config is, not the config
    # itself (~200 lines that pushed the results table off the screen; issue 42, item 7)
    best = [line for line in out.stdout.splitlines() if line.startswith("best: ")]
    assert len(best) == 1 and best[0].startswith("best: local.lr="), out.stdout[-3000:]
    assert "best_config.yaml" in out.stdout and "\nlocal:\n" not in out.stdout
    heard = [line for line in said.splitlines() if any(c in line for c in LIBRARY_CHATTER)]
    assert not heard, heard


def probe(code: str) -> str:
    """What ``code`` prints, run in a fresh Python process (which must succeed)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_help_answers_without_importing_torch():
    """``raysim --help`` took 2.5 s on 2 vCPUs while torch and the config's models imported."""
    out = probe(
        "import sys\nfrom raysim.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'ray' in sys.modules)"
    )
    assert "usage: raysim" in out
    assert out.strip().splitlines()[-1] == "False False"


def test_the_actor_modules_import_without_torch():
    """The coordinator starts its workers before its own imports (``WorkerLaunch``), which needs
    the modules that define both actors to load without torch, the methods or the config; and
    ``raysim.util.buffers``, whose ``prefer_huge_pages`` must run before torch does."""
    out = probe(
        "import sys\nimport raysim.actors.coordinator_actor, raysim.actors.worker_actor\n"
        "import raysim.util.buffers\n"
        "print(sorted(m for m in ('torch', 'raysim.config', 'raysim.algorithms', 'mlflow') "
        "if m in sys.modules))"
    )
    assert out.strip() == "[]"


#: a fresh process's first lines: any import of torch raises, as if it were not installed
NO_TORCH = (
    "import sys\n"
    "class NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ImportError('torch imported')\n"
    "sys.meta_path.insert(0, NoTorch())\n"
)


def test_every_example_config_loads_without_torch():
    """The driver and every Tune trial check their config before anything else; that took
    1.1 s of torch's import on 2 vCPUs while the methods' and models' parameters lived beside
    their torch code. The control: the same guard stops a model module."""
    configs = sorted(
        str(p) for p in EXAMPLES.rglob("*.yaml") if p.name != "methods.yaml"
    )  # the methods.yaml files list a reproduction's cells, not runs
    assert len(configs) > 30
    out = probe(
        NO_TORCH + "from raysim.config import load_config\n"
        f"for path in {configs!r}:\n    load_config(path)\n"
        "print(len(sys.modules))\n"
        "try:\n    import raysim.models.small\nexcept ImportError as e:\n    print(e)\n"
    )
    assert out.strip().splitlines()[-1] == "torch imported"


def test_the_driver_of_a_run_never_imports_torch(tmp_path):
    """``raysim run`` checks the config, plans the resources (GPUs counted as Ray counts them)
    and starts Ray without torch: its coordinator and workers import it, each in its own
    process (``runtime=ray``; a run without Ray trains in the driver's process)."""
    out = probe(
        NO_TORCH + f"import os\nos.chdir({str(tmp_path)!r})\nfrom raysim.cli import main\n"
        f"code = main(['run', {str(EXAMPLES / 'quickstart.yaml')!r}, 'rounds=1', "
        "'tracking.enabled=false', 'runtime=ray'])\n"
        "print('exit', code)\n"
    )
    assert "weights sha256:" in out
    assert out.strip().splitlines()[-1] in {"exit 0", "exit None"}


def test_a_coordinator_that_aggregates_in_numpy_never_imports_torch():
    """The coordinator (and a Tune trial, which runs it in its own process) imports torch only
    for a method whose server computes in torch, or for the leak auditor: FedAvg's, FedOpt's,
    FedAsync's, FedBuff's and CA2FL's servers are numpy. The control: FedProx's module, whose
    client half is torch, is stopped by the same guard."""
    numpy_servers = ["fedavg", "fedadam", "fedyogi", "fedasync", "fedbuff", "ca2fl", "fedit"]
    out = probe(
        NO_TORCH + "import numpy as np\n"
        "import raysim.actors.coordinator_actor, raysim.actors.coordinator_core\n"
        "import raysim.state.checkpoint, raysim.sim.build, raysim.tracking.tracker\n"
        "import raysim.actors.evaluation\n"
        "from raysim.algorithms.registry import get_method\n"
        f"for name in {numpy_servers!r}:\n"
        "    s = get_method(name).build_strategy({}, np.zeros(4, np.float32), 3)\n"
        "try:\n    get_method('fedprox')\nexcept ImportError as e:\n    print(e)\n"
    )
    assert out.strip().splitlines()[-1] == "torch imported"


def test_the_command_exits_as_python_would_only_sooner(tmp_path):
    """``raysim`` (``cli.entry``) ends with ``os._exit`` once its work is done: before that, a
    thread still writing is joined, every atexit handler runs, and the output is flushed; the
    exit code is the command's."""
    import subprocess
    import sys

    code = (
        "import atexit, sys, threading, time\nfrom raysim import cli\n"
        "def late():\n    time.sleep(0.5)\n    open('thread.txt', 'w').write('joined')\n"
        "threading.Thread(target=late).start()\n"
        "atexit.register(lambda: open('atexit.txt', 'w').write('ran'))\n"
        "sys.stdout.write('unflushed')\n"
        "sys.argv = ['raysim', 'run', 'missing.yaml']\ncli.entry()\n"
        "print('not reached')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "config file not found: missing.yaml" in done.stderr
    assert done.stdout == "unflushed"
    assert (tmp_path / "thread.txt").read_text() == "joined"
    assert (tmp_path / "atexit.txt").read_text() == "ran"


def test_torch_s_note_on_vmapped_attention_is_kept_quiet():
    """Batched clients of a Transformer (``examples/fedbaf/mini-lm.yaml``) made torch warn on the
    console that vmap runs CPU attention in a loop. ``quiet_libraries`` (every raysim process)
    silences that note; the control, a process without it, shows torch still gives it. (Torch
    gives it once per process, hence a fresh process each.)"""
    import subprocess
    import sys

    from raysim.util.quiet import VMAP_FALLBACK

    attend = (
        "import torch; q = torch.randn(2, 1, 2, 4, 8, requires_grad=True); "
        "torch.vmap(lambda x: torch.nn.functional.scaled_dot_product_attention(x, x, x))(q)"
    )
    quiet = "from raysim.util.quiet import quiet_libraries; quiet_libraries(); "
    said = [
        subprocess.run([sys.executable, "-c", first + attend], capture_output=True, text=True)
        for first in ("", quiet)
    ]
    assert all(p.returncode == 0 for p in said), [p.stderr[-1000:] for p in said]
    assert VMAP_FALLBACK in said[0].stderr  # the control
    assert VMAP_FALLBACK not in said[1].stderr and "Warning" not in said[1].stderr


WORKER_LINE = """
import time, ray
from raysim.util.quiet import quiet_libraries
quiet_libraries()
ray.init(num_cpus=1, include_dashboard=False)
@ray.remote
def say():
    print("a line from a worker", flush=True)
ray.get(say.remote())
time.sleep(1.5)  # the driver prints the workers' lines as they arrive
ray.shutdown()
"""


def test_workers_lines_reach_a_redirected_console_without_colour_codes():
    """Ray prints a worker's lines behind a coloured "(pid=…)" prefix; where the console is a
    file or a pipe (a log, CI), raysim's processes ask Ray for none (issue 42, item 5)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RAY_COLOR_PREFIX"}
    done = subprocess.run(
        [sys.executable, "-c", WORKER_LINE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout + done.stderr
    assert "a line from a worker" in out
    assert "\x1b[" not in out, out[-2000:]
