"""``multilora_vs_sequential``: k LoRA clients on one frozen LLaMA, one multi-LoRA pass per step
against one PEFT pass per client.

A LLaMA built from a config (``fm_clients.SHAPES``: ``tiny`` on a CPU; ``7b`` is the LLaMA-7B
shape, bf16, for a GPU) with LoRA r 8 on q/v. Each of k clients holds its own adapter and takes
``--steps`` local steps on its own batches of ``--batch`` sequences of ``--length`` tokens
(FedIT's local work). Both ways take the same steps on the same batches with plain SGD:

- ``sequential``: per client, its adapter loaded into the PEFT model, forward, backward, step;
- ``batched``: the k clients' batches concatenated, one forward and backward through
  ``MultiLoRA`` (the base's matmuls once over the k-times larger batch), a step on the stack.

Prints tokens/s of each and their ratio (goal ≥ 2 on a CPU), the largest difference between the
two ways' adapters after the steps, and on a GPU the peak memory and the extra memory per added
client.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import machine, report
from fm_clients import SHAPES

from raysim.models import DataSpec, ModelConfig, build_model
from raysim.models.multilora import MultiLoRA, client_losses


def batches(k: int, steps: int, rows: int, length: int, vocab: int, device) -> list[list[dict]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(k):
        mine = []
        for _ in range(steps):
            ids = torch.randint(4, vocab, (rows, length), generator=g).to(device)
            mine.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
        out.append(mine)
    return out


def sequential(handle, starts, data, lr: float) -> list[list[torch.Tensor]]:
    params = handle.global_parameters()
    finals = []
    for own, steps in zip(starts, data, strict=True):
        with torch.no_grad():
            for p, t in zip(params, own, strict=True):
                p.copy_(t)
        for b in steps:
            loss = handle.module(**b).loss
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    p.sub_(lr * g)
        finals.append([p.detach().clone() for p in params])
    return finals


def batched(handle, starts, data, lr: float) -> list[list[torch.Tensor]]:
    k = len(starts)
    multi = MultiLoRA(handle.module, handle.global_adapter, k)
    for c, own in enumerate(starts):
        multi.load(c, own)
    device = starts[0][0].device
    owner = torch.cat([torch.full((len(s[0]["labels"]),), c) for c, s in enumerate(data)])
    owner = owner.to(device)
    for t in range(len(data[0])):
        joined = {key: torch.cat([s[t][key] for s in data]) for key in data[0][t]}
        with multi.route(owner):
            logits = handle.module(
                input_ids=joined["input_ids"], attention_mask=joined["attention_mask"]
            ).logits
        losses = client_losses(logits, joined["labels"], owner, k)
        grads = torch.autograd.grad(losses.sum(), multi.parameters())
        with torch.no_grad():
            for p, g in zip(multi.parameters(), grads, strict=True):
                p.sub_(lr * g)
    return [multi.unstack(c) for c in range(k)]


def timed(fn, *args) -> tuple[float, object]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--clients", type=int, nargs="+", default=[8])
    parser.add_argument("--batch", type=int, default=2, help="sequences per client per step")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        report(gpu=torch.cuda.get_device_name(0))
    shape = SHAPES[args.shape]
    torch.manual_seed(0)
    cfg = ModelConfig(
        name="llama",
        llama=shape,
        dtype="bfloat16" if cuda else "float32",
        device=str(device),
        lora={"r": 8, "alpha": 16, "dropout": 0.0},
    )
    spec = DataSpec("causal_lm", (args.length,), shape["vocab_size"], shape["vocab_size"])
    handle = build_model(cfg, spec)
    report("config", shape=args.shape, batch=args.batch, length=args.length, steps=args.steps)
    lr, base_mem = 1e-3, torch.cuda.memory_allocated() if cuda else 0
    for k in args.clients:
        g = torch.Generator().manual_seed(k)
        starts = [
            [(0.02 * torch.randn(p.shape, generator=g)).to(p) for p in handle.global_parameters()]
            for _ in range(k)
        ]
        data = batches(k, args.steps, args.batch, args.length, shape["vocab_size"], device)
        tokens = k * args.steps * args.batch * args.length
        seq_s, bat_s, gap = [], [], 0.0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            runs = [
                tuple(timed(way, handle, starts, data, lr) for way in (sequential, batched))
                for _ in range(args.repeats)
            ]
        except torch.cuda.OutOfMemoryError:  # say where the card's memory ends, then go on
            report(f"k{k}", out_of_memory=True)
            del starts, data
            torch.cuda.empty_cache()
            continue
        for (s, seq_out), (b, bat_out) in runs:
            seq_s.append(s)
            bat_s.append(b)
            gap = max(
                gap,
                max(
                    float((x.float() - y.float()).abs().max())
                    for xs, ys in zip(seq_out, bat_out, strict=True)
                    for x, y in zip(xs, ys, strict=True)
                ),
            )
        seq_tps, bat_tps = tokens / min(seq_s), tokens / min(bat_s)
        fields = dict(sequential_tokens_s=seq_tps, batched_tokens_s=bat_tps, max_gap=gap)
        if cuda:
            fields["peak_mem_gb"] = (torch.cuda.max_memory_allocated() - base_mem) / 2**30
        report(f"k{k}", **fields)
        report(f"k{k}.ratio", multilora_vs_sequential=bat_tps / seq_tps)


if __name__ == "__main__":
    main()
