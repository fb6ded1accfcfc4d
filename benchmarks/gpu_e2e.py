"""raysim's main path end to end, step by step, as ``benchmarks/gpu_e2e.sh`` runs it on a GPU.

Every raysim step goes through the ``raysim run`` / ``raysim tune`` command (``python -m
raysim``), with an MLflow store of its own under ``--out``; the figures are read back from that
store (each round's metrics, ``placement.json``, ``workers.json``, ``weights.safetensors``).

Steps (each writes ``OUT/<step>.json``; ``report`` gathers them into ``OUT/figures.md``):

* ``plain``: the reference, a plain PEFT loop over the same clients' data, rounds and local
  recipe (``LlamaForCausalLM`` built from the same config, LoRA r 8 on q/v, a fresh AdamW per
  client), timed in its own process so that it holds no GPU memory while raysim runs;
* ``fedit``: FedIT in five placements: one worker at 1.0 GPU and four at 0.25 GPU, clients one
  after another (their digests must be equal: placement must not change results), then
  multi-LoRA batched clients (``workers.execution: batched``) with one worker (a group of 8), one
  worker with ``workers.cuda_deterministic: false`` (what deterministic kernels cost), and four
  workers with batched groups of 2;
* ``backends``: the one-worker run with ``local.backend`` DeepSpeed ZeRO-2, ZeRO-3 and
  Accelerate (against the torch backend's run of ``fedit``), with DeepSpeed's per-call engine cost;
* ``fedoa``: FedOA (two adapters and the teacher's forward) on the one-worker placement;
* ``tune``: ``raysim tune`` of 4 trials at 0.5 GPU each under ASHA, on a small LLaMA;
* ``fedbaf``: FedBaF over FedAvg on ViT-B/16 (digits at 224², a random-init foundation of the
  same shape), the coordinator on the GPU: the server's mix and the leak auditor's share of a round.

``--shape tiny`` runs every step on the CPU in minutes (a two-layer LLaMA, a two-layer ViT at
32²), against a Ray started with one logical GPU (``--address``), so that the script is known to
work before a GPU is lent. Numbers printed there are CPU numbers and say so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine  # noqa: E402

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

#: LLaMA shapes (``model.llama``); ``7b`` is LLaMA-7B's.
LLAMA = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4},
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32},
}  # fmt: skip
#: The sweep's small LLaMA (``tune``) on each shape.
TUNE_LLAMA = {
    "tiny": LLAMA["tiny"],
    "7b": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
           "num_attention_heads": 16, "num_key_value_heads": 16},
}  # fmt: skip
#: ViT shapes (``model.vit``) and image sides for ``fedbaf``; ``7b`` runs ViT-B/16 at 224².
VIT = {
    "tiny": ({"patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 64}, 32),
    "7b": ({}, 224),
}  # fmt: skip
VOCAB = 32000
#: FedIT's placements: name → overrides (``workers``).
PLACEMENTS = {
    "w1_seq": ["workers.count=1", "workers.num_gpus=1.0", "workers.execution=sequential"],
    "w4_seq": ["workers.count=4", "workers.num_gpus=0.25", "workers.execution=sequential"],
    "w1_lora8": ["workers.count=1", "workers.num_gpus=1.0", "workers.execution=batched",
                 "workers.group_size=8"],
    "w1_seq_fast": ["workers.count=1", "workers.num_gpus=1.0", "workers.execution=sequential",
                    "workers.cuda_deterministic=false"],
    "w4_lora2": ["workers.count=4", "workers.num_gpus=0.25", "workers.execution=batched",
                 "workers.group_size=2"],
}  # fmt: skip
#: The other training backends, cheapest first (ZeRO-3 partitions the whole base every call).
BACKENDS = {
    "accelerate": ["local.backend=accelerate"],
    "deepspeed_zero2": ["local.backend=deepspeed", "local.deepspeed.zero_stage=2"],
    "deepspeed_zero3": ["local.backend=deepspeed", "local.deepspeed.zero_stage=3"],
}


def on_gpu(shape: str) -> bool:
    return shape != "tiny"


def fedit_config(shape: str, rounds: int) -> dict[str, Any]:
    """FedIT on Flan-mini (18 clients: 6 training sub-datasets × 3 shards; 8 a round)."""
    gpu = on_gpu(shape)
    return {
        "name": "e2e-fedit",
        "seed": 0,
        "rounds": rounds,
        "clients": {"num": 18, "per_round": 8},
        "data": {
            "name": "flan_mini",
            "text": {
                "shards_per_task": 3,
                "n_train": 96 if gpu else 24,
                "n_test": 8,
                "cutoff_len": 128,
            },
        },  # fmt: skip
        "model": {
            "name": "llama",
            "llama": {**LLAMA[shape], "vocab_size": VOCAB if gpu else 512},
            "dtype": "bfloat16" if gpu else "float32",
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "targets": ["q_proj", "v_proj"]},
        },
        "local": {"epochs": 1, "batch_size": 8, "optimizer": "adamw", "lr": 3e-4},
        "algorithm": {"name": "fedit"},
        "eval": {"every": 10_000, "rouge": "never", "batch_size": 16},  # once, after the last
        "workers": {"num_cpus": 1.0 if gpu else 0.25},
        "tracking": {"experiment": "gpu-e2e"},
    }


def fedbaf_config(shape: str, rounds: int, foundation: Path) -> dict[str, Any]:
    vit, side = VIT[shape]
    return {
        "name": "e2e-fedbaf",
        "seed": 0,
        "rounds": rounds,
        "clients": {"num": 10, "per_round": 5},
        "data": {"name": "digits", "partition": {"kind": "iid"}},
        "model": {"name": "vit", "vit": vit, "image": {"size": side}},
        "local": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_steps": 4},
        "algorithm": {"name": "fedbaf", "base": "fedavg", "foundation": str(foundation),
                      "psi": 1.0},
        "audit": {"leaks": True},
        "eval": {"every": 1},
        "workers": {"count": 1, "num_gpus": 0.5, "num_cpus": 1.0 if on_gpu(shape) else 0.25},
        "coordinator": {"num_gpus": 0.5},
        "tracking": {"experiment": "gpu-e2e"},
    }  # fmt: skip


def tune_config(shape: str) -> dict[str, Any]:
    cfg = fedit_config(shape, rounds=4)
    cfg["name"] = "e2e-tune"
    cfg["model"]["llama"] = {**TUNE_LLAMA[shape], "vocab_size": 512 if shape == "tiny" else VOCAB}
    cfg["data"]["text"]["n_train"] = 24
    cfg["eval"] = {"every": 1, "rouge": "never", "batch_size": 16}
    cfg["workers"] = {"count": 1, "num_gpus": 0.5, "num_cpus": 1.0 if on_gpu(shape) else 0.25}
    cfg["tune"] = {
        "metric": "ood_loss",
        "mode": "min",
        "scheduler": "asha",
        "asha": {"grace_period": 2, "reduction_factor": 2},
        "num_samples": 1,
        "space": {"local.lr": {"grid": [1e-4, 3e-4, 1e-3, 3e-3]}},
    }
    return cfg


# --- running raysim and reading its runs back ---------------------------------------------


class Store:
    """The step's MLflow store (sqlite under ``--out``) and the ``raysim`` command against it."""

    def __init__(self, out: Path, address: str | None) -> None:
        self.out = out
        self.uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
        self.address = address
        (out / "logs").mkdir(parents=True, exist_ok=True)
        (out / "configs").mkdir(parents=True, exist_ok=True)

    def raysim(
        self, verb: str, label: str, cfg: dict[str, Any], *overrides: str, limit: float = 600
    ) -> float:
        """``python -m raysim VERB config overrides``; its output in ``logs/LABEL.log``; the
        command's wall seconds. Raises with the log's tail if it fails or outlasts ``limit``
        seconds (then it gets SIGTERM, which ends its run and its private Ray, and SIGKILL 15 s
        later)."""
        import yaml

        path = self.out / "configs" / f"{label}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        cmd = [sys.executable, "-m", "raysim", verb, str(path), *overrides]
        if verb == "run":
            cmd.append(f"tracking.run_name={label}")
        else:
            cmd += ["--storage", str(self.out / "tune")]
        if self.address:
            cmd += ["--address", self.address]
        env = {**os.environ, "MLFLOW_TRACKING_URI": self.uri}
        log = self.out / "logs" / f"{label}.log"
        t0 = time.perf_counter()
        with log.open("w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=self.out)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise RuntimeError(f"{label}: stopped after its limit of {limit:.0f} s") from None
        took = time.perf_counter() - t0
        if rc != 0:
            tail = "\n".join(log.read_text().splitlines()[-25:])
            raise RuntimeError(f"{' '.join(cmd)} exited {rc}:\n{tail}")
        print(f"{label}: {verb} took {took:.1f} s", flush=True)
        return took

    def client(self) -> Any:
        import mlflow

        return mlflow.MlflowClient(self.uri)

    def run_of(self, label: str) -> Any:
        c = self.client()
        exp = c.get_experiment_by_name("gpu-e2e")
        runs = c.search_runs(
            [exp.experiment_id],
            f"attributes.run_name = '{label}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not runs:
            raise RuntimeError(f"no MLflow run named {label!r} in {self.uri}")
        return runs[0]

    def artifact(self, run_id: str, name: str) -> Path:
        dest = self.out / "artifacts" / run_id
        dest.mkdir(parents=True, exist_ok=True)
        return Path(self.client().download_artifacts(run_id, name, str(dest)))

    def history(self, run_id: str, key: str) -> list[float]:
        """One value per round, in round order."""
        points = self.client().get_metric_history(run_id, key)
        return [p.value for p in sorted(points, key=lambda p: p.step)]


def round_clients(cfg: dict[str, Any], rounds: range) -> dict[int, list[int]]:
    """The clients each round dispatches: the run's own schedule (``raysim.clock``)."""
    from raysim.clock import Schedule
    from raysim.config import load_config
    from raysim.delays import build_delay_model

    rc = load_config(cfg)
    delays = build_delay_model(rc.delays, rc.clients.num, rc.seed)
    schedule = Schedule(rc.clients.num, rc.clients.per_round, delays, rc.seed)
    out = {}
    for k in range(max(rounds) + 1):
        out[k] = schedule.dispatch(k).clients.tolist()
    return {k: out[k] for k in rounds}


def dataset(cfg: dict[str, Any]) -> Any:
    """The run's dataset, built once per data section (a step's runs share their clients)."""
    key = json.dumps([cfg["data"], cfg["clients"], cfg["seed"]])
    if key not in _DATASETS:
        from raysim.config import load_config
        from raysim.runtime import run_dataset

        _DATASETS[key] = run_dataset(load_config(cfg))
    return _DATASETS[key]


_DATASETS: dict[str, Any] = {}


def client_tokens(cfg: dict[str, Any]) -> dict[int, int]:
    """Tokens one local call trains on, per client: epochs × the client's unpadded tokens."""
    ds, epochs = dataset(cfg), cfg["local"]["epochs"]
    return {
        j: int(ds.client_data(j)["attention_mask"].sum()) * epochs
        for j in range(cfg["clients"]["num"])
    }


def run_figures(store: Store, label: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """What one ``raysim run`` shows: tokens/s over its steady rounds (every round but the
    first), each round's time split, the workers' placement, memory and seconds, its digest."""
    run = store.run_of(label)
    rid = run.info.run_id
    keys = ("round_wall_s", "round_wait_s", "round_compute_s", "server_wall_s", "audit_wall_s")
    hist = {k: store.history(rid, k) for k in keys}
    rounds = len(hist["round_wall_s"])
    steady = range(1, rounds) if rounds > 1 else range(rounds)
    placement = json.loads(store.artifact(rid, "placement.json").read_text())
    workers = json.loads(store.artifact(rid, "workers.json").read_text())
    summary = store.artifact(rid, "summary.yaml").read_text()
    digest = next(
        line.split(":", 1)[1].strip().strip("'\"")
        for line in summary.splitlines()
        if line.startswith("weights_digest")
    )

    def mean(key: str) -> float | None:
        values = hist[key]
        return statistics.fmean(values[k] for k in steady) if values else None

    wall, wait = mean("round_wall_s"), mean("round_wait_s")
    compute, server = mean("round_compute_s"), mean("server_wall_s")
    out: dict[str, Any] = {
        "run_id": rid,
        "digest": digest,
        "rounds": rounds,
        "steady_rounds": len(steady),
        "round_s": wall,
        "first_round_s": hist["round_wall_s"][0],
        "split_s": {
            "client_compute": compute,
            "transfer_and_scheduling": max(0.0, (wait or 0.0) - (compute or 0.0)),
            "aggregation": server,
            "audit": mean("audit_wall_s"),
            "other": max(0.0, wall - (wait or 0.0) - (server or 0.0)),
            "evaluation_total": sum(w.get("eval_s", 0.0) for w in workers),
        },
        "workers": [
            {
                k: w.get(k)
                for k in (
                    "worker",
                    "pid",
                    "gpu_ids",
                    "jobs_run",
                    "train_s",
                    "eval_s",
                    "peak_gpu_bytes",
                    "deepspeed_engines",
                    "deepspeed_engine_s",
                )
            }
            for w in workers
        ],  # fmt: skip
        "placement_gpu_ids": [w.get("gpu_ids") for w in placement["workers"]],
    }
    if cfg.get("data", {}).get("name") == "flan_mini":
        tokens = client_tokens(cfg)
        per_round = round_clients(cfg, steady)
        trained = sum(tokens[j] for k in steady for j in per_round[k])
        out["tokens_per_s"] = trained / sum(hist["round_wall_s"][k] for k in steady)
    return out


def weight_gap(store: Store, a: str, b: str) -> float:
    """The largest absolute difference between two runs' final global weights."""
    import numpy as np
    from safetensors.numpy import load_file

    wa = load_file(str(store.artifact(a, "weights.safetensors")))
    wb = load_file(str(store.artifact(b, "weights.safetensors")))
    return max(float(np.max(np.abs(wa[k].astype(np.float64) - wb[k]))) for k in wa)


# --- the steps ------------------------------------------------------------------------------


def step_plain(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """A plain PEFT loop: the same clients, rounds, data and local recipe as ``fedit``'s runs,
    each client from the round's global adapter with a fresh AdamW, its delta read back to the
    host as a client would send it. No raysim code trains here."""
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from raysim.config import load_config

    cfg = fedit_config(args.shape, args.rounds)
    m = cfg["model"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":  # as many threads as a raysim worker trains with
        torch.set_num_threads(load_config(cfg).workers.threads)
    dtype = getattr(torch, m["dtype"])
    torch.manual_seed(0)
    t0 = time.perf_counter()
    config = LlamaConfig(
        **m["llama"], max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=0
    )
    with device:
        base = LlamaForCausalLM(config).to(dtype)
    lora = m["lora"]
    model = get_peft_model(
        base,
        LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=0.0,
            target_modules=lora["targets"],
        ),
    )
    build_s = time.perf_counter() - t0
    trainable = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in trainable]

    ds = dataset(cfg)
    steady = range(1, args.rounds)
    rounds = round_clients(cfg, range(args.rounds))
    tokens = client_tokens(cfg)
    bs = cfg["local"]["batch_size"]

    def one_client(j: int) -> None:
        with torch.no_grad():
            for p, s in zip(trainable, start, strict=True):
                p.copy_(s)
        opt = torch.optim.AdamW(trainable, lr=cfg["local"]["lr"])
        data = {k: torch.as_tensor(v, device=device) for k, v in ds.client_data(j).items()}
        n = len(data["input_ids"])
        order = torch.randperm(n, generator=torch.Generator().manual_seed(j)).to(device)
        model.train()
        for i in range(0, n, bs):
            idx = order[i : i + bs]
            loss = model(**{k: v[idx] for k, v in data.items()}).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        [np.asarray((p.detach() - s).float().cpu()) for p, s in zip(trainable, start, strict=True)]

    def one_round(k: int) -> float:
        t = time.perf_counter()
        for j in rounds[k]:
            one_client(j)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    first = one_round(0)  # warm-up, as raysim's first round is
    times = [one_round(k) for k in steady]
    trained = sum(tokens[j] for k in steady for j in rounds[k])
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return {
        "build_s": build_s,
        "first_round_s": first,
        "round_s": statistics.fmean(times),
        "tokens_per_s": trained / sum(times),
        "peak_gpu_bytes": peak,
        "base_params": sum(p.numel() for p in base.parameters()),
        "lora_params": sum(p.numel() for p in trainable),
    }


def _save(out: Path, step: str, result: dict[str, Any]) -> None:
    """A step's figures so far (a step stopped at its limit keeps the runs it finished)."""
    (out / f"{step}.json").write_text(json.dumps(result, indent=1, default=str))


def step_fedit(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    store = Store(out, args.address)
    cfg = fedit_config(args.shape, args.rounds)
    res: dict[str, Any] = {}
    for name in args.placements:
        res[name] = {"command_s": store.raysim("run", f"fedit_{name}", cfg, *PLACEMENTS[name])}
        res[name].update(run_figures(store, f"fedit_{name}", cfg))
        _save(out, "fedit", res)
    if "w1_seq" in res and "w4_seq" in res:
        a, b = res["w1_seq"], res["w4_seq"]
        res["placement_digest_equal"] = a["digest"] == b["digest"]
        res["placement_weight_gap"] = weight_gap(store, a["run_id"], b["run_id"])
    if "w4_seq" in res:  # four actors, one card
        ids = res["w4_seq"]["placement_gpu_ids"]
        res["four_workers_gpu_ids"] = ids
        res["four_workers_one_gpu"] = len(ids) == 4 and len({tuple(i) for i in ids}) == 1
    return res


def step_backends(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    store = Store(out, args.address)
    cfg = fedit_config(args.shape, args.rounds)
    res: dict[str, Any] = {}
    for name in args.backends:
        label = f"backend_{name}"
        try:
            overrides = (*PLACEMENTS["w1_seq"], *BACKENDS[name])
            took = store.raysim("run", label, cfg, *overrides, limit=args.run_limit)
            res[name] = {"command_s": took, **run_figures(store, label, cfg)}
            w = res[name]["workers"][0]
            if w.get("deepspeed_engines"):
                res[name]["engine_s_per_call"] = w["deepspeed_engine_s"] / w["deepspeed_engines"]
                res[name]["engine_share_of_training"] = w["deepspeed_engine_s"] / w["train_s"]
        except RuntimeError as e:  # one backend's failure is a finding, not the step's end
            res[name] = {"error": str(e)[-2000:]}
        _save(out, "backends", res)
    return res


def step_fedoa(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    store = Store(out, args.address)
    cfg = fedit_config(args.shape, args.rounds)
    cfg["algorithm"] = {"name": "fedoa", "lambda": 0.5, "distance": "l2"}
    took = store.raysim("run", "fedoa_w1", cfg, *PLACEMENTS["w1_seq"])
    return {"command_s": took, **run_figures(store, "fedoa_w1", cfg)}


def step_tune(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    store = Store(out, args.address)
    took = store.raysim("tune", "tune", tune_config(args.shape))
    c = store.client()
    exp = c.get_experiment_by_name("gpu-e2e")
    runs = c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    parents = {r.data.tags.get("mlflow.parentRunId") for r in runs} - {None}
    sweep = next(r for r in runs if r.info.run_id in parents)  # this step's sweep: the newest
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep.info.run_id]
    return {
        "sweep_wall_s": took,
        "trials": len(trials),
        "trial_status": sorted(r.info.status for r in trials),
        "rounds_run": sorted(len(store.history(r.info.run_id, "round_wall_s")) for r in trials),
    }


def step_fedbaf(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from raysim.config import load_config
    from raysim.models.pretraining import save_foundation
    from raysim.models.registry import build_handle
    from raysim.runtime import data_spec, run_dataset

    store = Store(out, args.address)
    foundation = out / "foundation-vit"
    cfg = fedbaf_config(args.shape, args.rounds, foundation)
    rc = load_config({**cfg, "algorithm": {"name": "fedavg"}})
    import torch

    torch.manual_seed(1)  # a foundation other than the clients' own start
    handle = build_handle(rc.model, data_spec(run_dataset(rc)))
    with torch.no_grad():  # as if trained: no tensor left at its constant init (norms' ones)
        for p in handle.module.parameters():
            p.add_(0.02 * torch.randn_like(p))
    save_foundation(handle, foundation, {"task": "gpu_e2e random-init ViT"})
    del handle
    took = store.raysim("run", "fedbaf_vit", cfg)
    res = {"command_s": took, **run_figures(store, "fedbaf_vit", cfg)}
    split = res["split_s"]
    res["server_share"] = (split["aggregation"] or 0.0) / res["round_s"]
    res["audit_share"] = (split["audit"] or 0.0) / res["round_s"]
    return res


STEPS = {
    "plain": step_plain,
    "fedit": step_fedit,
    "backends": step_backends,
    "fedoa": step_fedoa,
    "tune": step_tune,
    "fedbaf": step_fedbaf,
}


# --- the report -----------------------------------------------------------------------------


def _load(out: Path, step: str) -> dict[str, Any] | None:
    p = out / f"{step}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _gib(b: Any) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def _split(r: dict[str, Any]) -> str:
    s = r["split_s"]
    parts = ("client_compute", "transfer_and_scheduling", "aggregation", "other")
    return " / ".join(f"{s[p]:.3f}" if s[p] is not None else "-" for p in parts)


def report(out: Path) -> dict[str, Any]:
    """Every step's figures, the ratios the issue asks for, and a Markdown page of them."""
    meta = _load(out, "machine") or {}
    plain, fedit = _load(out, "plain"), _load(out, "fedit") or {}
    backends, fedoa = _load(out, "backends") or {}, _load(out, "fedoa")
    tune, fedbaf = _load(out, "tune"), _load(out, "fedbaf")
    lines = [f"Device: {meta.get('device', '?')}; {meta.get('machine', '?')}; shape "
             f"{meta.get('shape', '?')}.", ""]  # fmt: skip
    for name, where in meta.get("libraries", {}).items():
        lines.insert(-1, f"- {name} {where}")
    figures: dict[str, Any] = {}
    ref = fedit.get("w1_seq")
    if plain and ref:
        figures["fm_e2e_ratio"] = ref["tokens_per_s"] / plain["tokens_per_s"]
    lines += [
        "| run | tokens/s | vs plain PEFT | round s | compute / transfer / aggregation / "
        "other s | eval s (total) | peak GiB per worker | digest (rounds) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if plain:
        lines.append(
            f"| plain PEFT loop | {plain['tokens_per_s']:.0f} | 1 | {plain['round_s']:.3f} "
            f"| - | - | {_gib(plain['peak_gpu_bytes'])} | - |"
        )
    rows = [(f"FedIT {k}", v) for k, v in fedit.items() if k in PLACEMENTS]
    rows += [(f"FedIT w1_seq, {k}", v) for k, v in backends.items()]
    if fedoa:
        rows.append(("FedOA w1_seq", fedoa))
    for name, r in rows:
        if "error" in r:
            lines.append(f"| {name} | failed: see backends.json | | | | | | |")
            continue
        vs = f"{r['tokens_per_s'] / plain['tokens_per_s']:.3f}" if plain else "-"
        peaks = ", ".join(_gib(w["peak_gpu_bytes"]) for w in r["workers"])
        lines.append(
            f"| {name} | {r['tokens_per_s']:.0f} | {vs} | {r['round_s']:.3f} | {_split(r)} | "
            f"{r['split_s']['evaluation_total']:.2f} | {peaks} | {r['digest'][:8]} "
            f"({r['rounds']}) |"
        )
    if ref and "w4_seq" in fedit:
        figures["four_workers_vs_one"] = fedit["w4_seq"]["tokens_per_s"] / ref["tokens_per_s"]
        figures["four_workers_one_gpu"] = fedit["four_workers_one_gpu"]
        figures["placement_digest_equal"] = fedit["placement_digest_equal"]
        figures["placement_weight_gap"] = fedit["placement_weight_gap"]
    if plain and "w1_seq_fast" in fedit:  # the fastest kernels, placements may differ in bits
        fast = fedit["w1_seq_fast"]["tokens_per_s"]
        figures["fm_e2e_ratio_fast_kernels"] = fast / plain["tokens_per_s"]
        if ref:
            figures["deterministic_kernels_cost"] = fast / ref["tokens_per_s"]
    if ref and "w1_lora8" in fedit:
        figures["multilora_vs_sequential"] = fedit["w1_lora8"]["tokens_per_s"] / ref["tokens_per_s"]
    for name, r in backends.items():
        if ref and "tokens_per_s" in r:
            figures[f"{name}_vs_torch"] = r["tokens_per_s"] / ref["tokens_per_s"]
        if "engine_s_per_call" in r:
            figures[f"{name}_engine_s_per_call"] = r["engine_s_per_call"]
            figures[f"{name}_engine_share"] = r["engine_share_of_training"]
    if ref and fedoa:
        figures["fedoa_cost_vs_fedit"] = ref["tokens_per_s"] / fedoa["tokens_per_s"]
    if tune:
        figures["tune_sweep_wall_s"] = tune["sweep_wall_s"]
        figures["tune_trials"] = tune["trials"]
    if fedbaf:
        figures["fedbaf_round_s"] = fedbaf["round_s"]
        figures["fedbaf_server_share"] = fedbaf["server_share"]
        figures["fedbaf_audit_share"] = fedbaf["audit_share"]
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [
        f"| `{k}` | {v:.4g} |" if isinstance(v, float) else f"| `{k}` | {v} |"
        for k, v in figures.items()
    ]
    (out / "figures.md").write_text("\n".join(lines) + "\n")
    (out / "figures.json").write_text(json.dumps(figures, indent=1))
    print("\n".join(lines))
    return figures


def describe(shape: str) -> dict[str, Any]:
    """The device, the machine, and where each library raysim drives was loaded from."""
    import importlib

    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only"
    if torch.cuda.is_available():
        device += f" ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
    libraries = {}
    for name in ("torch", "transformers", "peft", "accelerate", "ray", "mlflow", "deepspeed",
                 "pydantic"):  # fmt: skip
        module = importlib.import_module(name)
        libraries[name] = f"{module.__version__} ({Path(module.__file__).parent.parent})"
    return {"device": device, "machine": machine(), "shape": shape, "libraries": libraries}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=[*STEPS, "report", "machine"])
    parser.add_argument("--shape", choices=sorted(LLAMA), default="7b")
    parser.add_argument("--out", default="gpu-out")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--address", default=None, help="a Ray cluster (tiny: one logical GPU)")
    parser.add_argument("--placements", nargs="+", default=list(PLACEMENTS))
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument(
        "--run-limit", type=float, default=60, help="seconds for each backend's run"
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # configs and the raysim package are read from the repository
    if args.step == "report":
        report(out)
        return
    if args.step == "machine":
        result = describe(args.shape)
    else:
        result = STEPS[args.step](args, out)
    _save(out, args.step, result)
    print(json.dumps(result, indent=1, default=str)[:4000], flush=True)


if __name__ == "__main__":
    main()
