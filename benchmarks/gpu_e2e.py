"""raysim's main path end to end, step by step, as ``benchmarks/gpu_e2e.sh`` runs it on a GPU.

Every raysim step goes through the ``raysim run`` / ``raysim tune`` command (``python -m
raysim``) against the one Ray the call started (``--address``: the GPU path and the tiny path are
the same path), with an MLflow store of its own under ``--out``; the figures are read back from
that store (each round's metrics, ``placement.json``, ``workers.json``, ``weights.safetensors``).

Part 1, the most valuable figures first (``gpu_e2e_plan.py`` holds the cost model):

* ``preflight``: every import the bundle brings, the GPUs counted as raysim counts them, the GPU's
  compute mode, ``/dev/shm`` and memory; then the call's Ray started and reached, in under a
  minute, or one line naming what is broken;
* ``plain``: the reference, a plain PEFT loop over the same clients' data, rounds and local
  recipe (``LlamaForCausalLM`` built from the same config, LoRA r 8 on q/v, a fresh AdamW per
  client), timed in its own process so that it holds no GPU memory while raysim runs;
* ``fedit``: FedIT with one worker at 1.0 GPU and four at 0.25 GPU, clients one after another
  (their digests must be equal: placement must not change results), then multi-LoRA batched
  clients (``workers.execution: batched``, a group of 8);
* ``backends``: the one-worker run with ``local.backend`` DeepSpeed ZeRO-2 and Accelerate
  (against the torch backend's run of ``fedit``), with DeepSpeed's per-call engine cost;
* ``fedbaf``: FedBaF over FedAvg on ViT-B/16 (digits at 224², a random-init foundation of the
  same shape), the coordinator on the GPU: the server's mix and the leak auditor's share;
* ``gpu_tests``: the CUDA tests (``tests/test_gpu.py``).

Part 2 (``--part 2``, a second call): its own one-worker reference, the fastest kernels
(``workers.cuda_deterministic: false``), four workers with groups of 2, ZeRO-3, FedOA, and
``raysim tune`` of 4 trials at 0.5 GPU under ASHA on a small LLaMA.

Each step writes ``OUT/<step>.json`` after each of its runs, stamped with the call's id;
``gpu_e2e_report.py`` gathers them. A run that fails is a finding, not the step's end.

``--shape tiny`` runs every step on the CPU in minutes (a two-layer LLaMA, a two-layer ViT at
32²), against a Ray with one logical GPU, so that the script is known to work before a GPU is
lent. Numbers printed there are CPU numbers and say so.

``RAYSIM_E2E_FAIL="step step:run ..."`` makes a step, or one run of a step, fail at its start
(the tests' way to check that every other figure survives).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_e2e_plan as plans  # noqa: E402
from common import ROOT, machine  # noqa: E402
from gpu_e2e_report import save  # noqa: E402

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
#: The other training backends.
BACKENDS = {
    "accelerate": ["local.backend=accelerate"],
    "deepspeed_zero2": ["local.backend=deepspeed", "local.deepspeed.zero_stage=2"],
    "deepspeed_zero3": ["local.backend=deepspeed", "local.deepspeed.zero_stage=3"],
}
#: what the preflight imports: everything the steps and Ray's workers load
IMPORTS = ("torch", "transformers", "peft", "accelerate", "safetensors", "pydantic", "yaml",
           "ray", "ray.tune", "mlflow", "deepspeed", "rouge_score", "raysim", "raysim.cli",
           "raysim.sim.build", "raysim.actors.worker")  # fmt: skip
#: the packages that only the bundle brings to the GPU image
BUNDLED = {"ray", "mlflow", "deepspeed", "pydantic", "peft", "rouge_score"}


class Failed(RuntimeError):
    """A run or step that failed; its message is the figure's reason."""


def on_gpu(shape: str) -> bool:
    return shape != "tiny"


