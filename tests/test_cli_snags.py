"""CLI snags a new user met: ``raysim methods`` could not show a method of their own module, nor
what a parameter is; overrides after an option were refused; ``{name:fedit}`` gave no hint;
``--address`` hid its HOST:PORT form; ``raysim tune --resume DIR --dry-run`` did not check DIR."""

from __future__ import annotations

import json
import re

import pytest

from raysim import cli
from raysim.cli.parser import build_parser
from tests.conftest import ROOT
from tests.test_first_hour import one_line_error

QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")

#: a user's method module: one parameter with a meaning (a Field description), others without
PLUGIN = """
from typing import Literal

from pydantic import Field

from raysim.algorithms import Method, MethodParams, register
from raysim.algorithms.general.fedavg import FedAvg


class SnagParams(MethodParams):
    mixing: float = Field(0.25, description="share of the mean kept")
    rounds_kept: int = 3
    mode: Literal["first", "second"] = "first"
    limit: float | None = None


class Snag(FedAvg):
    params: SnagParams


register(Method(name="snag_demo", strategy=Snag, params=SnagParams, reference="snag tests"))
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> str:
    """The module as a ``.py`` file (one file for the module: a method registers once)."""
    path = tmp_path_factory.mktemp("plugin") / "snag_method.py"
    path.write_text(PLUGIN)
    return str(path)


@pytest.fixture
def wide(monkeypatch):
    """Rich and argparse lay out for 200 columns: a table row or a help line stays whole."""
    from raysim.cli import common

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(common.console, "_width", 200)


def test_methods_module_lists_and_shows_a_users_own_method(plugin, capsys, wide):
    """Snag 1: ``raysim methods [NAME] --module MODULE``, as ``algorithm.module`` in a config."""
    assert cli.main(["methods", "--module", plugin]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"snag_demo .*mixing rounds_kept mode limit", listed), listed
    assert "fedbuff" in listed  # the built-ins still
    assert cli.main(["methods", "snag_demo", "--module", plugin]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("snag_demo: snag tests"), shown
    # the option before NAME, too
    assert cli.main(["methods", "--module", plugin, "snag_demo"]) == 0
    assert capsys.readouterr().out == shown
    line = one_line_error(capsys, ["methods", "snag_demo", "--module", plugin + ".missing"])
    assert "no such file" in line
    line = one_line_error(capsys, ["methods", "no_such_method"])
    assert "unknown algorithm 'no_such_method'" in line and "--module MODULE" in line


def test_methods_name_prints_each_parameters_type_default_and_meaning(plugin, capsys, wide):
    """Snag 6: one method's parameters with their type and their Field description, where one is
    written; a parameter without one has its type alone."""
    assert cli.main(["methods", "snag_demo", "--module", plugin]) == 0
    out = capsys.readouterr().out
    assert re.search(r"mixing +0\.25 +float: share of the mean kept", out), out
    assert re.search(r"rounds_kept +3 +int *$", out, re.M), out
    assert re.search(r"mode +first +first \| second *$", out, re.M), out
    assert re.search(r"limit +None +float \| None *$", out, re.M), out
    assert cli.main(["methods", "fedbuff"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"buffer_size +10 +int: K, updates per flush", out), out
    assert cli.main(["methods", "fedavg"]) == 0
    assert "parameters: none" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "tune", "loto", "lodo"])
def test_overrides_are_taken_after_an_option_too(command):
    """Snag 2: ``raysim COMMAND CONFIG --dry-run key=value`` was 'unrecognized arguments'."""
    parser = build_parser()
    args = parser.parse_args(
        [command, "c.yaml", "--dry-run", "rounds=3", "--address", "auto", "a=1"]
    )
    assert (args.config, args.overrides, args.dry_run) == ("c.yaml", ["rounds=3", "a=1"], True)
    assert args.address == "auto"
    args = parser.parse_args([command, "--dry-run", "c.yaml", "rounds=3"])
    assert (args.config, args.overrides) == ("c.yaml", ["rounds=3"])


def test_run_dry_run_then_an_override_runs_with_it(capsys):
    assert cli.main(["run", QUICKSTART, "--dry-run", "rounds=3"]) == 0
    assert "· 3 rounds ·" in capsys.readouterr().out
    # --resume's config may still be an override (cli.run._run_args)
    args = build_parser().parse_args(["run", "--resume", "RUN", "--force", "rounds=3"])
    assert (args.config, args.overrides, args.force) == ("rounds=3", [], True)


@pytest.mark.parametrize(
    ("override", "written"),
    [
        ("algorithm={name:fedit}", "algorithm={name: fedit}"),
        ("algorithm={name: fedbuff, buffer_size:5}", "algorithm={name: fedbuff, buffer_size: 5}"),
        ("algorithm={name:fedbuff, server_lr:0.5}", "algorithm={name: fedbuff, server_lr: 0.5}"),
    ],
)
@pytest.mark.parametrize("command", ["run", "tune"])
def test_a_flow_mapping_without_a_space_after_the_colon_says_how_to_write_it(
    capsys, override, written, command
):
    """Snag 3: YAML reads ``{name:fedit}`` as the key ``name:fedit``: one line says so and how to
    write it, whichever command took the override."""
    line = one_line_error(capsys, [command, QUICKSTART, override, "--dry-run"])
    assert "needs a space after it" in line and f"write '{written}'" in line, line


def test_python_callers_get_the_same_hint():
    """``raysim.run(config, overrides=[...])`` reads overrides through ``load_config`` too."""
    from raysim.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"write 'algorithm=\{name: fedit\}'"):
        load_config(QUICKSTART, ["algorithm={name:fedit}"])


def test_a_colon_in_a_plain_value_or_after_a_space_is_no_mistake(capsys, tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    argv = ["run", QUICKSTART, "--dry-run", f"tracking.uri={uri}", "algorithm={name: fedbuff}"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"tracking: {uri}" in out and "fedbuff" in out


@pytest.mark.parametrize("command", ["run", "tune", "loto", "lodo"])
def test_address_help_names_every_form_it_takes(command, capsys, wide):
    """Snag 4: the docs' ``--address HOST:PORT`` was missing from the help."""
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"--address ADDRESS .*auto .*HOST:PORT .*ray://HOST:PORT", out), out


