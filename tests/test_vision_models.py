"""The vision models of Feddle spec §5.1, built from configs with no download: the spec's CNN,
ResNet18 and ViT-B/16 with LoRA, their body/head split (§3.5), and a Feddle run on each."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.actors.local import local_core
from raysim.algorithms.feddle.probe import features, head_of
from raysim.config import load_config
from raysim.models import DataSpec, ModelConfig, build_handle, build_model

CIFAR = DataSpec("dense", (3, 32, 32), 10)


def count(module: torch.nn.Module, trainable: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable)


def test_the_spec_cnn_has_the_section_5_1_layers():
    torch.manual_seed(0)
    net = build_model(ModelConfig(name="cnn", channels=[32, 64, 64], hidden=[128]), CIFAR)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [
        (3, 32, (3, 3)),
        (32, 64, (3, 3)),
        (64, 64, (3, 3)),
    ]
    head = head_of(net)
    fc1 = [m for m in net.modules() if isinstance(m, torch.nn.Linear)][0]
    assert (fc1.in_features, fc1.out_features) == (16384, 128)  # 64 × 16 × 16 after the pool
    assert (head.in_features, head.out_features) == (128, 10)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    x = torch.rand(2, 3, 32, 32)
    assert net(x).shape == (2, 10)
    feats = features(net, head, x)
    assert feats.shape == (2, 128) and (feats >= 0).all()  # the first FC's output after ReLU


def test_resnet18_from_its_config_matches_torchvision_parameter_count():
    """Built with no download: 11,689,512 parameters with 1000 classes, as torchvision's
    resnet18; a new head for 10 classes; the 512-d pooled output is the body's features."""
    torch.manual_seed(0)
    imagenet = build_model(ModelConfig(name="resnet"), DataSpec("dense", (3, 224, 224), 1000))
    assert count(imagenet) == 11_689_512
    net = build_model(ModelConfig(name="resnet"), CIFAR)
    head = head_of(net)
    assert (head.in_features, head.out_features) == (512, 10)
    assert count(net) == 11_689_512 - 512 * 1000 - 1000 + 512 * 10 + 10
    net.eval()
    x = torch.rand(2, 3, 32, 32)  # stored at 32 px, resized to 224 inside the model
    with torch.no_grad():
        assert net(x).shape == (2, 10)
        assert features(net, head, x).shape == (2, 512)
    handle = build_handle(ModelConfig(name="resnet"), CIFAR)
    assert handle.layout().size > count(net)  # BatchNorm statistics travel too


def test_vit_b16_lora_trains_only_the_adapters_and_the_head():
    torch.manual_seed(0)
    net = build_model(ModelConfig(name="vit_lora"), CIFAR)
    assert 85_000_000 < count(net) < 87_000_000  # ViT-B/16
    trainable = {n for n, p in net.named_parameters() if p.requires_grad}
    assert all("lora_" in n or n.startswith("classifier.classifier.") for n in trainable)
    assert any(".q_proj.lora_A" in n for n in trainable)
    assert any(".v_proj.lora_B" in n for n in trainable)
    assert not any(".k_proj." in n for n in trainable)
    # r = 4 on query and value in 12 layers, plus a 768 → 10 head (§5.1)
    assert count(net, trainable=True) == 12 * 2 * (4 * 768 + 768 * 4) + 768 * 10 + 10
    lora = [m for n, m in net.named_modules() if n.endswith("q_proj")][0]
    assert lora.scaling["default"] == 8 / 4  # lora_alpha 8 over r 4
    handle = build_handle(ModelConfig(name="vit_lora"), CIFAR)
    assert handle.layout().size == count(net, trainable=True)  # the frozen ViT stays home
    head = head_of(net)
    assert (head.in_features, head.out_features) == (768, 10)
    net.eval()
    with torch.no_grad():
        assert features(net, head, torch.rand(1, 3, 32, 32)).shape == (1, 768)


TINY = {
    "resnet": {
        "name": "resnet",
        "resnet": {"depths": [1, 1], "hidden_sizes": [8, 16], "embedding_size": 8},
        "image": {"size": 16},
    },
    "vit_lora": {
        "name": "vit_lora",
        "vit": {
            "patch_size": 4,
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
        },
        "image": {"size": 16},
    },
}


