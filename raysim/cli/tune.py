"""``raysim tune``: a Ray Tune sweep over a config's ``tune:`` section, with a live table of its
trials."""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Mapping
from typing import Any

from rich.table import Table

from raysim.cli.common import EXIT_SIGINT, EXIT_SIGTERM, console, errors, on_sigterm


def cmd_tune(args: argparse.Namespace) -> int:
    """``raysim tune CONFIG [key=value ...]``: a Ray Tune sweep over the config's ``tune:`` space,
    with a live trial table; ends with the table, the best config as YAML and the MLflow run."""
    from rich.live import Live

    from raysim.config import load_config
    from raysim.sweeps.trial import trial_overrides
    from raysim.sweeps.tuner import BEST_FILE, SweepInterrupted, tune

    if args.dry_run:  # runs none of the config's modules (raysim run --dry-run's rule)
        from raysim.algorithms.registry import module_policy

        with module_policy("skip"):
            cfg = load_config(args.config, args.overrides)
            if args.resume is not None:  # what the sweep would resume: checked as it would be
                check_resume(args.resume)
            line = tune(cfg, address=args.address, resume=args.resume, dry_run=True)
        console.print(line, soft_wrap=True, markup=False, highlight=False)
        return 0

    cfg = load_config(args.config, args.overrides)
    if args.resume is not None:
        check_resume(args.resume)
    metric = cfg.tune.metric if cfg.tune is not None else "accuracy"
    rows: dict[str, dict[str, Any]] = {}

    def table() -> Table:
        t = Table(title="trials")
        for col in ("trial", "round", metric, "MLflow run"):
            t.add_column(col)
        for name, r in sorted(rows.items()):
            t.add_row(name, str(r["round"]), r["metric"], r["run"])
        return t

    terminated: list[int] = []

    def _terminate(signum: int, frame: Any) -> None:
        # `kill PID` stops the sweep as Ctrl-C does: Tune saves its state and ends the trials
        terminated.append(signum)
        os.kill(os.getpid(), signal.SIGINT)

    with (
        on_sigterm(_terminate),
        Live(table(), console=console, refresh_per_second=2, transient=True) as live,
    ):

        def on_result(trial: str, result: Mapping[str, Any]) -> None:
            value = result.get(metric)
            rows[trial] = {
                "round": int(result.get("round", 0)),
                "metric": f"{value:.4f}" if isinstance(value, float) else "",
                "run": str(result.get("run_id", ""))[:8],
            }
            live.update(table())

        try:
            out = tune(
                cfg,
                address=args.address,
                resume=args.resume,
                storage=args.storage,
                on_result=on_result,
            )
        except SweepInterrupted as stop:
            errors.print(
                f"sweep stopped; continue it with `raysim tune {args.config} --resume {stop.path}`",
                markup=False,
            )
            return EXIT_SIGTERM if terminated else EXIT_SIGINT
    done = Table(title=f"sweep · best {out.metric} = {out.best_metric:.4f} ({out.mode})")
    cols = [c for c in out.table[0] if c != "weights_digest"]
    short = [c.rsplit(".", 1)[-1] for c in cols]  # buffer_size, not algorithm.buffer_size
    for col, name in zip(cols, short, strict=True):
        done.add_column(name if short.count(name) == 1 else col, overflow="fold")

    def cell(col: str, value: Any) -> str:
        if col == "run_id":
            return str(value)[:8]  # whole in trials.csv, in the sweep's MLflow run
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    for r in out.table:
        done.add_row(*[cell(c, r[c]) for c in cols])
    console.print(done)
    # the swept values, not the whole config (it would push the table off the screen)
    best = " ".join(trial_overrides(out.best_params))  # as a trial got them
    console.print(f"best: {best}", soft_wrap=True, markup=False)
    best_file = os.path.join(out.path, BEST_FILE)
    console.print(f"its whole config: {best_file}", soft_wrap=True, markup=False)
    console.print(f"run it: raysim run {best_file}", soft_wrap=True, markup=False)
    console.print(
        f"MLflow parent run {out.parent_run_id}; Tune state in {out.path} "
        f"(continue with `raysim tune {args.config} --resume {out.path}`)",
        soft_wrap=True,
        markup=False,
    )
    return 0


def check_resume(path: str) -> None:
    """``--resume DIR``, checked in one line before anything starts (a dry run too): DIR is a
    folder holding what ``raysim.sweeps.tuner.tune`` reads back when it resumes: the sweep's own
    file (``SWEEP_FILE``: its MLflow parent run) and the Tune experiment ``Tuner.restore`` loads
    (``Tuner.can_restore``: its ``tuner.pkl``). The file is read, the pickle is not (a dry run
    runs nothing the folder holds)."""
    import json
    from pathlib import Path

    from ray.tune import Tuner

    from raysim.config import ConfigError
    from raysim.sweeps.tuner import SWEEP_FILE

    folder = Path(path).expanduser()
    hint = "give the folder a stopped sweep named in its `--resume` line"
    if not folder.exists():
        raise ConfigError(f"--resume {path}: no such directory; {hint}")
    if not folder.is_dir():
        raise ConfigError(f"--resume {path}: not a directory; {hint}")
    sweep = folder / SWEEP_FILE
    if not sweep.is_file():  # the words raysim.sweeps.tuner.tune uses
        inside = sorted(folder.glob(f"*/{SWEEP_FILE}"), key=lambda f: f.stat().st_mtime)
        if inside:  # --storage itself: the newest sweep in it
            hint = f"did you mean {inside[-1].parent}?"
        raise ConfigError(f"{path} is not a raysim sweep's directory (no {SWEEP_FILE}); {hint}")
    try:
        state = json.loads(sweep.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"--resume {path}: its {SWEEP_FILE} cannot be read ({e})") from None
    if not isinstance(state, dict) or "parent_run_id" not in state:
        raise ConfigError(f"--resume {path}: its {SWEEP_FILE} names no parent_run_id")
    if not Tuner.can_restore(str(folder.resolve())):
        raise ConfigError(
            f"--resume {path}: no Tune experiment to resume there (no tuner.pkl, the state "
            "Tune's restore reads); start the sweep again without --resume"
        )
