"""Multi-LoRA (``raysim.models.multilora``): k clients' adapters on one frozen tiny LLaMA in one
pass give each client the gradient of k separate PEFT LoRA passes."""

from __future__ import annotations

import pytest
import torch

from raysim.models import DataSpec, ModelConfig, build_model
from raysim.models.multilora import MultiLoRA, client_losses, lora_layers

VOCAB, LENGTH, K = 50, 10, 3
SPEC = DataSpec("causal_lm", (LENGTH,), VOCAB, VOCAB)
LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4}  # fmt: skip


def tiny(dropout: float = 0.0, dtype: str = "float32"):
    torch.manual_seed(0)
    cfg = ModelConfig(
        name="llama", llama=LLAMA, device="cpu", dtype=dtype, lora={"r": 4, "dropout": dropout}
    )
    return build_model(cfg, SPEC)


def batch(rows: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (rows, LENGTH), generator=g)
    lengths = torch.randint(5, LENGTH + 1, (rows,), generator=g)
    mask = (torch.arange(LENGTH)[None] < lengths[:, None]).long()
    labels = torch.where(mask.bool(), ids * mask, torch.full_like(ids, -100))
    labels[:, :2] = -100  # a prompt without loss
    return {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_clients_gradient_is_its_own_peft_pass(dtype):
    """On a bf16 base (fp32 adapters, as on the GPU) too: PEFT adds the adapter's output to the
    base's in fp32 and rounds once; rounding the adapter's output to bf16 first was 5 % off."""
    handle = tiny(dtype=dtype)
    peft_model = handle.module
    adapter = handle.global_adapter
    params = handle.global_parameters()
    g = torch.Generator().manual_seed(1)
    adapters = [[0.1 * torch.randn(p.shape, generator=g) for p in params] for _ in range(K)]
    batches = [batch(rows, seed) for rows, seed in ((2, 0), (3, 1), (1, 2))]

    expected = []
    for own, b in zip(adapters, batches, strict=True):  # k separate PEFT passes
        with torch.no_grad():
            for p, t in zip(params, own, strict=True):
                p.copy_(t)
        loss = peft_model(**b).loss
        expected.append((float(loss.detach()), torch.autograd.grad(loss, params)))

    multi = MultiLoRA(peft_model, adapter, K)
    assert multi.names() == [n for n, _ in handle._global]  # the same tensors, the same order
    for c, own in enumerate(adapters):
        multi.load(c, own)
    owner = torch.cat([torch.full((len(b["labels"]),), c) for c, b in enumerate(batches)])
    joined = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    with multi.route(owner):
        logits = peft_model(input_ids=joined["input_ids"],
                            attention_mask=joined["attention_mask"]).logits  # fmt: skip
    losses = client_losses(logits, joined["labels"], owner, K)
    grads = torch.autograd.grad(losses.sum(), multi.parameters())
    for c, (loss, own_grads) in enumerate(expected):
        assert float(losses[c]) == pytest.approx(loss, rel=1e-5)
        for got, want in zip(grads, own_grads, strict=True):
            torch.testing.assert_close(got[c], want, atol=1e-6, rtol=1e-4)
        assert any(float(w.abs().max()) > 0 for w in own_grads)
    assert all(
        lay.forward.__func__ is type(lay).forward for _, lay in lora_layers(peft_model, adapter)
    )


def test_lora_dropout_is_refused_because_it_would_be_shared():
    handle = tiny(dropout=0.1)
    with pytest.raises(ValueError, match="lora_dropout 0"):
        MultiLoRA(handle.module, handle.global_adapter, 2)


def test_client_losses_stay_on_the_logits_device():
    """Caught on the first GPU: the per-client sums were built on the CPU whatever the logits'
    device. The ``meta`` device fails the same way on a CPU machine."""
    k, rows, length, vocab = 3, 4, 5, 7
    logits = torch.empty(rows, length, vocab, device="meta")
    labels = torch.empty(rows, length, dtype=torch.long, device="meta")
    owner = torch.empty(rows, dtype=torch.long, device="meta")
    losses = client_losses(logits, labels, owner, k)
    assert losses.device.type == "meta" and losses.shape == (k,)
