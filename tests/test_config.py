"""Config validation: unknown keys and wrong types fail early, naming the key and a suggestion."""

from __future__ import annotations

import pytest

from raysim.config import ConfigError, apply_overrides, flatten, load_config
from raysim.delays import HalfNormalParams
from tests.conftest import EXAMPLES


def test_examples_validate():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.rounds >= 1, path


def test_overrides_parse_types_and_nest():
    cfg = load_config(
        EXAMPLES / "async-mini.yaml",
        ["rounds=50", "workers.count=3", "delays.sigma=20", "algorithm.buffer_size=7"],
    )
    assert cfg.rounds == 50 and cfg.workers.count == 3
    assert isinstance(cfg.delays, HalfNormalParams) and cfg.delays.sigma == 20.0
    assert cfg.algorithm.params.buffer_size == 7


def test_override_creates_sections():
    raw = apply_overrides({}, ["a.b.c=[1, 2]", "x=true"])
    assert raw == {"a": {"b": {"c": [1, 2]}}, "x": True}


@pytest.mark.parametrize(
    "override, needle",
    [
        ("roundz=3", "unknown key 'roundz' (did you mean 'rounds'?)"),
        ("delays.sigm=3", "delays: unknown key 'sigm' (did you mean 'sigma'?)"),
        ("workers.cuont=2", "workers: unknown key 'cuont' (did you mean 'count'?)"),
        ("algorithm.bufer_size=2", "no parameter 'bufer_size' (did you mean 'buffer_size'?)"),
        ("algorithm.name=fedbuf", "unknown algorithm 'fedbuf' (did you mean 'fedbuff'?)"),
        ("delays.kind=halfnormal", "unknown delay kind 'halfnormal' (did you mean 'half_normal'?)"),
        ("rounds=abc", "rounds: Input should be a valid integer"),
        ("workers.count=0", "workers.count must be"),
        ("clients.per_round=1000", "(100): lower clients.per_round or raise clients.num"),
        ("local.optimizer=lion", "local.optimizer"),
        ("local.lrr=0.1", "local: unknown key 'lrr' (did you mean 'lr'?)"),
        ("model.lora.rank=4", "model.lora: unknown key 'rank'"),
    ],
)
def test_bad_input_names_the_key(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(EXAMPLES / "async-mini.yaml", [override])
    assert needle in str(err.value)


def test_bad_override_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config({}, ["rounds"])
    with pytest.raises(ConfigError, match="not found: [^(]*$"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "quickstart.yaml").write_text("rounds: 1\n")
    with pytest.raises(ConfigError, match=r"did you mean .*quickstart\.yaml\?"):
        load_config(tmp_path / "quickstart.yml")  # a near name beside it is suggested


def test_round_trip_and_flatten():
    cfg = load_config(EXAMPLES / "async-mini.yaml")
    again = load_config(cfg.to_dict())
    assert again == cfg
    flat = flatten(cfg.to_dict())
    assert flat["algorithm.name"] == "fedbuff" and flat["delays.sigma"] == 5.0


def test_cli_rejects_bad_key_before_ray(capsys, monkeypatch):
    import raysim.api
    from raysim.cli import main

    def no_ray(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("Ray was started for an invalid config")

    monkeypatch.setattr(raysim.api, "ensure_ray", no_ray)
    code = main(["run", str(EXAMPLES / "quickstart.yaml"), "delays.sigmaa=3"])
    assert code == 2
    assert "sigmaa" in capsys.readouterr().err


def test_overrides_apply_to_a_validated_config_too():
    """A ``RunConfig`` passed where a path or dict could go (``raysim.run``, ``raysim.tune``,
    resume) takes its overrides; they were once dropped without a word."""
    cfg = load_config(EXAMPLES / "quickstart.yaml")
    assert load_config(cfg) is cfg
    assert load_config(cfg, ["local.lr=0.3"]).local.lr == 0.3
    with pytest.raises(ConfigError, match="did you mean 'lr'"):
        load_config(cfg, ["local.lrr=0.3"])
