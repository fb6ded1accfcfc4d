"""Foundation-model clients: LoRA training throughput through raysim vs a plain PEFT loop.

A LLaMA built from a config (random init; ``--shape 7b`` is the LLaMA-7B shape, bf16 on a GPU)
with LoRA r=8 on q/v trains on fixed-length synthetic token batches. Measured in one process:

* ``plain``: a single-process PEFT loop (fresh AdamW per client, like a raysim job);
* ``raysim``: the same clients through ``ClientRunner.run`` — the exact code a Ray worker runs
  per job (global vector in, personal state swapped, local training, delta out);
* ``swap_ms``: loading one client's global + personal adapters into the resident model.

Last line: ``fm_throughput_ratio`` = raysim tokens/s / plain tokens/s (FedIT on both sides);
with ``--method fedoa`` instead ``fedoa_cost_vs_fedit_plain`` (FedOA trains a second adapter with a
teacher forward; FedOA spec §2.10 expects 2.3–2.5×). On a GPU it also reports peak memory.
Ray's own per-batch overhead is measured by ``benchmarks/overhead.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from common import machine, report

from raysim.actors.jobs import ClientJob
from raysim.actors.worker import ClientRunner
from raysim.config import load_config
from raysim.models import DataSpec
from raysim.training.loop import train_local
from raysim.training.tasks import CausalLMTask

SHAPES = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=512,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    "7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    ),
}


class SyntheticLM:
    """Fixed-length random token sequences per client (loss on every token)."""

    input_kind = "causal_lm"

    def __init__(self, clients: int, examples: int, length: int, vocab: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.data = [rng.integers(4, vocab, size=(examples, length)) for _ in range(clients)]
        self.length, self.vocab = length, vocab

    def client_data(self, j: int) -> dict[str, np.ndarray]:
        ids = self.data[j]
        return {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids.copy()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--examples", type=int, default=16, help="per client")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--method", default="fedit", help="fedit or fedoa (two adapters)")
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    cuda = torch.cuda.is_available()
    if cuda:
        report(gpu=torch.cuda.get_device_name(0))
    shape = SHAPES[args.shape]
    cfg = load_config(
        {
            "model": {
                "name": "llama",
                "llama": shape,
                "dtype": "bfloat16" if cuda else "float32",
                "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
            },
            "local": {"epochs": 1, "batch_size": args.batch, "optimizer": "adamw", "lr": 3e-4},
            "algorithm": {"name": args.method},
            "clients": {"num": args.clients, "per_round": args.clients},
            "tracking": {"enabled": False},
        }
    )
    data = SyntheticLM(args.clients, args.examples, args.length, shape["vocab_size"])
    spec = DataSpec("causal_lm", (args.length,), shape["vocab_size"], shape["vocab_size"])
    tokens = args.clients * args.examples * args.length
    report(
        "config",
        shape=args.shape,
        clients=args.clients,
        examples=args.examples,
        length=args.length,
        batch=args.batch,
        method=args.method,
        tokens_per_pass=tokens,
    )

    t0 = time.perf_counter()
    runner = ClientRunner(cfg, data, spec=spec)  # one resident base, as in a worker
    report(build_s=time.perf_counter() - t0)
    handle = runner.model
    weights = handle.get_global()
    report(lora_params=weights.size, base_params=sum(p.numel() for p in handle.module.parameters()))

    def plain_pass() -> float:
        task = CausalLMTask(next(handle.module.parameters()).device)
        t = time.perf_counter()
        for j in range(args.clients):
            handle.set_global(weights)
            handle.use("global")
            d = {k: torch.tensor(v) for k, v in data.client_data(j).items()}
            train_local(
                handle.module,
                handle.global_parameters(),
                task,
                d,
                cfg.local,
                torch.Generator().manual_seed(j),
            )
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def raysim_pass() -> float:
        t = time.perf_counter()
        for j in range(args.clients):
            runner.run(weights, ClientJob(j, j, 0, 0))
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t

    plain_pass(), raysim_pass()  # warm-up
    plain, rays = [], []
    for _ in range(3):
        plain.append(plain_pass())
        rays.append(raysim_pass())
    p_tps, r_tps = tokens / statistics.median(plain), tokens / statistics.median(rays)
    state = handle.get_state()
    t = time.perf_counter()
    for _ in range(20):
        handle.set_global(weights)
        handle.set_state(state or None, 0)
    swap_ms = (time.perf_counter() - t) / 20 * 1e3
    report(plain_tokens_per_s=p_tps, raysim_tokens_per_s=r_tps, swap_ms=swap_ms)
    if cuda:
        report(peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    if args.method == "fedit":
        report(fm_throughput_ratio=r_tps / p_tps)
    else:  # FedOA trains two adapters (+ a teacher forward): its cost relative to one FedIT pass
        report(**{f"{args.method}_cost_vs_fedit_plain": p_tps / r_tps})


if __name__ == "__main__":
    main()
