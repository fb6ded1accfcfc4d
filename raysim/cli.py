"""``raysim`` command line (``raysim COMMAND --help`` for each command's options)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()
#: when the command began (its imports aside): the summary's "command" time counts from here
STARTED = time.perf_counter()
#: errors and stop notices: stderr, never wrapped, never parsed as markup
errors = Console(stderr=True, soft_wrap=True, highlight=False, markup=False)

#: MLflow 3.17's UI opens experiments in its GenAI view (traces, no runs table) and ignores the
#: experiment tag that earlier 3.x releases read; a URL can name the model-training view, and the
#: UI's own toggle remembers the choice (tests/test_ui_browser.py checks both in Chromium)
UI_VIEW = "workflowType=machine_learning"
UI_HINT = (
    "MLflow 3.17 opens experiments in its GenAI view: pick 'Model training' at the top left "
    "once and it stays (the link above opens that view)"
)

#: exit codes: a user's mistake, and stops by signal (128 + SIGINT / SIGTERM)
EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 2, 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so the run ends like Ctrl-C (marked KILLED)."""


@contextlib.contextmanager
def on_sigterm(handler: Any) -> Iterator[None]:
    """``handler`` takes SIGTERM (``kill PID``) while the block runs, in the main thread only;
    the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def error(message: str) -> int:
    """One line on stderr for a mistake the user can fix; the exit code for it."""
    errors.print(f"raysim: error: {message}", style="red", markup=False)
    return EXIT_USAGE


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's input, not a bug: reported in one line, exit 2."""
    from raysim.algorithms.registry import PluginError
    from raysim.config import ConfigError
    from raysim.launch.inputs import MissingInput
    from raysim.launch.private_ray import ClusterError
    from raysim.launch.resources import ResourceError

    return (ConfigError, PluginError, ResourceError, ClusterError, MissingInput)


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
    table.add_column("value", justify="right")
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
    from raysim.launch.session import preflight
    from raysim.launch.without_ray import ray_is_up

    plan = _planned(args)
    if plan is None:
        return error("raysim run needs a config path (or --resume RUN_ID)")
    if not ray_is_up():
        preflight(plan.cfg, args.address, plan)  # before the progress bar: one line on stderr
    result = _run_with_progress(plan, args.address, started.append)
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
    """The run's plan (``raysim.launch.plan.plan_run``), decided once; None without a config."""
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
    from raysim.launch.plan import plan_run
    from raysim.launch.session import preflight
    from raysim.launch.without_ray import ray_is_up

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
    plan = plan_run(cfg, args.address, resume=resume)
    if not ray_is_up():
        preflight(cfg, args.address, plan)
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


def _run_with_progress(plan: Any, address: str | None, on_start: Any = None) -> Any:
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

        return run(plan=plan, address=address, on_round=on_round, on_start=on_start)


def cmd_leave_one_out(args: argparse.Namespace) -> int:
    """Leave-one-task-out (``loto``) or leave-one-domain-out (``lodo``): every held-out setting ×
    method, one MLflow parent run."""
    from raysim.sweeps.protocols import TASK_FAMILIES, leave_one_out

    overrides = list(args.overrides)
    if args.command == "lodo":
        key, default, name = "data.text.held_out_domain", ["d1", "d2"], "leave-one-domain-out"
        # one client per remaining sub-dataset (4 families) × shards
        from raysim.config import ConfigError, load_config

        data = load_config(args.config, overrides).data
        text = getattr(data, "text", None)
        if text is None:
            raise ConfigError(f"lodo leaves text domains out: data.name={data.name!r} has none")
        shards = text.shards_per_task
        overrides = [
            "data.text.protocol=domain",
            f"clients.num={4 * shards}",
            f"clients.per_round={4 * shards}",
            *overrides,
        ]
    else:
        key, default, name = "data.text.held_out", list(TASK_FAMILIES), "leave-one-task-out"
    settings = args.held_out.split(",") if args.held_out else default
    methods = args.methods.split(",")
    total = len(settings) * len(methods)
    done = 0

    def on_run(setting: str, method: str, res: Any) -> None:
        nonlocal done
        done += 1
        value = res.metrics.get(args.metric, float("nan"))
        console.print(f"[{done}/{total}] held out {setting} · {method}: {args.metric}={value:.3f}")

    out = leave_one_out(
        args.config,
        overrides,
        key=key,
        settings=settings,
        methods=methods,
        metric=args.metric,
        name=name,
        address=args.address,
        on_run=on_run,
        dry_run=args.dry_run,
    )
    if args.dry_run:
        console.print(f"dry run: {name}: {total} runs validated; nothing started", markup=False)
        return 0
    table = Table(title=f"{name} · {args.metric} (parent run {out.parent_run_id})")
    table.add_column("method")
    for col in [*out.settings, "Average"]:
        table.add_column(col, justify="right")
    for m in out.methods:
        cells = [f"{out.table[m][s]:.2f}" for s in out.settings]
        table.add_row(m, *cells, f"{out.average(m):.2f}")
    console.print(table)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from raysim.tracking.store import default_tracking_uri, open_store

    uri = args.uri or default_tracking_uri()
    client = open_store(uri)  # a copied project's store reads its own artifacts
    # the server's own chatter (its deprecation warnings, a line per request) goes to a log file;
    # the console gets raysim's lines, and the log's end if the server fails
    env = dict(
        os.environ,
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        PYTHONWARNINGS="ignore::DeprecationWarning",
    )
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--registry-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--workers",
        "1",
        "--uvicorn-opts",
        "--log-level warning",
    ]
    log = ui_log(args.port)

    def _terminate(signum: int, frame: Any) -> None:  # `kill PID` stops the server too
        raise Terminated

    with on_sigterm(_terminate), log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            return _serve_ui(proc, f"http://127.0.0.1:{args.port}", uri, client, args.check, log)
        except KeyboardInterrupt:
            return 0
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)