def test_tune_resume_dry_run_checks_the_sweeps_directory(tmp_path, capsys):
    """Snag 5: ``raysim tune CONFIG --resume DIR --dry-run`` checks DIR as the resume does (a
    folder with the sweep's file and Tune's state), in one line, exit 2."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rounds: 2\ntune: {space: {local.lr: {grid: [0.1]}}}\n")
    argv = ["tune", str(cfg), "--dry-run", "--resume"]
    line = one_line_error(capsys, [*argv, str(tmp_path / "nope")])
    assert "no such directory" in line
    line = one_line_error(capsys, [*argv, str(cfg)])
    assert "not a directory" in line
    store = tmp_path / "tune"
    sweep = store / "c-20261130-000000"
    sweep.mkdir(parents=True)
    line = one_line_error(capsys, [*argv, str(sweep)])
    assert "is not a raysim sweep's directory (no raysim_sweep.json)" in line
    (sweep / "raysim_sweep.json").write_text(json.dumps({"parent_run_id": None}))
    line = one_line_error(capsys, [*argv, str(store)])  # --storage, not the sweep's folder
    assert f"did you mean {sweep}?" in line
    line = one_line_error(capsys, [*argv, str(sweep)])
    assert "no Tune experiment to resume there (no tuner.pkl" in line
    (sweep / "tuner.pkl").write_bytes(b"")  # never read by a dry run
    assert cli.main([*argv, str(sweep)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dry run: 1 trial(s)"), out
