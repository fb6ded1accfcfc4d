"""``raysim run``: one simulation from a YAML config, with a progress bar of its rounds and a
summary table; ``--dry-run``, the plan alone; a stopped run's one line on how to go on."""

from __future__ import annotations

import argparse
import os
import shlex
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from raysim.cli.common import (
    EXIT_SIGINT,
    EXIT_SIGTERM,
    STARTED,
    Terminated,
    console,
    error,
    errors,
    on_sigterm,
)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]round"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("virtual t={task.fields[vt]:>6}"),
        TextColumn("{task.fields[acc]}"),
        TextColumn("arrived={task.fields[arrived]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _summary_table(result: Any) -> Table:
    m = result.metrics
    table = Table(title=f"raysim · {result.config.name} · {result.config.algorithm.name}")
    table.add_column("metric")
    table.add_column("value", justify="right", overflow="fold")  # a long store path: whole
    shown = [
        ("final accuracy", "accuracy"),
        ("final loss", "loss"),
        (f"max accuracy, last {result.config.eval.final_window} evals", "accuracy_max_last"),
        ("OOD ROUGE-1 (clients' own adapters)", "ood_rouge1"),
        ("OOD ROUGE-1 (global adapter)", "ood_rouge1_global"),
        ("ID ROUGE-1", "id_rouge1"),
        ("OOD loss", "ood_loss"),
    ]
    rows = [(label, f"{m[key]:.4f}") for label, key in shown if key in m]
    rows += [
        ("rounds run", f"{m['rounds']:.0f}"),
        ("updates applied / rejected", f"{m['total_updates']:.0f} / {m['rejected_updates']:.0f}"),
        ("bytes up / down", f"{m['total_bytes_up']:.3g} / {m['total_bytes_down']:.3g}"),
        # the coordinator's clock (resumed runs: every attempt's), and the whole command's
        ("wall time of the rounds", f"{m['wall_time_s']:.1f} s"),
        ("wall time of this command", f"{time.perf_counter() - STARTED:.1f} s"),
    ]
    if "leaks_reported" in m:  # audit.on_leak: report
        rows.append(("leaky payloads sent", f"{m['leaks_reported']:.0f}"))
    if "dp_epsilon" in m:  # privacy: the accountant's ε at the run's δ
        rows.append(
            (f"privacy ε (δ = {m['dp_delta']:.2g})", f"{m['dp_epsilon']:.4g}"),
        )
        rows.append(("noise multiplier z / clip C", f"{m['dp_noise_multiplier']:.4g} / "
                     f"{m['dp_clip']:.4g}"))  # fmt: skip
    if "dp_sgd_epsilon" in m:  # local.dp_sgd: the worst client's, an example the unit
        rows.append(
            (f"DP-SGD ε per client, at most (δ = {m['dp_sgd_delta']:.2g})",
             f"{m['dp_sgd_epsilon']:.4g} after {m['dp_sgd_max_steps']:.0f} steps"),
        )  # fmt: skip
    if m.get("stopped_early"):
        rows.append(("ended early", f"after round {m['rounds']:.0f} of {result.config.rounds}"))
    rows += [
        ("MLflow run id", str(result.run_id)),
        ("MLflow store", str(result.tracking_uri)),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


def _run_args(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """With ``--resume`` the config path is optional: a first positional ``key=value`` that is no
    file is an override."""
    config, overrides = args.config, list(args.overrides)
    if args.resume and config and "=" in config and not os.path.isfile(config):
        config, overrides = None, [config, *overrides]
    return config, overrides


def cmd_run(args: argparse.Namespace) -> int:
    terminated: list[int] = []

    def _terminate(signum: int, frame: Any) -> None:  # `kill PID`: end the run as KILLED
        first = not terminated
        terminated.append(signum)
        if first:  # a second SIGTERM must not cut short the clean-up the first one started
            raise Terminated

    started: list[Any] = []  # the RunSession, once it has started
    # from the start: a SIGTERM during imports or ray.init also stops cleanly
    try:
        with on_sigterm(_terminate):
            return _run_command(args, started)
    except KeyboardInterrupt:
        _stopped(args, started[0] if started else None)
        # by the flag, not the exception: code on the way (Ray's) may re-raise a plain one
        return EXIT_SIGTERM if terminated else EXIT_SIGINT


def _run_command(args: argparse.Namespace, started: list[Any]) -> int:
    if args.dry_run:  # the plan, and nothing starts, is written or runs the config's modules
        from raysim.algorithms.registry import module_policy

        with module_policy("skip"):
            return _dry_run(args)
    plan = _planned(args)  # checked too: a run that cannot start fails here, in one line
    if plan is None:
        return error("raysim run needs a config path (or --resume RUN_ID)")
    result = _run_with_progress(plan, started.append)
    console.print(_summary_table(result))
    console.print(f"weights sha256: {result.weights_digest}", soft_wrap=True, highlight=False)
    if result.state_store:  # clients.state.store: disk; a path is not cut short in a table
        console.print(
            f"personal-state store: {result.state_store}",
            soft_wrap=True,
            highlight=False,
        )
    if result.unsaved:
        errors.print(f"raysim: error: {result.unsaved}", style="red", markup=False)
        return 1
    return 0


def _planned(args: argparse.Namespace) -> Any:
    """The run's plan (``raysim.launch.plan.plan_run``), decided and checked once, before the
    progress bar; None without a config."""
    from raysim.launch.plan import plan_run

    checked = _checked_config(args)
    return None if checked is None else plan_run(checked[0], args.address, resume=checked[1])


def _checked_config(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """``(config, resume)`` of ``raysim run``'s arguments; None without a config."""
    from raysim.config import load_config
    from raysim.state.checkpoint import prepare_resume

    config, overrides = _run_args(args)
    resume = None
    if args.resume:
        resume = prepare_resume(
            args.resume, config, overrides, force=args.force, trust_modules=args.trust_modules
        )
        cfg = resume.config
    elif config is None:
        return None
    else:
        cfg = load_config(config, overrides)
    return cfg, resume


def _dry_run(args: argparse.Namespace) -> int:
    """``--dry-run``: the plan, checked as far as it can be without running any of the config's
    modules."""
    from raysim.config import has_unchecked
    from raysim.launch.plan import plan_run, size_on_cluster

    checked = _checked_config(args)
    if checked is None:
        return error("raysim run needs a config path (or --resume RUN_ID)")
    cfg, resume = checked
    if has_unchecked(cfg):
        names = [e.name for e in (cfg.algorithm, *cfg.hooks.server, *cfg.hooks.clients)
                 if type(e.params).__name__ == "UncheckedParams"]  # fmt: skip
        console.print(
            f"dry run: config valid except {', '.join(map(repr, names))}, which only a module "
            "it names registers; a dry run imports no module (it runs no code), so their "
            "parameters and the run's plan are checked when the run starts",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
        return 0
    # on a named cluster the driver connects to read its resources: the pool it prints is the
    # run's (nothing is started there)
    plan = size_on_cluster(plan_run(cfg, args.address, resume=resume))
    text = plan.describe()
    console.print(f"dry run: {text}", soft_wrap=True, highlight=False, markup=False)
    return 0


def _stopped(args: argparse.Namespace, session: Any) -> None:
    """The one line a stopped run prints: where it stopped and a command that goes on from the
    round its newest checkpoint holds (the coordinator's word: it runs ahead of the driver's
    progress bar), or starts it again."""
    again = "raysim " + shlex.join(args.argv)
    if session is None:
        errors.print(f"stopped during start-up, before any round ran; start again with `{again}`")
        return
    if session.finished:
        errors.print(f"stopped as it ended: run {session.run_id} is FINISHED, nothing to resume")
        return
    cfg, stopped = session.cfg, session.stopped or {}
    done = stopped.get("round")
    where = f"stopped after round {session.round if done is None else done} of {cfg.rounds}"
    saved = stopped.get("saved_round")
    handle = session.run_id or cfg.checkpoint.dir
    marked = f" (run {session.run_id} marked KILLED)" if session.run_id else ""
    resume = "raysim " + shlex.join(
        ["run", "--resume", str(handle), *(["--address", args.address] if args.address else [])]
    )
    if saved is not None and handle:
        errors.print(f"{where}; resume from its checkpoint after round {saved} with `{resume}`")
    elif saved is None and session.stopped is None and cfg.checkpoint.every and handle:
        # the coordinator could not say: the run's own record says where it resumes
        errors.print(f"{where}; resume with `{resume}`")
    elif cfg.checkpoint.every:
        line = f"{where}{marked}, before its first checkpoint (after round {cfg.checkpoint.every})"
        errors.print(f"{line}; start again with `{again}`")
    else:
        line = f"{where}{marked}; it wrote no checkpoint to resume from (set checkpoint.every)"
        errors.print(f"{line}; start again with `{again}`")


def _run_with_progress(plan: Any, on_start: Any = None) -> Any:
    from raysim.launch.session import run

    cfg, resume = plan.cfg, plan.resume
    start = resume.round if resume else 0
    if resume:
        where = resume.run_id or resume.dir
        console.print(f"resuming {where} at round {start} of {cfg.rounds}")
    with _progress() as progress:
        task = progress.add_task(
            "run", total=cfg.rounds, completed=start, vt=str(start), acc="", arrived=0
        )

        def on_round(m: dict[str, float]) -> None:
            key = next((k for k in ("accuracy", "ood_rouge1", "ood_loss") if k in m), None)
            acc = f"{key}={m[key]:.4f}" if key else progress.tasks[0].fields["acc"]
            progress.update(
                task,
                advance=1,
                vt=f"{m['virtual_time']:.0f}",
                acc=acc,
                arrived=int(m["clients_arrived"]),
            )

        return run(plan=plan, on_round=on_round, on_start=on_start)