def ui_log(port: int) -> Path:
    """A new file for the ui's server log: a unique name in the temp folder, 0600 (it may
    show the store's paths and what the server was asked)."""
    fd, name = tempfile.mkstemp(prefix=f"raysim-ui-{port}-", suffix=".log")
    os.close(fd)
    return Path(name)


def _serve_ui(
    proc: subprocess.Popen, url: str, uri: str, client: Any, check: bool, log: Path
) -> int:
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    if proc.poll() is not None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        errors.print(tail, markup=False, highlight=False)
        errors.print(
            f"raysim: error: mlflow server exited with code {proc.returncode} (its log: {log})",
            style="red",
            markup=False,
        )
        return 1
    console.print(
        f"MLflow UI for {uri} at [bold]{_ui_landing(url, client)}[/bold] (pid {proc.pid}; "
        f"the server's log: {log}); Ctrl-C stops it",
        soft_wrap=True,
    )
    console.print(UI_HINT, soft_wrap=True, markup=False)
    return 0 if check else proc.wait()


def _ui_landing(url: str, client: Any) -> str:
    """The runs table of the experiment with the newest run, in the model-training view."""
    exps = [e.experiment_id for e in client.search_experiments()]
    newest = client.search_runs(exps, order_by=["attributes.start_time DESC"], max_results=1)
    if not newest:
        return f"{url}/#/experiments?{UI_VIEW}"
    return f"{url}/#/experiments/{newest[0].info.experiment_id}/runs?{UI_VIEW}"


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
            line = tune(load_config(args.config, args.overrides), address=args.address,
                        dry_run=True)  # fmt: skip
        console.print(line, soft_wrap=True, markup=False, highlight=False)
        return 0
    cfg = load_config(args.config, args.overrides)
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


def cmd_methods(args: argparse.Namespace) -> int:
    """``raysim methods``: every method, what it needs, whether it batches and its parameters'
    names; ``raysim methods NAME``: one method whole (each parameter's default and meaning)."""
    from raysim.algorithms.interface import INTERFACE_VERSION
    from raysim.algorithms.registry import get_method, method_names
    from raysim.config import ConfigError

    if args.name:
        try:
            m = get_method(args.name)
        except KeyError as e:
            raise ConfigError(str(e).strip("\"'")) from None
        console.print(f"{m.name}: {m.reference}", soft_wrap=True, markup=False)
        console.print(f"needs: {m.needs.describe()}; clients: {m.batching}", markup=False)
        fields = m.params.model_fields.items()
        console.print("parameters (algorithm.NAME=VALUE):" if fields else "parameters: none")
        for key, f in fields:
            default = "(required)" if f.is_required() else f.get_default(call_default_factory=True)
            about = f" : {f.description}" if f.description else ""
            console.print(f"  {f.alias or key} = {default}{about}", soft_wrap=True, markup=False)
        return 0
    table = Table(
        title=f"registered methods (method interface {INTERFACE_VERSION}, CHANGELOG.md)",
        caption="raysim methods NAME: one method whole",
    )
    table.add_column("name", no_wrap=True)
    table.add_column("needs")
    table.add_column("batched")
    table.add_column("parameters", overflow="fold")
    for name in method_names():
        m = get_method(name)
        params = " ".join(f.alias or k for k, f in m.params.model_fields.items())
        table.add_row(name, m.needs.describe(), m.batching, params or "—")
    console.print(table)
    return 0


