"""Config validation: unknown keys and wrong types fail early, naming the key and a suggestion."""

from __future__ import annotations

import pytest

from raysim.config import ConfigError, apply_overrides, flatten, load_config
from raysim.sim.delays import HalfNormalParams
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
    import raysim.launch.session
    from raysim.cli import main

    def no_ray(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("Ray was started for an invalid config")

    monkeypatch.setattr(raysim.launch.session, "ensure_ray", no_ray)
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


# ---------------------------------------------------------------- the data section's sources


def _run_configs() -> list:
    """Every run config under examples/ (the methods.yaml files list a reproduction's cells)."""
    return sorted(p for p in EXAMPLES.rglob("*.yaml") if p.name != "methods.yaml")


def test_every_example_data_section_is_its_sources_class():
    import yaml

    from raysim.data.federated import SOURCES, DigitsData

    classes = {n: s for s in SOURCES for n in s.names()}
    assert len(_run_configs()) > 30
    for path in _run_configs():
        raw = yaml.safe_load(path.read_text()).get("data") or {}
        cfg = load_config(path)
        cls = classes[raw.get("name", "digits")]
        assert type(cfg.data) is cls, path
        assert set(cfg.to_dict()["data"]) == set(cls.model_fields), path  # its options only
        assert load_config(cfg.to_dict()) == cfg, path
    assert type(load_config({}).data) is DigitsData  # no data section: digits
    assert type(load_config({"data": {"test_fraction": 0.3}}).data) is DigitsData


def _data_error(data: dict) -> str:
    with pytest.raises(ConfigError) as err:
        load_config({"data": data})
    return str(err.value)


def test_an_unknown_data_key_names_the_closest_one_of_its_source():
    assert _data_error({"name": "digits", "test_fractoin": 0.2}) == (
        "invalid config: data: unknown key 'test_fractoin' (did you mean 'test_fraction'?); "
        "valid keys for name='digits': digits, name, partition, server, shift, test_fraction"
    )
    assert "(did you mean 'hf_image'? it applies to name='hf_image')" in _data_error(
        {"name": "digits", "hf_imag": {"preset": "cifar10"}}
    )
    assert _data_error({"name": "hf", "hf": {"path": 3}}) == (
        "invalid config: data.hf.path: Input should be a valid string (got 3)"
    )  # pydantic's tag (data.hf.hf.path) is not the user's key


def test_an_option_of_another_source_names_the_sources_that_take_it():
    assert _data_error({"name": "digits", "hf": {"path": "x"}}) == (
        "invalid config: data.hf applies only to name='hf', not to name='digits'"
    )
    assert _data_error({"name": "flan_mini", "partition": {"alpha": 0.1}}) == (
        "invalid config: data.partition applies only to name in ('digits', 'mnist1d', "
        "'bbc_news', 'hf', 'hf_image', 'markov', 'hf_lm'), not to name='flan_mini': clients "
        "follow leave-one-task-out (use data.text.shards_per_task)"
    )
    assert _data_error({"name": "digits", "vocab_size": 300}) == (
        "invalid config: data.vocab_size applies only to name in ('bbc_news', 'hf', "
        "'flan_mini', 'flan'), not to name='digits'"
    )


def test_an_unknown_source_names_the_closest_and_lists_them():
    assert _data_error({"name": "mnist"}) == (
        "invalid config: data.name 'mnist' is no data source (did you mean 'mnist1d'?); "
        "sources: digits, mnist1d, bbc_news, hf, hf_image, flan_mini, flan, markov, hf_lm, "
        "synthetic"
    )


def test_other_sources_options_at_their_defaults_are_dropped():
    """What configs written before the sources had their own classes hold (every section, at
    its default where it did not apply): they load, a checkpoint's config among them."""
    cfg = load_config(
        {"data": {"name": "flan_mini", "test_fraction": 0.2, "hf": {}, "partition": {}}}
    )
    assert set(cfg.to_dict()["data"]) == {"name", "text", "vocab_size"}
    # switching the source by an override on a dumped config (its digits section at defaults)
    dumped = load_config(EXAMPLES / "quickstart.yaml").to_dict()
    assert load_config(dumped, ["data.name=bbc_news"]).data.name == "bbc_news"


def test_data_config_builds_the_class_its_name_picks():
    from pydantic import ValidationError

    from raysim.data import DataConfig
    from raysim.data.federated import HFImageData, TextTaskData

    assert isinstance(DataConfig(name="hf_image", hf_image={"preset": "cifar10"}), HFImageData)
    assert isinstance(
        DataConfig.model_validate({"name": "flan", "text": {"data_dir": "/x"}}),
        TextTaskData,
    )
    with pytest.raises(ValidationError, match="data.hf applies only to name='hf'"):
        DataConfig(hf={"path": "csv"})  # digits by default
    cfg = load_config({"data": {"name": "flan_mini"}})
    assert cfg.data.server_data().id_size == 0 and cfg.data.input_shift().kind == "none"
    assert cfg.run_name() == "run · fedavg · flan_mini · seed 0"
