"""FedBaF's server cost per round against the round's client compute (FedBaF spec §4.6, §8.2).

A ViT built from a config (random init; ``--shape b16`` is ViT-B/16, 86 M parameters, bf16 on a
GPU) trains as every tensor of a client would, on synthetic 224×224 images. Measured in one
process, the same round:

* ``client_s``: one client's local work (``train_local``, ``--steps`` optimizer steps of
  ``--batch`` images), times ``--clients`` for the round's client compute;
* ``mix_s``: the FedBaF mix of the whole global vector (τ_t and c_t, then the convex combination
  on the matched coordinates, what the server runs after aggregation), in torch float32 on the
  server's device; ``mix64_s``: the float64 numpy form it replaced (``mixer.r_float64`` and
  ``mixer.mix_float64``), timed in the same run;
* ``audit_s``: the leak auditor's check of one broadcast (each matched tensor fitted at its own
  coordinates as ``a·s + b``, in order, reversed and reordered, and the float32 byte search), in
  torch on the server's device (docs/leak-auditor.md); ``audit_first_s``: the first check, which
  builds the auditor's indexes (with the 2-D blocks' transposes, unless ``--no-transposes``).

The process asks torch for huge pages first, as the coordinator does (``prefer_huge_pages``;
``THP_MEM_ALLOC_ENABLE=0`` in the environment measures without). Last lines: ``mix_fraction``
and ``audit_fraction`` = each cost / the round's client compute.
"""

from __future__ import annotations

from raysim.util.buffers import prefer_huge_pages

prefer_huge_pages()  # as the coordinator does, before torch is imported

import argparse  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import machine, report  # noqa: E402

from raysim.algorithms.context import ServerContext  # noqa: E402
from raysim.algorithms.fedbaf.mixer import (  # noqa: E402
    FedBaF,
    FedBaFParams,
    mix_float64,
    r_float64,
)
from raysim.models.registry import DataSpec, ModelConfig, build_handle  # noqa: E402
from raysim.security.audit import LeakAuditor  # noqa: E402
from raysim.training.loop import LocalTrainingConfig, train_local  # noqa: E402
from raysim.training.tasks import ClassificationTask  # noqa: E402

SHAPES = {
    "b16": {},  # ViTShape's defaults are ViT-B/16
    "small": {
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "intermediate_size": 1536,
    },
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="b16")
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4, help="local steps of one client")
    ap.add_argument("--clients", type=int, default=10, help="clients of one round (m)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile one more mix and check")
    ap.add_argument(
        "--no-transposes", action="store_true", help="the auditor without 2-D blocks' transposes"
    )
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    cfg = ModelConfig(
        name="vit",
        vit=SHAPES[args.shape],
        image={"size": args.image},
        dtype="bfloat16" if cuda else "float32",
        device=device,
    )
    torch.manual_seed(0)
    handle = build_handle(cfg, DataSpec("dense", (3, args.image, args.image), 10))
    module = handle.module.to(device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    params = [p for p in module.parameters() if p.requires_grad]
    layout = handle.layout()
    flat = handle.get_global()
    n = len(flat)
    x = torch.rand(
        args.steps * args.batch,
        3,
        args.image,
        args.image,
        device=device,
        dtype=next(module.parameters()).dtype,
    )
    y = torch.randint(0, 10, (len(x),), device=device)
    local = LocalTrainingConfig(epochs=1, batch_size=args.batch, lr=1e-3)

    def client() -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_local(
            module, params, ClassificationTask(), (x, y), local, torch.Generator().manual_seed(0)
        )
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    client()  # warm-up (kernels, allocator)
    client_s = min(client() for _ in range(args.repeats))

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        foundation = {
            k: (v + rng.normal(0, 0.02, v.shape)).astype(np.float32)
            for k, v in layout.unflatten(flat).items()
        }
        from safetensors.numpy import save_file

        save_file(
            {k: np.ascontiguousarray(v) for k, v in foundation.items()},
            str(Path(tmp) / "model.safetensors"),
        )
        mixer = FedBaF(FedBaFParams(foundation=tmp))
        mixer.setup(ServerContext(0, layout, args.clients))
    aggregated = (flat + rng.normal(0, 1e-3, n)).astype(np.float32)
    mix_times, mix64_times, audit_times = [], [], []
    auditor = LeakAuditor(
        mixer.secrets(), n, "cuda" if cuda else "cpu", transposes=not args.no_transposes
    )
    for t in range(args.repeats):
        t0 = time.perf_counter()
        mixed = mixer.mix(t, flat, aggregated)
        mix_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = r_float64(flat, aggregated, mixer.scope)
        mix_float64(aggregated, mixer.pre["w_pre"], mixer.indices, r)
        mix64_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        auditor.check(mixed, "a broadcast")
        audit_times.append(time.perf_counter() - t0)
    if args.profile:  # where a warm mix and check spend their time (cumulative, top 30)
        import cProfile
        import pstats

        for name, call in (
            ("mix", lambda: mixer.mix(args.repeats, flat, aggregated)),
            ("audit", lambda: auditor.check(mixed, "a broadcast")),
        ):
            prof = cProfile.Profile()
            prof.runcall(call)
            print(f"--- profile of one {name}")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    round_s = client_s * args.clients
    report(
        "fedbaf_cost",
        machine=machine() + (f", {torch.cuda.get_device_name()}" if cuda else ", no GPU"),
        shape=args.shape,
        parameters=n,
        matched_tensors=len(mixer.blocks),
        model_dtype=str(next(module.parameters()).dtype),
        huge_pages=os.environ["THP_MEM_ALLOC_ENABLE"],  # torch's, as on the coordinator
        client_s=client_s,
        clients=args.clients,
        round_client_s=round_s,
        mix_s=min(mix_times),
        mix64_s=min(mix64_times),
        audit_s=min(audit_times),
        audit_first_s=audit_times[0],  # builds the auditor's indexes
        transposes=not args.no_transposes,
        transposed_blocks=len(auditor.shapes_2d),
    )
    report(mix_fraction=min(mix_times) / round_s, audit_fraction=min(audit_times) / round_s)
    report(mix_vs_float64=min(mix_times) / min(mix64_times))


if __name__ == "__main__":
    main()