@contextlib.contextmanager
def _training_bar(label: str) -> Iterator[Callable[[int, int, float], None]]:
    """A progress bar of optimiser steps with the latest loss; yields ``report(step, total,
    loss)``."""
    with Progress(
        TextColumn(f"[bold]{label}"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("steps", total=None, loss=float("nan"))
        yield lambda step, total, loss: bar.update(task, completed=step, total=total, loss=loss)


def _pretrain_tiny_llama(args: argparse.Namespace, report: Any) -> str:
    from raysim.models.foundation import FoundationConfig, pretrain_foundation

    overrides: dict[str, Any] = {"data_seed": args.data_seed or 0}
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.families:
        overrides["families"] = args.families.split(",")
    cfg = FoundationConfig(**overrides)
    meta = pretrain_foundation(cfg, args.out, lambda step, loss: report(step, cfg.steps, loss))
    return (
        f"{meta['parameters']:,} parameters, vocabulary {meta['vocab_size']}, held-out exact "
        f"match {meta['heldout_exact_match']:.3f} ({meta['pretrain_seconds']:.0f} s), weights "
        f"sha256 {meta['weights_sha256'][:12]}… on {meta['machine']['cpu']} "
        f"({meta['machine']['cpu_capability']}). Use it with\n"
        f"  model: {{name: hf_causal_lm, path: {args.out}}}\n"
        f"  data.text: {{tokenizer: {args.out}, data_seed: {cfg.data_seed}}}"
    )


def _fedbaf_use(args: argparse.Namespace, meta: dict) -> str:
    scores = ", ".join(
        f"{k.removeprefix('heldout_')} {v:.3f}" for k, v in meta.items() if k.startswith("heldout_")
    )
    return (
        f"{meta['parameters']:,} parameters; held-out {scores} ({meta['pretrain_seconds']:.0f} "
        f"s). Use it with\n  algorithm: {{name: fedbaf, foundation: {args.out}}}"
    )


def _pretrain_digits(args: argparse.Namespace, report: Any) -> str:
    from raysim.models.pretrain_digits import DigitsPretrainConfig, pretrain_digits

    overrides: dict[str, Any] = {"seed": args.seed or 0}
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    if args.samples is not None:
        overrides["samples"] = args.samples
    return _fedbaf_use(args, pretrain_digits(DigitsPretrainConfig(**overrides), args.out, report))


def _pretrain_markov(args: argparse.Namespace, report: Any) -> str:
    from raysim.models.pretrain_markov import MarkovPretrainConfig, pretrain_markov

    overrides: dict[str, Any] = {"seed": args.seed or 0}
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    return _fedbaf_use(args, pretrain_markov(MarkovPretrainConfig(**overrides), args.out, report))


#: ``raysim pretrain KIND``: how each foundation is trained, its default directory, its options
PRETRAIN: dict[str, tuple[Callable[[argparse.Namespace, Any], str], str, tuple[str, ...]]] = {
    "tiny-llama": (
        _pretrain_tiny_llama,
        "foundations/tiny-s0",
        ("data_seed", "steps", "families"),
    ),
    "digits": (_pretrain_digits, "foundations/digits", ("epochs", "samples", "seed")),
    "markov": (_pretrain_markov, "foundations/markov", ("epochs", "seed")),
}
PRETRAIN_OPTIONS = ("data_seed", "steps", "families", "epochs", "samples", "seed")


def cmd_pretrain(args: argparse.Namespace) -> int:
    """``raysim pretrain KIND``: a foundation model, offline. ``tiny-llama``: FedOA's tiny
    pre-trained LLaMA for Flan-mini (fedoa.md §7.1); ``digits`` (the 20-class flipped digit task)
    and ``markov`` (chain A's language model): FedBaF's small foundations (fedbaf.md §8.1)."""
    from raysim.config import ConfigError

    build, default_out, options = PRETRAIN[args.kind]
    for name in PRETRAIN_OPTIONS:
        if getattr(args, name) is not None and name not in options:
            takes = [k for k, (_, _, o) in PRETRAIN.items() if name in o]
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} applies to raysim pretrain {' or '.join(takes)}, not {args.kind}"
            )
    args.out = args.out or default_out
    with _training_bar(f"pre-training {args.kind}") as report:
        about = build(args, report)
    console.print(f"saved to [bold]{args.out}[/bold]: {about}")
    return 0


