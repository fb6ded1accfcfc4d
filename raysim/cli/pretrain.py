"""``raysim pretrain KIND``: a foundation model, offline (``raysim foundation``: the old name of
``raysim pretrain tiny-llama``)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from raysim.cli.common import console, errors


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

    overrides: dict[str, Any] = {
        "data_seed": args.data_seed or 0,
        "init_seed": args.seed or 0,
        "kernels": args.kernels or "portable",
    }
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
        f"({meta['machine']['kernels']} kernels: {meta['machine']['cpu_capability']}). Use it "
        "with\n"
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
        ("data_seed", "steps", "families", "seed", "kernels"),
    ),
    "digits": (_pretrain_digits, "foundations/digits", ("epochs", "samples", "seed")),
    "markov": (_pretrain_markov, "foundations/markov", ("epochs", "seed")),
}
PRETRAIN_OPTIONS = ("data_seed", "steps", "families", "epochs", "samples", "seed", "kernels")


def cmd_pretrain(args: argparse.Namespace) -> int:
    """``raysim pretrain KIND``: a foundation model, offline. ``tiny-llama``: FedOA's tiny
    pre-trained LLaMA for Flan-mini (FedOA spec §7.1); ``digits`` (the 20-class flipped digit task)
    and ``markov`` (chain A's language model): FedBaF's small foundations (FedBaF spec §8.1)."""
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
    if args.kind == "tiny-llama" and (args.kernels or "portable") == "portable":
        from raysim.util.kernels import request_portable_kernels

        request_portable_kernels()  # before torch loads (the CLI has not imported it)
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
