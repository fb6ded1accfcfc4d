"""What one client's local call costs through each training backend, in one process.

A worker's own code (``ClientRunner.run``) trains FedIT clients of a LLaMA built from a config
(``--shape tiny``: 2 layers, hidden 64; LoRA r 8 on q/v; 8 sequences of 47 tokens, batch 8, AdamW)
through ``local.backend`` torch, accelerate and DeepSpeed ZeRO-2 and ZeRO-3, after one warm-up
call each (the process group, the accelerator). Prints seconds per client for each backend, its
ratio to torch, and for DeepSpeed the share of a call spent building and taking apart its engine
(``raysim.training.backends.ENGINE_OVERHEAD``).
"""

from __future__ import annotations

import argparse
import time

from common import machine, report
from fm_clients import SHAPES, SyntheticLM

from raysim.actors.jobs import ClientJob
from raysim.actors.worker import ClientRunner
from raysim.config import load_config
from raysim.models import DataSpec
from raysim.training.backends import ENGINE_OVERHEAD

BACKENDS = {
    "torch": {"backend": "torch"},
    "accelerate": {"backend": "accelerate"},
    "zero2": {"backend": "deepspeed", "deepspeed": {"zero_stage": 2}},
    "zero3": {"backend": "deepspeed", "deepspeed": {"zero_stage": 3}},
}


def per_client(name: str, shape: dict, clients: int, length: int) -> tuple[float, float]:
    """Seconds per client call, and the DeepSpeed engine's seconds per call (0 elsewhere)."""
    cfg = load_config(
        {
            "model": {"name": "llama", "llama": shape, "lora": {"r": 8, "dropout": 0.0}},
            "local": {
                "epochs": 1,
                "batch_size": 8,
                "optimizer": "adamw",
                "lr": 3e-4,
                **BACKENDS[name],
            },  # fmt: skip
            "algorithm": {"name": "fedit"},
            "clients": {"num": clients, "per_round": clients},
            "tracking": {"enabled": False},
        }
    )
    vocab = shape["vocab_size"]
    runner = ClientRunner(cfg, SyntheticLM(clients, 8, length, vocab), spec=DataSpec(
        "causal_lm", (length,), vocab, vocab))  # fmt: skip
    weights = runner.model.get_global()
    runner.run(weights, ClientJob(0, 0, 0, 0))  # warm-up
    before = dict(ENGINE_OVERHEAD)
    t0 = time.perf_counter()
    for j in range(clients):
        runner.run(weights, ClientJob(j, j, 0, 0))
    took = (time.perf_counter() - t0) / clients
    engine = (ENGINE_OVERHEAD["seconds"] - before["seconds"]) / clients
    return took, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--length", type=int, default=47)
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    torch_s = None
    for name in BACKENDS:
        took, engine = per_client(name, SHAPES[args.shape], args.clients, args.length)
        torch_s = torch_s or took
        report(name, s_per_client=took, vs_torch=took / torch_s, engine_share=engine / took)


if __name__ == "__main__":
    main()