def cmd_foundation(args: argparse.Namespace) -> int:
    """``raysim foundation``: the old name of ``raysim pretrain tiny-llama``, kept as an alias."""
    errors.print(
        "raysim foundation is now raysim pretrain tiny-llama (the old name still works)",
        style="yellow",
        markup=False,
    )
    return cmd_pretrain(args)


def cmd_extract(args: argparse.Namespace) -> int:
    from raysim.security.report import extract
    from raysim.tracking.store import default_tracking_uri

    uri = args.uri or default_tracking_uri()
    noise = tuple(float(e) for e in args.noise.split(",")) if args.noise else None
    try:
        with console.status("replaying the observers' rounds and running E0/E1/E2"):
            out = extract(
                args.run,
                uri,
                args.observations,
                args.foundation,
                noise,
                log=True,
                trust_modules=args.trust_modules,
            )
    except (ValueError, FileNotFoundError) as e:  # no such run, no observers, not FedBaF
        return error(str(e))
    table = Table(title="extraction of the foundation (matched layers)")
    for col in ("attack", "estimates", "best rel. error", "median rel. error", "cosine", "CKA"):
        table.add_column(col)
    for key in sorted(
        {
            k.rsplit("_relative_error_min", 1)[0]
            for k in out.summary
            if k.endswith("_relative_error_min")
        }
    ):
        s = out.summary
        table.add_row(
            key.replace("_", " "),
            f"{s[f'{key}_count']:.0f}",
            f"{s[f'{key}_relative_error_min']:.3g}",
            f"{s[f'{key}_relative_error_median']:.3g}",
            f"{s[f'{key}_cosine_best']:.6f}",
            f"{s.get(f'{key}_cka_best', float('nan')):.4f}",
        )
    console.print(table)
    if out.noise:
        console.print(
            "noise sweep (source-task accuracy): "
            + ", ".join(f"{r['mode']} e={r['error_rate']:g} {r['accuracy']:.3f}" for r in out.noise)
        )
    console.print(f"logged as MLflow run {out.run_id} (extraction.csv, extraction.png)")
    return 0