def injected(step: str, run: str | None = None) -> None:
    """Fail here if ``RAYSIM_E2E_FAIL`` names this step (or this run of it)."""
    names = os.environ.get("RAYSIM_E2E_FAIL", "").split()
    if (step if run is None else f"{step}:{run}") in names:
        raise Failed(f"injected failure ({'step' if run is None else 'run'} named in "
                     "RAYSIM_E2E_FAIL)")  # fmt: skip


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
            "dtype": "bfloat16",  # the GPU's path on the CPU too: a bf16 base, fp32 adapters
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
                raise Failed(f"{label}: stopped at its limit of {limit:.0f} s") from None
        took = time.perf_counter() - t0
        if rc != 0:
            lines = [line for line in log.read_text().splitlines() if line.strip()]
            cause = lines[-1].strip() if lines else "no output"
            tail = "\n".join(lines[-25:])
            raise Failed(f"{label}: raysim {verb} exited {rc}: {cause}\n{' '.join(cmd)}\n{tail}")
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
            raise Failed(f"no MLflow run named {label!r} in {self.uri}")
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
    """The clients each round dispatches: the run's own schedule (``raysim.sim.clock``)."""
    from raysim.config import load_config
    from raysim.sim.clock import Schedule
    from raysim.sim.delays import build_delay_model

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
        from raysim.sim.build import run_dataset

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


# --- the plain reference ------------------------------------------------------------------


def plain_loop(shape: str, n_rounds: int) -> dict[str, Any]:
    """A plain PEFT loop: the same clients, rounds, data and local recipe as ``fedit``'s runs,
    each client from the round's global adapter with a fresh AdamW, its delta read back to the
    host as a client would send it. No raysim code trains here."""
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from raysim.config import load_config
    from raysim.models.causal_lm import default_dtype

    cfg = fedit_config(shape, n_rounds)
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
    with device, default_dtype(dtype):  # built in bf16 directly, as raysim builds it
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
    steady = range(1, n_rounds)
    rounds = round_clients(cfg, range(n_rounds))
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


# --- running the runs of a step -----------------------------------------------------------


class Runs:
    """A step's runs, one after another, each under its limit from the cost model and before the
    step's deadline; each saved as it ends, a failed one as ``{"error": ...}`` and one with no
    time left as ``{"skipped": ...}``, so that every finished run survives whatever follows."""

    def __init__(self, args: argparse.Namespace, out: Path, step: str) -> None:
        self.args, self.out, self.step = args, out, step
        self.cost = plans.COSTS[args.shape][step]
        self.res: dict[str, Any] = {}

    def names(self) -> list[str]:
        """The step's runs, or those ``ONLY`` names as ``step:run``."""
        only = [w.split(":", 1)[1] for w in os.environ.get("ONLY", "").split()
                if w.startswith(f"{self.step}:")]  # fmt: skip
        return [r for r in self.cost.runs if not only or r in only]

    def limit(self, run: str) -> float:
        """The run's limit, or what is left before the step's deadline; raises if that is less
        than half the run's planned seconds (it would only be cut)."""
        limit = float(self.cost.runs[run].limit_s)
        if self.args.deadline:
            left = self.args.deadline - time.time() - 5
            planned = self.cost.runs[run].seconds
            if left < planned / 2:
                raise Skipped(f"{left:.0f} s left of the step's limit, {planned:.0f} s planned")
            limit = min(limit, left)
        return limit

    def do(self, run: str, fn: Any, *extra: Any) -> dict[str, Any] | None:
        """``fn(run, limit, *extra)`` → the run's figures, saved; None if it did not finish."""
        try:
            injected(self.step, run)
            self.res[run] = fn(run, self.limit(run), *extra)
        except Skipped as e:
            self.res[run] = {"skipped": str(e)}
        except Exception as e:  # noqa: BLE001 - one run's failure is a finding, not the end
            self.res[run] = {"error": f"{type(e).__name__}: {e}"[-3000:]}
            print(f"{self.step}:{run} failed: {self.res[run]['error']}", flush=True)
        self.save()
        return self.res[run] if "error" not in self.res[run] else None

    def save(self) -> None:
        save(self.out, self.step, self.res)


