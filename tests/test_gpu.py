"""What only a CUDA device can show: the batched trainer and the multi-LoRA pass keep every
tensor on the model's device and end where one-client-at-a-time training does.

Skipped where no CUDA device is visible (CI has none); `bash benchmarks/gpu_e2e.sh` runs them
on the lent GPU machine. A CPU test cannot catch a tensor left on the CPU: these can."""

from __future__ import annotations

import copy

import pytest
import torch

from raysim.models import DataSpec, ModelConfig, build_model
from raysim.models.handle import ModelHandle
from raysim.training.batched import train_batched
from raysim.training.loop import train_local
from raysim.training.settings import LocalTrainingConfig
from raysim.training.tasks import CausalLMTask, ClassificationTask
from tests.test_batched import Wrapped, clients

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")
#: float32 kernels on the GPU reassociate differently batched and alone
ATOL = 1e-4


@pytest.fixture(autouse=True)
def _full_fp32_matmul():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize(
    "local",
    [
        {"optimizer": "sgd", "momentum": 0.9, "weight_decay": 1e-3},
        {"optimizer": "adam", "lr": 0.01, "lr_schedule": "linear"},
        {"optimizer": "sgd", "max_grad_norm": 0.05},
    ],
    ids=["momentum", "adam-linear", "clip"],
)
@pytest.mark.parametrize("wrapped", [False, True], ids=["bmm", "vmap"])
def test_batched_clients_on_the_gpu_end_where_sequential_ones_do(local, wrapped):
    cfg = LocalTrainingConfig(**{"batch_size": 4, "epochs": 2, "lr": 0.05, **local})
    modules, datas = clients([13, 1, 7, 4, 9])
    if wrapped:
        modules = [Wrapped(m) for m in modules]
    modules = [m.to(CUDA) for m in modules]
    datas = [(x.to(CUDA), y.to(CUDA)) for x, y in datas]
    alone = [copy.deepcopy(m) for m in modules]
    task = ClassificationTask()
    seq = [
        train_local(m, list(m.parameters()), task, d, cfg, torch.Generator().manual_seed(i))
        for i, (m, d) in enumerate(zip(alone, datas, strict=True))
    ]
    gens = [torch.Generator().manual_seed(i) for i in range(len(datas))]
    starts = [list(m.parameters()) for m in modules]
    finals, bat = train_batched(ModelHandle(modules[0]), starts, task, datas, cfg, gens)
    for a, final, s, t in zip(alone, finals, seq, bat, strict=True):
        assert t["local_steps"] == s["local_steps"]
        assert t["train_loss"] == pytest.approx(s["train_loss"], abs=1e-4)
        for p, q in zip(a.parameters(), final, strict=True):
            assert q.device.type == "cuda"
            torch.testing.assert_close(q, p.detach(), atol=ATOL, rtol=0)


def test_multi_lora_clients_on_the_gpu_end_where_peft_passes_do():
    """FedIT's local work on a tiny LLaMA built on the GPU: 4 clients' adapters trained in one
    multi-LoRA pass each step against each client's own PEFT pass."""
    vocab, length, k = 64, 12, 4
    llama = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4}  # fmt: skip
    torch.manual_seed(0)
    cfg = ModelConfig(name="llama", llama=llama, device="cuda", lora={"r": 4, "dropout": 0.0})
    handle = build_model(cfg, DataSpec("causal_lm", (length,), vocab, vocab))
    g = torch.Generator().manual_seed(1)
    datas = []
    for n in (6, 3, 8, 5):
        ids = torch.randint(4, vocab, (n, length), generator=g)
        datas.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    params = handle.global_parameters()
    starts = [[(0.05 * torch.randn(p.shape, generator=g)).to(p) for p in params] for _ in range(k)]
    local = LocalTrainingConfig(batch_size=2, epochs=1, lr=0.05, optimizer="adam")
    task = CausalLMTask(CUDA)
    alone = []
    for i, (own, data) in enumerate(zip(starts, datas, strict=True)):
        with torch.no_grad():
            for p, t in zip(params, own, strict=True):
                p.copy_(t)
        train_local(handle.module, params, task, data, local, torch.Generator().manual_seed(i))
        alone.append([p.detach().clone() for p in params])
    gens = [torch.Generator().manual_seed(i) for i in range(k)]
    finals, _ = train_batched(handle, starts, task, datas, local, gens)
    for mine, theirs in zip(alone, finals, strict=True):
        for p, q in zip(mine, theirs, strict=True):
            assert q.device.type == "cuda"
            torch.testing.assert_close(q, p, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["mlp", "vit"])
def test_a_small_or_vision_model_trains_on_the_gpu_it_is_given(name):
    """``model.device: auto`` on a process that sees a GPU: the model and its local training are
    on CUDA (they stayed on the CPU before, whatever ``workers.num_gpus`` reserved)."""
    from raysim.models import build_handle
    from tests.test_vision_models import tiny_model

    cfg, spec = tiny_model(name)
    handle = build_handle(cfg, spec)
    assert {p.device.type for p in handle.module.parameters()} == {"cuda"}
    g = torch.Generator().manual_seed(0)
    x = torch.rand((16, *spec.feature_shape), generator=g).to(CUDA)
    y = torch.randint(0, 3, (16,), generator=g).to(CUDA)
    params = handle.global_parameters()
    out = train_local(handle.module, params, ClassificationTask(), (x, y),
                      LocalTrainingConfig(batch_size=4, epochs=1, lr=0.1), g)  # fmt: skip
    assert out["local_steps"] == 4 and all(p.device.type == "cuda" for p in params)