def _tiny_llama_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-seed", type=int, default=None, help="tiny-llama: Flan-mini word pools")
    p.add_argument("--steps", type=int, default=None, help="tiny-llama: optimiser steps (8000)")
    p.add_argument("--families", default=None, help="tiny-llama: corpus families (default: all)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raysim",
        description="A Ray-native simulator for federated learning: one YAML file per run, "
        "every run in MLflow.",
        epilog="examples:\n"
        "  raysim run examples/quickstart.yaml rounds=50      run with dotted overrides\n"
        "  raysim run examples/quickstart.yaml --dry-run      validate and plan only\n"
        "  raysim run --resume RUN_ID                         continue a checkpointed run\n"
        "  raysim ui                                          browse the runs (127.0.0.1:5000)\n"
        "Without --address a run starts its own private Ray; errors exit 2, Ctrl-C 130.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run one simulation from a YAML config")
    p.add_argument("config", nargs="?", help="path to a YAML config (optional with --resume)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rounds=50 delays.sigma=20")
    p.add_argument("--address", default=None, help="existing Ray cluster: auto or ray://host:port")
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_ID|DIR",
        help="continue a checkpointed run (an MLflow run id or a checkpoint.dir) from its last "
        "checkpoint; its config.yaml is used unless CONFIG is given (then it must match)",
    )
    p.add_argument("--force", action="store_true", help="resume even a run still marked RUNNING")
    p.add_argument(
        "--trust-modules",
        action="store_true",
        help="import the modules (module:) that a config read from a checkpoint or an MLflow run "
        "names; without it such a config is refused, since that code is not a file you gave",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config and check that the run fits, then stop (starts nothing and "
        "imports no module the config names: a method only such a module registers is checked "
        "when the run starts)",
    )
    p.set_defaults(func=cmd_run)
    for command, what in (("loto", "task family"), ("lodo", "domain (d1, d2)")):
        p = sub.add_parser(command, help=f"leave one {what} out: every held-out setting x method")
        p.add_argument("config", help="path to a YAML config (a text-task run)")
        p.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
        p.add_argument("--methods", default="centralized,fedit,pfedme,fedlora,perada,fedsdr,fedoa")
        p.add_argument("--held-out", default=None, help="comma-separated settings (default: all)")
        p.add_argument("--metric", default="ood_rouge1")
        p.add_argument("--address", default=None)
        p.add_argument(
            "--dry-run", action="store_true", help="validate every run's config, then stop"
        )
        p.set_defaults(func=cmd_leave_one_out)
    p = sub.add_parser("ui", help="serve the MLflow UI for the run store on 127.0.0.1")
    p.add_argument(
        "--uri", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--check", action="store_true", help="start, wait until healthy, then stop")
    p.set_defaults(func=cmd_ui)
    p = sub.add_parser("tune", help="a Ray Tune sweep over the config's tune: section")
    p.add_argument("config", help="a YAML config with a tune: section")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    p.add_argument("--address", default=None, help="a Ray cluster to join (default: private)")
    p.add_argument("--resume", default=None, help="continue the sweep whose Tune state is DIR")
    p.add_argument("--storage", default="tune", help="where Tune keeps its state (default ./tune)")
    p.add_argument("--dry-run", action="store_true", help="check the sweep; start nothing")
    p.set_defaults(func=cmd_tune)
    p = sub.add_parser("methods", help="list registered methods and their parameters")
    p.add_argument("name", nargs="?", help="one method: its parameters' defaults and meaning")
    p.set_defaults(func=cmd_methods)
    p = sub.add_parser(
        "pretrain",
        help="a foundation model, offline: tiny-llama (FedOA's tiny LLaMA, fedoa.md §7.1), "
        "digits or markov (FedBaF's, fedbaf.md §8.1)",
    )
    p.add_argument("kind", choices=list(PRETRAIN), help="which foundation")
    p.add_argument("--out", default=None, help="output directory (default: foundations/...)")
    _tiny_llama_options(p)
    p.add_argument("--epochs", type=int, default=None, help="digits, markov: training epochs")
    p.add_argument("--samples", type=int, default=None, help="digits: foundation pool samples")
    p.add_argument("--seed", type=int, default=None, help="digits, markov: seed (default 0)")
    p.set_defaults(func=cmd_pretrain)
    p = sub.add_parser("foundation", help="the old name of raysim pretrain tiny-llama")
    p.add_argument("--out", default=None, help="output directory (default: foundations/tiny-s0)")
    _tiny_llama_options(p)
    # the options of raysim pretrain that this alias has not, unset
    p.set_defaults(func=cmd_foundation, kind="tiny-llama", epochs=None, samples=None, seed=None)
    p = sub.add_parser(
        "extract",
        help="FedBaF's extraction harness (E0/E1/E2, fedbaf.md §6) against a run with observers",
    )
    p.add_argument("run", help="the attacked run: an MLflow run id or its config YAML")
    p.add_argument(
        "--trust-modules",
        action="store_true",
        help="import the modules (module:) that a config read from a checkpoint or an MLflow run "
        "names; without it such a config is refused, since that code is not a file you gave",
    )
    p.add_argument(
        "--observations", default=None, help="the observers' records (default: the run's dir)"
    )
    p.add_argument(
        "--foundation", default=None, help="the true foundation (default: the run's; scoring only)"
    )
    p.add_argument(
        "--noise",
        default=None,
        metavar="E,E,...",
        help="Fig. 8's sweep over error rates, e.g. 0,0.1,0.25,0.5,1,1.27,2 (a raysim pretrain "
        "foundation, whose source task is known)",
    )
    p.add_argument(
        "--uri", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    p.set_defaults(func=cmd_extract)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before the imports below: --help answers at once
    args.argv = list(sys.argv[1:] if argv is None else argv)  # to say how to start again
    from raysim.errors import Diverged, LeakError, RunSetupError
    from raysim.launch.session import CoordinatorLost
    from raysim.state.store import StateStoreError
    from raysim.util.quiet import quiet_libraries

    quiet_libraries()
    try:
        return int(args.func(args))
    except user_errors() as e:
        return error(str(e))
    except CoordinatorLost as e:  # the run is marked FAILED; the message says where it stopped
        errors.print(f"raysim: error: {e}", style="red", markup=False)
        return 1
    except (LeakError, RunSetupError, Diverged, StateStoreError) as e:  # Ray wraps them
        cause = getattr(e, "cause", None) or e
        errors.print(f"raysim: error: {cause}", style="red", markup=False)
        return 1


def entry() -> NoReturn:
    """The ``raysim`` command: ``main``, then a quick exit. Once the command is done (its threads
    joined and its atexit handlers run, as at any exit, and its output flushed), the process ends
    without Python tearing torch, Ray and MLflow down module by module: 0.6 s of a quickstart
    run, 1.5 s where MLflow is loaded (benchmarks/RESULTS.md). ``main`` itself returns, for
    callers in a Python process."""
    import atexit
    import faulthandler

    # a crash in native code prints the Python stack (the driver runs without Ray's C++ crash
    # handler: raysim.launch.private_ray._driver_without_crash_handler)
    faulthandler.enable()
    code = main()
    threading._shutdown()  # what interpreter exit does first: non-daemon threads, pools' hooks
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