class Skipped(Exception):
    """No time left in the step for this run."""


def rounds_of(args: argparse.Namespace, step: str, run: str) -> int:
    return plans.COSTS[args.shape][step].runs[run].rounds


# --- the steps ------------------------------------------------------------------------------


def step_plain(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The plain PEFT loop's figures (``plain_loop``), under the plan's rounds."""
    injected("plain")
    run = plans.COSTS[args.shape]["plain"].runs["plain PEFT loop"]
    return plain_loop(args.shape, run.rounds)


def fedit_run(
    args: argparse.Namespace,
    store: Store,
    step: str,
    name: str,
    label: str,
    overrides: list[str],
    limit: float,
) -> dict[str, Any]:
    """One FedIT ``raysim run`` of the step's run ``name`` (its rounds from the plan): its
    command's seconds and figures."""
    cfg = fedit_config(args.shape, rounds_of(args, step, name))
    took = store.raysim("run", label, cfg, *overrides, limit=limit)
    return {"command_s": took, **run_figures(store, label, cfg)}


def step_fedit(args: argparse.Namespace, out: Path, step: str = "fedit") -> dict[str, Any]:
    """FedIT in each placement of the step; the placements' comparisons after each run."""
    injected(step)
    store, runs = Store(out, args.address), Runs(args, out, step)

    def one(name: str, limit: float) -> dict[str, Any]:
        return fedit_run(args, store, step, name, f"{step}_{name}", PLACEMENTS[name], limit)

    for name in runs.names():
        runs.do(name, one)
        runs.res.update(placement_comparisons(store, runs.res))
        runs.save()
    return runs.res


def placement_comparisons(store: Store, res: dict[str, Any]) -> dict[str, Any]:
    """One worker against four on one card: equal digests, the weights' largest gap, and every
    actor's GPU ids; only from runs that finished."""
    ok = {k: r for k, r in res.items() if isinstance(r, dict) and "digest" in r}
    out: dict[str, Any] = {}
    if "w1_seq" in ok and "w4_seq" in ok:
        a, b = ok["w1_seq"], ok["w4_seq"]
        out["placement_digest_equal"] = a["digest"] == b["digest"]
        out["placement_weight_gap"] = weight_gap(store, a["run_id"], b["run_id"])
    four = ok.get("w4_seq") or ok.get("w4_lora2")
    if four:  # four actors, one card
        ids = four["placement_gpu_ids"]
        out["four_workers_gpu_ids"] = ids
        out["four_workers_one_gpu"] = len(ids) == 4 and len({tuple(i) for i in ids}) == 1
    return out


def step_fedit_more(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    return step_fedit(args, out, "fedit_more")


def step_backends(args: argparse.Namespace, out: Path, step: str = "backends") -> dict[str, Any]:
    injected(step)
    store, runs = Store(out, args.address), Runs(args, out, step)

    def one(name: str, limit: float) -> dict[str, Any]:
        overrides = [*PLACEMENTS["w1_seq"], *BACKENDS[name]]
        res = fedit_run(args, store, step, name, f"backend_{name}", overrides, limit)
        w = res["workers"][0]
        if w.get("deepspeed_engines"):
            res["engine_s_per_call"] = w["deepspeed_engine_s"] / w["deepspeed_engines"]
            res["engine_share_of_training"] = w["deepspeed_engine_s"] / w["train_s"]
        return res

    for name in runs.names():
        runs.do(name, one)
    return runs.res


def step_backends_more(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    return step_backends(args, out, "backends_more")


def step_fedoa(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    injected("fedoa")
    store = Store(out, args.address)
    cfg = fedit_config(args.shape, rounds_of(args, "fedoa", "fedoa_w1"))
    cfg["algorithm"] = {"name": "fedoa", "lambda": 0.5, "distance": "l2"}
    limit = plans.run_limit(args.shape, "fedoa", "fedoa_w1")
    took = store.raysim("run", "fedoa_w1", cfg, *PLACEMENTS["w1_seq"], limit=limit)
    return {"command_s": took, **run_figures(store, "fedoa_w1", cfg)}


def step_tune(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    injected("tune")
    store = Store(out, args.address)
    limit = plans.run_limit(args.shape, "tune", "sweep")
    took = store.raysim("tune", "tune", tune_config(args.shape), limit=limit)
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
    injected("fedbaf")
    import torch

    from raysim.config import load_config
    from raysim.models.pretraining import save_foundation
    from raysim.models.registry import build_handle
    from raysim.sim.build import data_spec, run_dataset

    store = Store(out, args.address)
    foundation = out / "foundation-vit"
    rounds = rounds_of(args, "fedbaf", "fedbaf_vit")
    cfg = fedbaf_config(args.shape, rounds, foundation)
    rc = load_config({**cfg, "algorithm": {"name": "fedavg"}})
    torch.manual_seed(1)  # a foundation other than the clients' own start
    handle = build_handle(rc.model, data_spec(run_dataset(rc)))
    with torch.no_grad():  # as if trained: no tensor left at its constant init (norms' ones)
        for p in handle.module.parameters():
            p.add_(0.02 * torch.randn_like(p))
    save_foundation(handle, foundation, {"task": "gpu_e2e random-init ViT"})
    del handle
    limit = plans.run_limit(args.shape, "fedbaf", "fedbaf_vit")
    took = store.raysim("run", "fedbaf_vit", cfg, limit=limit)
    res = {"command_s": took, **run_figures(store, "fedbaf_vit", cfg)}
    split = res["split_s"]
    res["server_share"] = (split["aggregation"] or 0.0) / res["round_s"]
    res["audit_share"] = (split["audit"] or 0.0) / res["round_s"]
    return res


def step_gpu_tests(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The CUDA tests (skipped, and counted so, where no CUDA device is visible)."""
    injected("gpu_tests")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py",
           "tests/test_multilora.py::test_client_losses_stay_on_the_logits_device"]  # fmt: skip
    t0 = time.perf_counter()
    limit = plans.run_limit(args.shape, "gpu_tests", "pytest")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=limit)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "no output"
    print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    if proc.returncode != 0:
        raise Failed(f"CUDA tests exited {proc.returncode}: {summary}")
    return {"summary": summary, "wall_s": time.perf_counter() - t0}


STEPS = {
    "plain": step_plain,
    "fedit": step_fedit,
    "backends": step_backends,
    "fedbaf": step_fedbaf,
    "gpu_tests": step_gpu_tests,
    "fedit_more": step_fedit_more,
    "backends_more": step_backends_more,
    "fedoa": step_fedoa,
    "tune": step_tune,
}


# --- the preflight, and the wait between steps ----------------------------------------------


def _import_all() -> dict[str, float]:
    """Every import the steps need, timed; raises ``Failed`` naming the first that fails."""
    import importlib

    times = {}
    for name in IMPORTS:
        t = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import error is the preflight's finding
            hint = ""
            if name.split(".")[0] in BUNDLED:
                bundle = os.environ.get("RAYSIM_BUNDLE_TAR")
                hint = (f" (the bundle {bundle} did not bring it)" if bundle else
                        " (no bundle was unpacked: `make gpu-bundle` here, then carry "
                        ".gpu/bundle-cp312.tar.xz)")  # fmt: skip
            raise Failed(f"cannot import {name}: {type(e).__name__}: {e}{hint}") from None
        times[name] = round(time.perf_counter() - t, 2)
    return times


def gpu_census() -> dict[str, Any]:
    """The GPUs as raysim counts them (``raysim.launch.resources.local_resources``), and what NVML,
    torch and ``nvidia-smi`` say, for the line that explains a zero."""
    import torch

    from raysim.launch.resources import local_resources

    census: dict[str, Any] = {"raysim": int(local_resources()["GPU"])}
    try:
        import ray._private.thirdparty.pynvml as pynvml

        pynvml.nvmlInit()
        census["nvml"] = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - the reason is the finding
        census["nvml"] = f"{type(e).__name__}: {e}"
    census["torch"] = torch.cuda.device_count()
    census["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    fields = "name,memory.total,driver_version,compute_mode"
    try:
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=15,
        )  # fmt: skip
        census["nvidia_smi"] = (smi.stdout.strip() or smi.stderr.strip())[:500]
    except (OSError, subprocess.TimeoutExpired) as e:
        census["nvidia_smi"] = f"not run: {e}"
    return census


def machine_facts(work: Path) -> dict[str, Any]:
    """Shared memory (Ray's object store), memory and the work folder's disk, in GiB."""
    import shutil

    facts: dict[str, Any] = {}
    for name, path in (("shm", "/dev/shm"), ("work_disk", str(work))):
        try:
            facts[f"{name}_free_gib"] = round(shutil.disk_usage(path).free / 2**30, 1)
        except OSError:
            facts[f"{name}_free_gib"] = None
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        avail = next(line for line in meminfo if line.startswith("MemAvailable"))
        facts["memory_available_gib"] = round(int(avail.split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        facts["memory_available_gib"] = None
    return facts


def start_ray(args: argparse.Namespace, gpus: int) -> float:
    """The call's one Ray, on loopback (``ray start``, its processes under ``--ray-dir``), then
    reached and given one task; its start's seconds. Raises ``Failed`` with Ray's reason."""
    host, port = args.address.rsplit(":", 1)
    cpus = 4 if args.shape == "tiny" else (os.cpu_count() or 1)
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
           "--node-ip-address", host, "--port", port, "--num-cpus", str(cpus),
           "--num-gpus", str(gpus), "--temp-dir", args.ray_dir, "--include-dashboard", "false",
           "--disable-usage-stats"]  # fmt: skip
    t0 = time.perf_counter()
    with socket.socket() as s:  # Ray would try for half a minute before saying so
        try:
            s.bind((host, int(port)))
        except OSError as e:
            why = f"Ray cannot start: {args.address} is taken ({e.strerror}); leave "
            raise Failed(f"{why}RAYSIM_E2E_PORT unset for a free port, or name another") from None
    left = max(5.0, args.deadline - time.time() - 3) if args.deadline else 45.0
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        raise Failed(
            f"Ray did not start within {left:.0f} s: {ray_log_cause(args.ray_dir)}"
        ) from None
    if proc.returncode != 0:
        text = (proc.stderr + proc.stdout).strip().splitlines()
        cause = ray_log_cause(args.ray_dir) or next(
            (ln for ln in reversed(text) if "rror" in ln), text[-1] if text else "no output"
        )
        raise Failed(f"Ray could not start on {args.address}: {cause.strip()[:300]}")
    import ray

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    try:
        have = ray.cluster_resources()
        if have.get("GPU", 0.0) != gpus:
            raise Failed(f"Ray started with {have.get('GPU', 0)} GPUs, not the {gpus} counted")
        if ray.get(ray.remote(num_cpus=0)(lambda: 1).remote(), timeout=30) != 1:
            raise Failed("Ray's worker returned a wrong value")
    finally:
        ray.shutdown()
    return time.perf_counter() - t0


def ray_log_cause(ray_dir: str) -> str:
    """The last error line of the Ray's own logs (GCS, raylet), where its start failed."""
    found = ""
    for name in ("gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err"):
        for log in sorted(Path(ray_dir).glob(f"session_*/logs/{name}")):
            for line in log.read_text(errors="replace").splitlines():
                if "rror" in line or "Failed" in line or "Check failed" in line:
                    found = f"{name}: {line.strip()[-250:]}"
    return found


def step_preflight(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Fails fast, naming the cause: imports, the GPUs counted, then the call's Ray started."""
    t0 = time.perf_counter()
    res: dict[str, Any] = {"shape": args.shape, "imports_s": _import_all()}
    res.update(describe(args.shape))
    res["gpus"] = census = gpu_census()
    res["machine_facts"] = machine_facts(out)
    save(out, "preflight", res)  # what it found, whatever follows
    smi = census["nvidia_smi"]
    if on_gpu(args.shape) and census["raysim"] == 0:
        raise Failed(
            f"no GPU counted: raysim counts 0 (NVML: {census['nvml']}; torch.cuda: "
            f"{census['torch']}; nvidia-smi: {smi.splitlines()[0] if smi else '-'}); the "
            f"{args.shape} shape needs a CUDA GPU, --shape tiny runs on the CPU"
        )
    if on_gpu(args.shape) and "Prohibited" in smi:
        raise Failed(f"the GPU's compute mode is Prohibited: {smi}")
    res["environment"] = (
        f"GPUs counted {census['raysim']} (NVML {census['nvml']}, torch {census['torch']}); "
        f"nvidia-smi: {smi.splitlines()[0] if smi else '-'}; "
        + ", ".join(f"{k} {v}" for k, v in res["machine_facts"].items())
    )
    gpus = census["raysim"] if on_gpu(args.shape) else 1  # tiny: one logical GPU
    res["ray_start_s"] = start_ray(args, gpus)
    res["preflight_s"] = time.perf_counter() - t0
    return res


def settle(args: argparse.Namespace) -> dict[str, Any]:
    """Waits until the last step's actors have given back every resource to the call's Ray and
    no process holds the GPU (a stopped run's workers end in the background), at most
    ``--wait`` s; what it waited for."""
    import ray

    t0 = time.time()
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    try:
        total = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        while time.time() - t0 < args.wait:
            free = ray.available_resources()
            if all(free.get(k, 0.0) >= v - 1e-6 for k, v in total.items()):
                break
            time.sleep(0.5)
        busy = {k: v - ray.available_resources().get(k, 0.0) for k, v in total.items()}
    finally:
        ray.shutdown()
    apps = ""
    while time.time() - t0 < args.wait:
        try:
            apps = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            ).stdout.strip()  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            apps = ""  # no nvidia-smi: nothing to wait for
        if not apps:
            break
        time.sleep(0.5)
    return {"waited_s": round(time.time() - t0, 1), "still_busy": busy, "gpu_processes": apps}


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
    parser.add_argument("step", choices=[*STEPS, "preflight", "settle"])
    parser.add_argument("--shape", choices=sorted(LLAMA), default="7b")
    parser.add_argument("--out", default="gpu-out", help="the call's work folder")
    parser.add_argument("--address", default=None, help="the call's Ray (host:port)")
    parser.add_argument("--ray-dir", default=None, help="preflight: the call's Ray's folder")
    parser.add_argument("--deadline", type=float, default=None, help="epoch s the step must end")
    parser.add_argument("--wait", type=float, default=30.0, help="settle: seconds at most")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # configs and the raysim package are read from the repository
    try:
        if args.step == "settle":
            print(json.dumps(settle(args)), flush=True)
            return
        result = (step_preflight if args.step == "preflight" else STEPS[args.step])(args, out)
    except Failed as e:
        print(f"\nFAILED: {str(e).splitlines()[0]}", flush=True)
        print(str(e), file=sys.stderr, flush=True)
        sys.exit(1)
    save(out, args.step, result)
    print(json.dumps(result, indent=1, default=str)[:4000], flush=True)


if __name__ == "__main__":
    main()
