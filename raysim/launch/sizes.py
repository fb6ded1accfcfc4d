"""A run's sizes, estimated from its config before anything is built, and held to this machine.

``plan_run`` (``raysim.launch.plan``) calls ``size_report`` for every run, a dry run included,
before
Ray starts or anything large is allocated; ``SizeReport.describe`` is the plan's ``sizes:`` line.

The estimates are order-of-magnitude bounds, in bytes. With G the parameters of the global
vector (float32 on the wire, buffers included), R those of the resident model (``model.dtype``,
a frozen base included), P a client's personal state (one copy of G; one adapter on a LoRA
model), V = min(clients.num, rounds × clients.per_round) the clients a run can visit, W workers
and g the clients a worker trains at once:

- memory (host): R × (W + 1) (each worker's model, the coordinator's) + 4G × (``COPIES`` +
  per_round) (versions in flight, broadcast, server state such as two optimizer moments, a
  round's updates) + 4G × ``TRAIN_COPIES`` × g × W (batched training: weights, gradients,
  optimizer state) + clients.num × 8 B × (4 + classes) (sizes, offsets, delays, label counts;
  no labels for generated data) + V × ``VISITED_BYTES`` (counters, state handles) + V × 4P
  (personal state, store: memory) + rounds × ``ROUND_BYTES`` (history, evaluations) + the
  checkpoint, counted whole to be safe (its arrays stream to disk; its JSON part is built in
  memory). Workers on GPUs
  (``workers.num_gpus``) keep their models and training in GPU memory: W counts 0 there (GPU
  memory is not checked). Not counted: the data set, activations, the interpreter, torch and
  Ray themselves (the margin is for them).
- checkpoint: 4G × ``CHECKPOINT_COPIES`` + V × 4P (store: memory) + V × ``CHECKPOINT_CLIENT``
  + rounds × ``CHECKPOINT_ROUND`` (history, as JSON), at its largest (the run's end); it goes to
  ``checkpoint.dir``, the local MLflow store and the temporary folder it passes through.
- personal-state store (store: disk): V files of max(4P, ``BLOCK``) (one version each; a
  checkpoint's older versions can double it).

Memory is held to ``MARGIN`` of the machine's total memory, and to what is available now; total
is what the plan prints, so a dry run and its run print the same plan. Disk is held to
``MARGIN`` of the free space of each file system written to (their needs summed). The margin
refuses a run "just under" the machine's size: what the estimate leaves out needs room too.
``RAYSIM_IGNORE_SIZES=1`` skips these comparisons; sizes no machine holds (``ABSURD_BYTES``,
counts past ``ABSURD_COUNT``) are refused even then. A run on a named cluster is not held to
this machine. Personal state counts only for a method that keeps one; the plan shows it as a
bound, and the method's implementation (torch, for most) is imported to tell only where the
verdict depends on it. A model whose size is known only once built (a plugin's, AlexNet,
a pretrained one not on this machine) counts as 0: its size is "unknown", never refused.

``clients.state.store: auto`` is decided from the same personal-state term, before the sizes are
held to the machine (``raysim.launch.store_choice``): the plan's config carries ``memory`` or
``disk``, and its ``client states:`` line says which and why.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from raysim.config import ConfigError, RunConfig

#: share of the machine's memory, and of a disk's free space, that a run's estimate may take
MARGIN = 0.8
#: set to 1 to run a config whose estimates exceed the machine (the user knows better)
OVERRIDE = "RAYSIM_IGNORE_SIZES"
#: sizes no machine holds: refused even with the override
ABSURD_BYTES = 1 << 60
#: counts beyond this lose precision as floats and overflow int64 products: refused
ABSURD_COUNT = 1 << 53

COPIES = 6  # global-size vectors the coordinator keeps besides a round's updates
TRAIN_COPIES = 3  # weights, gradients and optimizer state of each client training at once
CHECKPOINT_COPIES = 4  # global-size arrays in a checkpoint: versions, strategy state
ROUND_BYTES = 4 << 10  # a round's metrics in the history, evaluations and the driver's copy
CHECKPOINT_ROUND = 1 << 10  # the same, as a checkpoint's JSON
VISITED_BYTES = 1 << 10  # a visited client's counters and state handle
CHECKPOINT_CLIENT = 128  # the same, in a checkpoint
BLOCK = 4 << 10  # the least a file takes on disk
#: SmolLM2-135M's published shape, where its converted copy is not on this machine yet
SMOLLM2 = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ------------------------------------------------------------------ the model, from its config


@dataclass(frozen=True)
class ModelSize:
    """Parameter counts of the model a config builds: ``shared`` (the global vector),
    ``resident`` (every parameter of the built model), ``personal`` (a client's personal
    copy); ``exact`` False: a lower bound (a data shape is known only once loaded); ``key``:
    the config key that sizes it."""

    shared: int
    resident: int
    personal: int
    exact: bool
    key: str


@dataclass(frozen=True)
class DataShape:
    """What a model builder reads of the data, as far as the config tells (None: unknown)."""

    features: tuple[int, ...] | None
    classes: int | None
    vocab: int | None


def data_shape(cfg: RunConfig) -> DataShape:
    """The data's feature shape, classes and vocabulary, from the config alone."""
    d: Any = cfg.data
    name = d.name
    if name in ("digits", "mnist1d"):
        return DataShape((64,) if name == "digits" else (40,), 10, None)
    if name == "synthetic":
        return DataShape((d.synthetic.features,), d.synthetic.classes, None)
    if name == "bbc_news":
        return DataShape(None, 5, None if d.tokenizer else d.vocab_size + 2)
    if name == "hf" and d.hf.text_column is not None and not d.tokenizer:
        return DataShape(None, None, d.vocab_size + 2)
    if name == "markov":
        m = d.markov
        return DataShape(None, None, min(m.vocab_foundation, m.vocab_federated))
    if name in ("flan_mini", "flan") and d.text.tokenizer == "word":
        return DataShape(None, None, d.vocab_size)
    return DataShape(None, None, None)


