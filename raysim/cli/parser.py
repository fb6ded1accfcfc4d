"""``raysim``'s argument parser: every command, its options and the function that runs it."""

from __future__ import annotations

import argparse

from raysim.cli.extract import cmd_extract
from raysim.cli.leave_one_out import cmd_leave_one_out
from raysim.cli.methods import cmd_methods
from raysim.cli.pretrain import PRETRAIN, cmd_foundation, cmd_pretrain
from raysim.cli.run import cmd_run
from raysim.cli.traces import cmd_traces
from raysim.cli.tune import cmd_tune
from raysim.cli.ui import cmd_ui


def _tiny_llama_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-seed", type=int, default=None, help="tiny-llama: Flan-mini word pools")
    p.add_argument("--steps", type=int, default=None, help="tiny-llama: optimiser steps (8000)")
    p.add_argument("--families", default=None, help="tiny-llama: corpus families (default: all)")
    p.add_argument(
        "--kernels",
        choices=("portable", "native"),
        default=None,
        help="tiny-llama: portable (default) gives the same weights on any x86 CPU; native, "
        "this CPU's faster kernels, the same weights only on it",
    )


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: its positionals (CONFIG, then ``key=value`` overrides) may come before,
    between or after its options (``raysim run CONFIG --dry-run rounds=3``), where plain argparse
    stops taking positionals at the first option."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self._intermixing:  # parse_known_intermixed_args calls this, twice
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


#: ``--address``: what ``raysim.launch.private_ray`` takes (``ray_address``, ``check_reachable``)
ADDRESS_HELP = (
    "a Ray cluster to join: auto (the one `ray start` made on this machine), HOST:PORT (its head "
    "node, e.g. 10.0.0.5:6379) or ray://HOST:PORT (Ray Client); default: $RAY_ADDRESS, else a "
    "private Ray of this command's own"
)


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
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    p = sub.add_parser("run", help="run one simulation from a YAML config")
    p.add_argument("config", nargs="?", help="path to a YAML config (optional with --resume)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rounds=50 delays.sigma=20")
    p.add_argument("--address", default=None, metavar="ADDRESS", help=ADDRESS_HELP)
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_ID|DIR",
        help="continue a checkpointed run (an MLflow run id or a checkpoint.dir) from its last "
        "checkpoint; its config.yaml is used unless CONFIG is given (then it must match)",
    )
    p.add_argument("--force", action="store_true", help="resume even a run still marked RUNNING")
    _trust_modules_option(p)
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
        p.add_argument("--address", default=None, metavar="ADDRESS", help=ADDRESS_HELP)
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
    p.add_argument("--address", default=None, metavar="ADDRESS", help=ADDRESS_HELP)
    p.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the stopped sweep whose Tune state is DIR (checked by --dry-run too)",
    )
    p.add_argument("--storage", default="tune", help="where Tune keeps its state (default ./tune)")
    p.add_argument("--dry-run", action="store_true", help="check the sweep; start nothing")
    p.set_defaults(func=cmd_tune)
    p = sub.add_parser(
        "traces",
        help="device traces (devices:) in raysim's CSV/Parquet format: convert FedScale's, "
        "generate synthetic ones, or summarise a folder",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--fedscale", default=None, help="FedScale's client_device_capacity file")
    src.add_argument("--synthetic", type=int, default=None, help="this many synthetic devices")
    src.add_argument("--folder", default=None, help="a folder in raysim's format, to summarise")
    p.add_argument("--availability", default=None, help="FedScale's client_behave_trace file")
    p.add_argument("--seed", type=int, default=0, help="--synthetic: the generator's seed")
    p.add_argument("--out", default=None, help="write the traces to this folder")
    p.add_argument("--format", choices=("csv", "parquet"), default="csv")
    p.set_defaults(func=cmd_traces)
    p = sub.add_parser("methods", help="list registered methods and their parameters")
    p.add_argument("name", nargs="?", help="one method: each parameter's type, default and meaning")
    p.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module of your own first (a dotted name or a .py file, as algorithm.module "
        "takes), so that the methods it registers are listed; may be repeated",
    )
    p.set_defaults(func=cmd_methods)
    p = sub.add_parser(
        "pretrain",
        help="a foundation model, offline: tiny-llama (FedOA's tiny LLaMA, FedOA spec §7.1), "
        "digits or markov (FedBaF's, FedBaF spec §8.1)",
    )
    p.add_argument("kind", choices=list(PRETRAIN), help="which foundation")
    p.add_argument("--out", default=None, help="output directory (default: foundations/...)")
    _tiny_llama_options(p)
    p.add_argument("--epochs", type=int, default=None, help="digits, markov: training epochs")
    p.add_argument("--samples", type=int, default=None, help="digits: foundation pool samples")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the weights' init and the data's order (default 0): digits, markov, tiny-llama",
    )
    p.set_defaults(func=cmd_pretrain)
    p = sub.add_parser("foundation", help="the old name of raysim pretrain tiny-llama")
    p.add_argument("--out", default=None, help="output directory (default: foundations/tiny-s0)")
    _tiny_llama_options(p)
    # the options of raysim pretrain that this alias has not, unset
    p.set_defaults(func=cmd_foundation, kind="tiny-llama", epochs=None, samples=None, seed=None)
    p = sub.add_parser(
        "extract",
        help="FedBaF's extraction harness (E0/E1/E2, FedBaF spec §6) against a run with observers",
    )
    p.add_argument("run", help="the attacked run: an MLflow run id or its config YAML")
    _trust_modules_option(p)
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


def _trust_modules_option(p: argparse.ArgumentParser) -> None:
    """``--trust-modules`` (``raysim run``, ``raysim extract``)."""
    p.add_argument(
        "--trust-modules",
        action="store_true",
        help="import the modules (module:) that a config read from a checkpoint or an MLflow run "
        "names; without it such a config is refused, since that code is not a file you gave",
    )
