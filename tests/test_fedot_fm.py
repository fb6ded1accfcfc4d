"""FedOT's foundation-model extension (FedOT spec §9.4): maps on the token embeddings of a frozen
LLaMA with a shared LoRA predictor, moment-matching potentials over real tokens, and the
synthetic per-client embedding shift (the CPU checks §9.4 lists)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.actors.local import local_core
from raysim.algorithms.fedot.model import FedOTModel, wrap
from raysim.algorithms.fedot.params import FedOTParams
from raysim.config import load_config
from raysim.models import DataSpec, ModelConfig, build_model
from tests.conftest import EXAMPLES

FM = EXAMPLES / "fedot" / "fm-mini.yaml"
SMALL = ["clients.num=4", "clients.per_round=4", "rounds=2", "data.max_tokens=16",
         "eval.every=2", "tracking.enabled=false"]  # fmt: skip


def lm_model(**params) -> FedOTModel:
    torch.manual_seed(0)
    spec = DataSpec("tokens", (16,), 5, vocab_size=300)
    cfg = ModelConfig(name="lm_classifier", llama={"hidden_size": 32, "intermediate_size": 64})
    return wrap(build_model(cfg, spec), spec, FedOTParams(**params))


@pytest.mark.parametrize("family", ["affine_diag", "lowrank_affine"])
def test_identity_maps_give_the_backbone_and_lora_logits_exactly(family):
    model = lm_model(psi_family=family)
    tokens = torch.randint(1, 300, (3, 16))
    tokens[:, 10:] = 0
    model.eval()
    assert torch.equal(model(tokens), model.predictor(tokens))
    assert model.mapped.shape == (3, 16, 32) and model.mask.sum() == 30


def test_the_moment_features_average_real_tokens_per_sample_then_over_the_batch():
    model = lm_model()
    y = torch.randn(2, 5, 32)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    q, l_ = (f for f in model.mean_features(y, mask)[::-1])  # head order: l, q
    per_sample = [y[0, :2].mean(0), y[1].mean(0)]
    np.testing.assert_allclose(l_, (per_sample[0] + per_sample[1]) / 2, atol=1e-6)
    sq = [(0.5 * y[0, :2] ** 2).mean(0), (0.5 * y[1] ** 2).mean(0)]
    np.testing.assert_allclose(q, (sq[0] + sq[1]) / 2, atol=1e-6)
    with torch.no_grad():  # the potential's value agrees with its features
        for h in model.potential.head.parameters():
            h.normal_()
    values = model.potential_values(y, mask).mean()
    heads = dict(model.potential.head.named_parameters())
    linear = float(heads["q"].float() @ q + heads["l"].float() @ l_)
    assert float(values) == pytest.approx(linear, rel=1e-5)


def test_embedding_std_maps_and_matches_embeddings_in_units_of_the_tables_std():
    raw, standard = lm_model(), lm_model(potential_input="embedding_std")
    sigma = float(raw.predictor.input_embeddings().weight.std())
    assert standard.potential_scale == pytest.approx(1 / sigma) and sigma < 0.5
    tokens = torch.randint(1, 300, (3, 16))
    raw.eval(), standard.eval()
    torch.testing.assert_close(standard(tokens), raw(tokens), atol=1e-5, rtol=1e-5)  # still id
    torch.testing.assert_close(standard.mapped, raw.mapped / sigma, rtol=1e-5, atol=1e-5)
    assert 0.5 < float(standard.mapped.std()) < 2.0 and float(raw.mapped.std()) < 0.5
    with pytest.raises(ValueError, match="needs a model with input embeddings"):
        spec = DataSpec("dense", (8,), 3)
        wrap(
            build_model(ModelConfig(name="mlp"), spec),
            spec,
            FedOTParams(potential_input="embedding_std"),
        )


def test_lambda_zero_with_frozen_maps_follows_fedavg_lora_and_keeps_maps_and_heads_home():
    fedot = local_core(load_config(FM, [*SMALL, "algorithm.lambda=0", "algorithm.lr_map=0"]))
    plain = local_core(load_config(FM, [*SMALL, "algorithm={name: fedavg}"]))
    for core in (fedot, plain):
        while not core.done:
            core.step()
    names = fedot.server.layout.names
    assert all(n.startswith("predictor.") for n in names)
    assert any("lora_A" in n for n in names) and any("head" in n for n in names)
    assert not any("backbone" in n and "lora" not in n for n in names)  # the base never travels
    assert np.array_equal(fedot.weights, plain.weights)
    state = fedot.materialized_states()[0]
    assert {"psi.a", "psi.b", "potential.head.l", "potential.head.q"} == set(state)


def test_every_client_sees_its_own_embedding_shift_with_any_method():
    cfg = load_config(FM, [*SMALL, "algorithm={name: fedavg}"])
    core = local_core(cfg, evaluate=True)
    core.step()
    m = core.step()
    assert m["clients_evaluated"] == 4 and m["accuracy_std"] >= 0
    runner = core.executor.runner
    tokens = torch.from_numpy(runner.dataset.x_test[:2])
    module = runner.model.module
    views = []
    for client in (None, 0, 1, 0):
        runner.view_of(client)
        views.append(module.input_embeddings()(tokens))
    assert not torch.equal(views[0], views[1]) and not torch.equal(views[1], views[2])
    assert torch.equal(views[1], views[3])  # the same client, the same shift
    shift = runner._embedding_shift
    s, z = shift.params(1)
    assert 0.5 <= float(s.min()) and float(s.max()) <= 1.5
    table = module.input_embeddings().weight
    assert shift.std == pytest.approx(float(table.std()))
    np.testing.assert_allclose(views[2], views[0] * s + z, atol=1e-6)


def test_fedot_trains_maps_and_heads_on_embeddings():
    core = local_core(load_config(FM, SMALL), evaluate=True)
    core.step()
    m = core.step()
    assert m["client_map_deviation"] > 0 and m["client_dual_norm"] > 0
    assert np.isfinite(m["accuracy"]) and m["dual_sum_norm"] <= 1e-9


def test_a_pretrained_models_tokenizer_encodes_the_data_and_its_pad_id_is_masked(tmp_path):
    """``data.tokenizer``: a Hugging Face tokenizer's ids, right-padded with its own pad id,
    which ``lm_classifier`` masks: a padded sequence scores as the same sequence unpadded."""
    from raysim.data.builtin import load_bbc_news
    from raysim.data.federated import DataConfig, build_federated_dataset
    from raysim.data.tokenizer import build_word_tokenizer
    from raysim.sim.build import data_spec

    tok = build_word_tokenizer(load_bbc_news().x[:200], vocab_size=400)
    tok.save_pretrained(str(tmp_path / "tok"))
    ds = build_federated_dataset(
        DataConfig(name="bbc_news", tokenizer=str(tmp_path / "tok"), max_tokens=700,
                   partition={"kind": "iid"}),
        4,
        0,
    )  # fmt: skip
    spec = data_spec(ds)
    assert spec.pad_id == tok.pad_token_id and spec.vocab_size == len(tok)
    assert ds.x_train.dtype == np.int64 and ds.x_train.shape[1] == 700
    real = ds.x_train != spec.pad_id
    assert real[:, 0].all() and not real.all()  # texts first, then right padding
    assert (np.diff(real.astype(int), axis=1) <= 0).all()
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(name="lm_classifier", llama={"hidden_size": 32, "intermediate_size": 64},
                    lora={"dropout": 0.0}),
        spec,
    ).eval()  # fmt: skip
    real = torch.tensor([5, 9, 13, 7])
    padded = torch.cat([real, torch.full((6,), spec.pad_id)])
    with torch.no_grad():
        a, b = model(real[None]), model(padded[None])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_smollm2_config_reads_its_tokenizer_and_weights():
    cfg = load_config(EXAMPLES / "fedot" / "fm-smollm2.yaml")
    assert cfg.data.tokenizer == "smollm2" and cfg.model.path == "smollm2"
    assert cfg.data.shift.kind == "embedding" and cfg.algorithm.name == "fedot"