def _linear(sizes: list[int]) -> int:
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=False))


def _batch_norm(c: int) -> int:
    """Weight and bias, running mean and variance (buffers are in the global vector), count."""
    return 4 * c + 1


def _mlp(cfg: RunConfig, shape: DataShape) -> tuple[int, bool]:
    features = math.prod(shape.features) if shape.features else 1
    return _linear([features, *cfg.model.hidden, shape.classes or 2]), bool(
        shape.features and shape.classes
    )


def _cnn(cfg: RunConfig, shape: DataShape) -> tuple[int, bool]:
    """``raysim.models.small.build_cnn``'s layers."""
    m, feats = cfg.model, shape.features or (1,)
    n = math.prod(feats)
    side = math.isqrt(n)
    if len(feats) == 3:
        c_in, spatial, k = feats[0], feats[1:], 9
    elif side * side == n and len(feats) <= 2 and n > 16:
        c_in, spatial, k = 1, (side, side), 9
    else:
        c_in, spatial, k = 1, (n,), 3
    total = 0
    for c in m.channels:
        total += c_in * c * k + c + (_batch_norm(c) if m.batch_norm else 0)
        c_in = c
    flat = c_in * math.prod(s // 2 for s in spatial)
    total += _linear([flat, *m.hidden, shape.classes or 2])
    return total, bool(shape.features and shape.classes)


def _bag(cfg: RunConfig, shape: DataShape) -> tuple[int, bool]:
    e = cfg.model.embed_dim
    head = _linear([e, *cfg.model.hidden, shape.classes or 2])
    return (shape.vocab or 1) * e + head, bool(shape.vocab and shape.classes)


def _transformer_lm(cfg: RunConfig, shape: DataShape) -> tuple[int, bool]:
    d, t, v = cfg.model.embed_dim, cfg.model.transformer, shape.vocab or 1
    layer = 4 * (d * d + d) + 2 * (d * t.ffn) + t.ffn + d + 4 * d
    return v * d + t.layers * layer + d * v + v, shape.vocab is not None


def _llama_dims(c: dict[str, Any]) -> dict[str, tuple[int, int]]:
    h, i = int(c["hidden_size"]), int(c["intermediate_size"])
    heads = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or heads) * (h // heads)
    return {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def _causal_lm(cfg: RunConfig, c: dict[str, Any] | None, lm_head: bool = True) -> ModelSize | None:
    """A LLaMA-shaped causal LM (``config.json`` fields) with one LoRA adapter of
    ``model.lora``; None where the config lacks a LLaMA's fields. ``lm_head``: False for the
    bare backbone (``lm_classifier``'s)."""
    need = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    if c is None or any(k not in c for k in need):
        return None
    dims, layers = _llama_dims(c), int(c["num_hidden_layers"])
    h, vocab = int(c["hidden_size"]), int(c.get("vocab_size") or 0)
    per_layer = sum(a * b for a, b in dims.values()) + 2 * h
    heads = 0 if not lm_head or c.get("tie_word_embeddings") else 1  # untied output layer
    base = layers * per_layer + h + (1 + heads) * vocab * h
    r = cfg.model.lora.r
    adapter = layers * sum(r * sum(dims[t]) for t in cfg.model.lora.targets if t in dims)
    known = bool(vocab) and all(t in dims for t in cfg.model.lora.targets)
    dtype = DTYPE_BYTES[cfg.model.dtype] / 4  # resident counts are in float32 units
    resident = int(base * dtype) + 2 * adapter
    return ModelSize(adapter, resident, adapter, known, "model.lora.r")


def _hf_config(path: str | None, smollm2: bool = False) -> dict[str, Any] | None:
    """``config.json`` of ``path`` (a folder, or a hub id already in the cache), or of the
    converted SmolLM2 (``smollm2``: ``path`` is its cache); SmolLM2's published shape before it
    is converted. No download."""
    import json

    if smollm2:
        from raysim.util.machine import cache_home

        found = Path(path or cache_home()) / "smollm2-135m-instruct" / "config.json"
    elif path is None:
        return None
    elif Path(path, "config.json").is_file():
        found = Path(path, "config.json")
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001 - not a hub id, or no hub client: unknown
            cached = None
        found = Path(cached) if isinstance(cached, str) else None
    if found is not None and found.is_file():
        try:
            return dict(json.loads(found.read_text()))
        except (OSError, ValueError):
            return None
    return dict(SMOLLM2) if smollm2 else None


def _vit(cfg: RunConfig, shape: DataShape, lora: bool) -> ModelSize:
    """transformers' ViT for image classification; ``lora``: ``vit_lora``'s trainable part."""
    v, m = cfg.model.vit, cfg.model
    h, classes = v.hidden_size, shape.classes or 2
    side = m.image.size or (math.isqrt(math.prod(shape.features)) if shape.features else 0)
    patches = (side // v.patch_size) ** 2
    embed = m.image.channels * v.patch_size**2 * h + h + h + (patches + 1) * h
    layer = 4 * (h * h + h) + 4 * h + 2 * v.intermediate_size * h + v.intermediate_size + h
    head = h * classes + classes
    total = embed + v.num_hidden_layers * layer + 2 * h + head
    exact = bool(side and shape.classes)
    if not lora:
        return ModelSize(total, total, total, exact, "model.vit")
    # ``vit_lora_settings``: model.lora where the config sets it, else r 4 on query and value
    r, targets = (m.lora.r, len(m.lora.targets)) if "lora" in m.model_fields_set else (4, 2)
    adapter = v.num_hidden_layers * targets * r * 2 * h + head
    return ModelSize(adapter, total + adapter, adapter, exact, "model.vit")


def _resnet(cfg: RunConfig, shape: DataShape, preact: bool) -> tuple[int, bool]:
    """transformers' ResNet (``resnet``) or ``raysim.models.vision.PreActResNet``."""
    r, c_in = cfg.model.resnet, cfg.model.image.channels
    widths = r.hidden_sizes
    stem = widths[0] if preact else r.embedding_size
    total = c_in * stem * (9 if preact else 49) + (0 if preact else _batch_norm(stem))
    cin = stem
    for i, (depth, width) in enumerate(zip(r.depths, widths, strict=False)):
        for j in range(depth):
            stride = 2 if i > 0 and j == 0 else 1
            total += _block(cin, width, stride, preact, r.layer_type == "bottleneck")
            cin = width
    total += (_batch_norm(cin) if preact else 0) + _linear([cin, shape.classes or 2])
    return total, shape.classes is not None


def _block(cin: int, cout: int, stride: int, preact: bool, bottleneck: bool) -> int:
    short = cin * cout + (0 if preact else _batch_norm(cout)) if stride != 1 or cin != cout else 0
    if preact:
        return short + _batch_norm(cin) + 9 * cin * cout + _batch_norm(cout) + 9 * cout * cout
    if bottleneck:
        mid = cout // 4
        convs = cin * mid + 9 * mid * mid + mid * cout
        return short + convs + 2 * _batch_norm(mid) + _batch_norm(cout)
    return short + 9 * cin * cout + 9 * cout * cout + 2 * _batch_norm(cout)


def model_size(cfg: RunConfig) -> ModelSize | None:
    """The model's parameter counts from the config alone; None where they cannot be known
    before it is built (a plugin's model, a pretrained one not on this machine, ...)."""
    name, shape = cfg.model.name, data_shape(cfg)
    plain: dict[str, tuple[Callable[..., tuple[int, bool]], str]] = {
        "mlp": (_mlp, "model.hidden"),
        "cnn": (_cnn, "model.channels"),
        "bag_of_embeddings": (_bag, "model.embed_dim"),
        "transformer_lm": (_transformer_lm, "model.embed_dim"),
    }
    if name in plain:
        count, exact = plain[name][0](cfg, shape)
        return ModelSize(count, count, count, exact, plain[name][1])
    if name in ("resnet", "preact_resnet") and cfg.model.path is None:
        count, exact = _resnet(cfg, shape, name == "preact_resnet")
        return ModelSize(count, count, count, exact, "model.resnet")
    if name in ("vit", "vit_lora") and cfg.model.path is None:
        return _vit(cfg, shape, name == "vit_lora")
    if name == "llama":
        vocab = cfg.model.llama.vocab_size or shape.vocab
        return _causal_lm(cfg, {**cfg.model.llama.model_dump(), "vocab_size": vocab})
    if name in ("hf_causal_lm", "smollm2"):
        return _causal_lm(cfg, _hf_config(cfg.model.path, name == "smollm2"))
    if name == "lm_classifier":
        return _lm_classifier(cfg, shape)
    return None


def _lm_classifier(cfg: RunConfig, shape: DataShape) -> ModelSize | None:
    """``raysim.models.lm_classifier``: a LoRA-adapted LLaMA backbone and a linear head, both
    in the global vector."""
    path = cfg.model.path
    if path:
        c = _hf_config(None if path == "smollm2" else path, path == "smollm2")
    else:
        c = {
            **cfg.model.llama.model_dump(),
            "vocab_size": cfg.model.llama.vocab_size or shape.vocab,
        }
    base = _causal_lm(cfg, c, lm_head=False)
    if base is None or c is None:
        return None
    head = _linear([int(c["hidden_size"]), shape.classes or 2])
    exact = base.exact and shape.classes is not None
    grow = lambda n: n + head  # noqa: E731
    return ModelSize(grow(base.shared), grow(base.resident), grow(base.personal), exact, base.key)


# ------------------------------------------------------------------ the run's estimates


@dataclass(frozen=True)
class Part:
    """One term of an estimate: what it is, its bytes, the config key that sizes it;
    ``maybe``: personal state of a method that may keep none (settled only where it decides)."""

    what: str
    nbytes: int
    key: str
    maybe: bool = False


@dataclass(frozen=True)
class Estimate:
    """A run's estimated memory, checkpoint and personal-state store (``Part`` terms)."""

    model: ModelSize | None
    memory: tuple[Part, ...]
    checkpoint: tuple[Part, ...]
    store: tuple[Part, ...]

    def without_maybe(self) -> Estimate:
        """The estimate of a method that keeps no personal state."""
        keep = lambda parts: tuple(p for p in parts if not p.maybe)  # noqa: E731
        return replace(self, memory=keep(self.memory), checkpoint=keep(self.checkpoint))


def total(parts: tuple[Part, ...]) -> int:
    return sum(p.nbytes for p in parts)


def visited(cfg: RunConfig) -> int:
    """The clients a run can visit, and so that can hold state: min(num, rounds × per_round)."""
    return min(cfg.clients.num, cfg.rounds * cfg.clients.per_round)


def estimate(cfg: RunConfig, workers: int = 1) -> Estimate:
    """The run's sizes from its config and its number of ``workers`` (module docstring)."""
    model = model_size(cfg)
    v = visited(cfg)
    personal = personal_state(cfg, model)
    in_memory = cfg.clients.state.store != "disk"  # ``auto`` before its plan: as the run has it
    ckpt = _checkpoint(cfg, model, personal if in_memory else None)
    memory = _memory(cfg, model, workers)
    memory += tuple(replace(p, what=f"the checkpoint's {p.what}") for p in ckpt)
    if in_memory:
        return Estimate(model, (*memory, personal), ckpt, ())
    per_file = max(personal.nbytes // max(v, 1), BLOCK)
    store = Part(personal.what, v * per_file, "clients.num")
    return Estimate(model, memory, ckpt, (store,))


def personal_state(cfg: RunConfig, model: ModelSize | None) -> Part:
    """The personal state of the clients a run can visit: V × (4P + S), P the model's personal
    parameters (a bound: ``maybe``, the method may keep none; 0 where the model's size is
    unknown before it is built) and S the ``ClientContext.state`` a plugin's client declares
    (``declared_state``: sure)."""
    v, declared = visited(cfg), declared_state(cfg)
    per_client = declared + (4 * model.personal if model is not None else 0)
    what = f"personal state of {_count(v)} clients"
    return Part(what, v * per_client, "clients.state.store=disk", not declared)


def declared_state(cfg: RunConfig) -> int:
    """The bytes of ``ClientContext.state`` each client of a plugin's method keeps, as its
    client declares (``ClientAlgorithm.state_nbytes``); 0 for a built-in method (whose
    implementation is not imported here) and for a method no imported module registered (a
    dry run's)."""
    if not plugin_method(cfg):
        return 0
    from raysim.algorithms.registry import get_method

    try:
        method = get_method(cfg.algorithm.name)
    except (KeyError, ImportError, ValueError):
        return 0
    return max(0, int(method.client.state_nbytes(cfg.algorithm.params)))


def _memory(cfg: RunConfig, model: ModelSize | None, workers: int) -> tuple[Part, ...]:
    """Memory but for personal state and the checkpoint (module docstring)."""
    c, v, key = cfg.clients, visited(cfg), _model_key(model)
    g = 4 * model.shared if model else 0
    group = min(cfg.group_size(), c.per_round)
    # a split data set also counts each client's labels; generated data (synthetic) does not
    classes = 0 if cfg.data.name == "synthetic" else data_shape(cfg).classes or 2
    trains = 0 if on_gpu(cfg) else workers  # the workers' models and training in host memory
    return (
        Part("resident models", 4 * (model.resident if model else 0) * (trains + 1), key),
        Part(
            f"global vectors and {_count(c.per_round)} updates a round",
            g * (COPIES + c.per_round),
            "clients.per_round",
        ),
        Part(
            f"{_count(group)} clients training at once on {workers} worker(s)",
            g * TRAIN_COPIES * group * trains,
            "workers.group_size",
        ),
        Part(f"arrays of {_count(c.num)} clients", c.num * 8 * (4 + classes), "clients.num"),
        Part(f"records of {_count(v)} clients", v * VISITED_BYTES, "clients.num"),
        Part(f"the history of {_count(cfg.rounds)} rounds", cfg.rounds * ROUND_BYTES, "rounds"),
    )


def on_gpu(cfg: RunConfig) -> bool:
    """Whether the workers' models live in GPU memory (not counted: this is host memory)."""
    return cfg.workers.num_gpus > 0 or cfg.model.device.startswith("cuda")


def _checkpoint(cfg: RunConfig, model: ModelSize | None, personal: Part | None) -> tuple[Part, ...]:
    """A checkpoint at its largest (none without ``checkpoint.every``)."""
    if not cfg.checkpoint.every:
        return ()
    v, g = visited(cfg), 4 * model.shared if model else 0
    parts = (
        Part("model versions and server state", g * CHECKPOINT_COPIES, _model_key(model)),
        Part(f"history of {_count(cfg.rounds)} rounds", cfg.rounds * CHECKPOINT_ROUND, "rounds"),
        Part(f"records of {_count(v)} clients", v * CHECKPOINT_CLIENT, "clients.num"),
    )
    return parts if personal is None else (*parts, personal)


def _model_key(model: ModelSize | None) -> str:
    return model.key if model else "model"


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**7 else f"{n:.3g}"


def human(n: float) -> str:
    """Bytes in binary units, about three figures: ``38 KiB``, ``1.2 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


# ------------------------------------------------------------------ the machine


def memory() -> tuple[int, int]:
    """This machine's total and available memory, in bytes (within a container's limit)."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        whole, available = int(vm.total), int(vm.available)
    except ImportError:  # no psutil: the page counts (available: the free pages)
        page = os.sysconf("SC_PAGE_SIZE")
        whole, available = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    limit = _cgroup_limit()
    return (whole, available) if limit is None else (min(whole, limit), min(available, limit))


#: a container's memory limit, cgroup v2 then v1 ("max", or a huge number: none)
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def _cgroup_limit() -> int | None:
    for name in CGROUP_LIMITS:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        return int(text) if text.isdigit() and int(text) < 1 << 60 else None
    return None


def existing(path: str | os.PathLike) -> Path:
    """``path``, or the nearest folder above it that exists (where it would be made)."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_disk(path: str | os.PathLike) -> int:
    """Free bytes of the file system ``path`` (or the folder it would be made in) is on."""
    return int(shutil.disk_usage(existing(path)).free)


def checkpoint_folders(cfg: RunConfig, tracking_uri: str | None) -> list[Path]:
    """Where a checkpoint is written: ``checkpoint.dir``, a local MLflow store's folder and the
    temporary folder the tracker passes it through (a tracking server's disk is not here)."""
    if not cfg.checkpoint.every:
        return []
    out = [Path(cfg.checkpoint.dir)] if cfg.checkpoint.dir else []
    if tracking_uri:
        from raysim.tracking.store import store_path

        store = store_path(tracking_uri)
        if store is not None:
            out += [store.parent if tracking_uri.startswith("sqlite:") else store]
            out.append(Path(tempfile.gettempdir()))
    return out


# ------------------------------------------------------------------ the report and the check

CHECKPOINT, STORE = "checkpoint", "personal-state store"


@dataclass(frozen=True)
class Disk:
    """A file system the run writes to: its free bytes and what goes there, (what, folder)."""

    free: int
    uses: tuple[tuple[str, str], ...]

    def need(self, est: Estimate) -> int:
        return sum(total(est.checkpoint if w == CHECKPOINT else est.store) for w, _ in self.uses)


@dataclass(frozen=True)
class SizeReport:
    """A run's estimates and the machine they are held to: its total and available memory
    (None: the run is not on this machine) and the disks it writes to; ``store``: how
    ``clients.state.store: auto`` was decided (``choose_store``; None for an explicit store)."""

    estimate: Estimate
    total_memory: int | None = None
    available_memory: int | None = None
    disks: tuple[Disk, ...] = ()
    ignored: bool = False
    store: StoreChoice | None = None

    def without_maybe(self) -> SizeReport:
        return replace(self, estimate=self.estimate.without_maybe())

    def store_lines(self) -> list[str]:
        """The plan's ``client states:`` line, where ``auto`` chose the store and the method is
        known to keep personal state (``StoreChoice``); none otherwise."""
        return [self.store.line()] if self.store is not None and self.store.shown else []

    def describe(self) -> str:
        """The plan's ``sizes:`` line: model, memory, checkpoint and store, in binary units."""
        est, model = self.estimate, self.estimate.model
        if model is None:
            words = ["model size unknown before it is built"]
        else:
            words = [f"model {'' if model.exact else '≥'}{model.shared:,} parameters"]
        whole = self.total_memory
        of = f" of {human(whole)}" if whole else ""
        words.append(f"memory ~{human(total(est.memory))}{of}")
        for what, parts in ((CHECKPOINT, est.checkpoint), (STORE, est.store)):
            if parts:
                words.append(f"{what} ~{human(total(parts))}{self._free(what)}")
        line = "; ".join(words)
        if whole is None:
            return line + " (on the cluster: not checked here)"
        return line + (f" (not enforced: {OVERRIDE}=1)" if self.ignored else "")

    def _free(self, what: str) -> str:
        free = [d.free for d in self.disks if any(w == what for w, _ in d.uses)]
        return f", disk {human(min(free))} free" if free else ""

    def refusal(self) -> str:
        """Why the machine cannot hold the run, in one line; "" where it can."""
        est = self.estimate
        limit = self._memory_limit()
        if limit:
            return _refusal("memory", total(est.memory), limit, est.memory)
        for disk in self.disks:
            need = disk.need(est)
            if need > MARGIN * disk.free:
                what, where = max(disk.uses, key=lambda u: total(_parts(est, u[0])))
                limit = f"{MARGIN:.0%} of the {human(disk.free)} free at {where}"
                return _refusal(what, need, limit, _parts(est, what))
        return ""

    def _memory_limit(self) -> str:
        """The memory limit the estimate exceeds, in words; "" where it fits."""
        need, whole = total(self.estimate.memory), self.total_memory or 0
        if need > MARGIN * whole:
            return f"{MARGIN:.0%} of this machine's {human(whole)} of memory"
        available = self.available_memory
        if available is not None and need > available:
            return f"the {human(available)} of memory available now (of {human(whole)})"
        return ""


def _parts(est: Estimate, what: str) -> tuple[Part, ...]:
    return est.checkpoint if what == CHECKPOINT else est.store


def _refusal(
    what: str, nbytes: int, limit: str, parts: tuple[Part, ...], override: bool = True
) -> str:
    """One line: the quantity, its estimate, its largest term, the limit and what to change."""
    part = max(parts, key=lambda p: p.nbytes)
    fix = f"set {part.key}" if "=" in part.key else f"lower {part.key}"
    tail = f" (or {OVERRIDE}=1 to run it anyway)" if override else ""
    return f"{what} ~{human(nbytes)} (mostly {part.what}) exceeds {limit}: {fix}{tail}"


def check_absurd(cfg: RunConfig, est: Estimate, keeps_state: Callable[[], bool]) -> None:
    """Refuse counts and sizes no machine holds, whatever the override (personal state only
    where the method keeps one: ``keeps_state``)."""
    counts = list(_counts(cfg))
    if est.model is not None:
        counts.append((f"{est.model.key} (the model's parameters)", est.model.shared))
    for key, value in counts:
        if value >= ABSURD_COUNT:
            raise ConfigError(
                f"{key}: {_count(value)} is beyond any machine (counts from 2^53 on overflow "
                f"int64 products and lose precision): lower {key.split()[0]}"
            )
    for sure in (est.without_maybe(), est):
        absurd = _absurd(sure)
        if absurd and (sure is not est or keeps_state()):
            raise ConfigError(absurd)


def _absurd(est: Estimate) -> str:
    for what, parts in (("memory", est.memory), (CHECKPOINT, est.checkpoint), (STORE, est.store)):
        if parts and total(parts) >= ABSURD_BYTES:
            return _refusal(what, total(parts), "what any machine holds", parts, False)
    return ""


def _counts(cfg: RunConfig) -> Iterator[tuple[str, int]]:
    """The config's counts that size arrays: the population, rounds, the model's dimensions."""
    yield from (("clients.num", cfg.clients.num), ("clients.per_round", cfg.clients.per_round))
    yield "rounds", cfg.rounds
    yield from _ints("model", cfg.model.model_dump())
    vocab = getattr(cfg.data, "vocab_size", None)
    if isinstance(vocab, int):
        yield "data.vocab_size", vocab


def _ints(prefix: str, value: Any) -> Iterator[tuple[str, int]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _ints(f"{prefix}.{k}", v)
    elif isinstance(value, list):
        for v in value:
            yield from _ints(prefix, v)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield prefix, value


def disks(cfg: RunConfig, est: Estimate, tracking_uri: str | None) -> tuple[Disk, ...]:
    """The file systems the run writes its checkpoints and personal-state store to."""
    uses = [(CHECKPOINT, p) for p in checkpoint_folders(cfg, tracking_uri)]
    if est.store:
        uses.append((STORE, Path(cfg.clients.state.dir)))
    by_device: dict[int, tuple[int, list[tuple[str, str]]]] = {}
    for what, folder in uses:
        found = existing(folder)
        free, seen = by_device.get(found.stat().st_dev, (free_disk(found), []))
        by_device[found.stat().st_dev] = (free, [*seen, (what, str(folder))])
    return tuple(Disk(free, tuple(seen)) for free, seen in by_device.values())


def size_report(
    cfg: RunConfig,
    workers: int = 1,
    here: bool = True,
    tracking_uri: str | None = None,
    keeps_state: Callable[[], bool] | None = None,
    store: StoreChoice | None = None,
) -> SizeReport:
    """``cfg``'s estimates, held to this machine where the run is ``here`` (not on a named
    cluster); raises ``ConfigError`` in one line for what does not fit (module docstring).
    ``keeps_state``: whether the method keeps personal state (asked only where it decides);
    ``store``: how ``choose_store`` decided ``cfg``'s store, for the plan to say."""
    est = estimate(cfg, workers)
    keeps_state = keeps_state or (lambda: keeps_personal_state(cfg))
    check_absurd(cfg, est, keeps_state)
    ignored = os.environ.get(OVERRIDE, "").strip() not in ("", "0")
    if not here:
        return SizeReport(est, ignored=ignored, store=store)
    whole, available = memory()
    report = SizeReport(est, whole, available, disks(cfg, est, tracking_uri), ignored, store)
    if ignored or not report.refusal():
        return report
    lighter = report.without_maybe()  # what is sure; the rest where the method keeps state
    if lighter.refusal():
        raise ConfigError(lighter.refusal())
    if keeps_state():
        raise ConfigError(report.refusal())
    return lighter


def keeps_personal_state(cfg: RunConfig) -> bool:
    """Whether the method keeps a personal state per client: a built-in one with a personal
    parameter group, or any plugin's (its ``ClientContext.state`` cannot be told). Imports the
    method's implementation (torch, for most), so it is asked only where it decides."""
    if plugin_method(cfg):
        return True
    from raysim.algorithms.registry import get_method

    return any(g.role != "shared" for g in get_method(cfg.algorithm.name).groups)


def plugin_method(cfg: RunConfig) -> bool:
    """Whether the method is a plugin's, which may keep any ``ClientContext.state``: told
    without importing a method's implementation."""
    from raysim.algorithms.registry import method_spec

    try:
        return not method_spec(cfg.algorithm.name).module.startswith("raysim.")
    except KeyError:  # a module a dry run does not import registers it
        return True


@dataclass(frozen=True)
class StoreChoice:
    """How ``clients.state.store: auto`` was decided (``choose_store``): ``store`` (``memory`` or
    ``disk``) and ``why``, in words. ``shown``: the plan says it only where the method is known
    to keep personal state: it was asked (the choice depended on it) or the method is a
    plugin's; a built-in method's implementation (torch, for most) is not imported just to say
    its states fit in memory."""

    store: str
    why: str
    shown: bool

    def line(self) -> str:
        """The plan's ``client states: on disk (...)`` or ``client states: in memory (...)``."""
        return f"client states: {'on disk' if self.store == 'disk' else 'in memory'} ({self.why})"