@pytest.mark.parametrize("model", sorted(TINY))
def test_feddle_ood_runs_on_a_vision_model_and_is_deterministic(model):
    """Digits (8×8 grayscale) reach the model as 3×16×16; Feddle-OOD fits its probe on the
    body's features and moves the whole model; two runs give the same weights."""
    raw = {
        "seed": 1,
        "rounds": 2,
        "clients": {"num": 6, "per_round": 3},
        "data": {
            "name": "digits",
            "partition": {"kind": "iid"},
            "server": {"ood": [{"name": "shapes", "size": 40}]},
        },
        "model": TINY[model],
        "local": {"epochs": 1, "batch_size": 32, "lr": 1e-2, "optimizer": "adam"},
        "algorithm": {
            "name": "feddle_ood",
            "server_epochs": 1,
            "ood_samples_per_round": 20,
            "server_batch_size": 20,
        },
    }
    cfg = load_config(raw)
    digests = []
    for _ in range(2):
        core = local_core(cfg)
        start = core.strategy.weights.copy()
        while not core.done:
            core.step()
        digests.append(core.digest())
    assert digests[0] == digests[1]
    assert not np.array_equal(core.strategy.weights, start)
    m = core.strategy.metrics()
    assert np.isfinite(m["feddle_probe_loss"]) and m["feddle_atlas_size"] > 0


def test_pretrained_weights_load_from_a_local_path_with_a_new_head(tmp_path):
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    shape = {"depths": [1, 1], "hidden_sizes": [8, 16], "embedding_size": 8}
    saved = ResNetForImageClassification(ResNetConfig(**shape, num_labels=1000))
    saved.save_pretrained(tmp_path)
    cfg = ModelConfig(name="resnet", path=str(tmp_path), image={"size": 16})
    net = build_model(cfg, CIFAR)
    body = {k: v for k, v in saved.state_dict().items() if not k.startswith("classifier")}
    loaded = net.classifier.state_dict()
    for k, v in body.items():
        torch.testing.assert_close(loaded[k], v)
    assert head_of(net).out_features == 10
    # pretrained weights get ImageNet normalisation (§5.1); a random init does not
    assert torch.allclose(net.mean.flatten(), torch.tensor([0.485, 0.456, 0.406]))
    fresh = build_model(ModelConfig(name="resnet", image={"size": 16}), CIFAR)
    assert torch.equal(fresh.mean.flatten(), torch.zeros(3))


def test_a_vision_model_refuses_non_image_inputs():
    with pytest.raises(ValueError, match="image inputs"):
        build_model(ModelConfig(name="resnet"), DataSpec("dense", (40,), 10))


@pytest.mark.parametrize("name", ["mlp", "vit"])
def test_every_model_is_moved_to_model_device(monkeypatch, name):
    """``model.device`` (``auto``: the GPU a worker with ``workers.num_gpus`` sees) reaches every
    model, not only the causal LMs that are built there: a ViT or an MLP on a GPU worker used
    to stay on the CPU. Here the device is the meta device; ``tests/test_gpu.py`` checks CUDA."""
    import raysim.models.registry as registry

    monkeypatch.setattr(registry, "resolve_device", lambda _: torch.device("meta"))
    cfg, spec = tiny_model(name)
    handle = build_handle(cfg, spec)
    assert {p.device.type for p in handle.module.parameters()} == {"meta"}
    monkeypatch.undo()  # the control: the CPU, where model.device says cpu
    cpu = build_handle(cfg.model_copy(update={"device": "cpu"}), spec)
    assert {p.device.type for p in cpu.module.parameters()} == {"cpu"}


def tiny_model(name: str) -> tuple[ModelConfig, DataSpec]:
    """A small ``mlp`` or ``vit`` (32×32 images, one layer) and its data spec, 3 classes."""
    vit = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 64, "patch_size": 8}  # fmt: skip
    cfg = ModelConfig(name=name, image={"size": 32}, vit=vit)
    return cfg, DataSpec("dense", (3, 32, 32) if name == "vit" else (8,), 3)
