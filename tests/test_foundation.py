"""The tiny "foundation" stage of FedOA spec §7.1: corpus, tokenizer, pre-training, use in a run."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
import torch

from raysim.data.foundation_corpus import FOUNDATION_FAMILIES, generate_foundation_corpus
from raysim.data.text_tasks import (
    _OPTIONS,
    FAMILIES,
    TextTaskConfig,
    build_text_task_dataset,
    generate_flan_mini,
    word_pools,
)
from raysim.models.foundation import FoundationConfig, foundation_metadata, pretrain_foundation


def _first_option_line(instruction: str) -> list[str]:
    return [o.strip() for o in instruction.split("OPTIONS:\n", 1)[1].split("\n") if o]


def test_corpus_is_deterministic_format_aware_and_disjoint_from_the_tasks():
    a = generate_foundation_corpus(0, 200)
    assert a == generate_foundation_corpus(0, 200)
    assert a != generate_foundation_corpus(0, 200, split=1)
    assert {e.family for e in a} == set(FOUNDATION_FAMILIES)
    assert not {e.family for e in a} & set(FAMILIES)
    words = set().union(*(p.words() for p in word_pools(0).values()))
    labels = {o for opts in _OPTIONS.values() for o in opts}
    label_words = {w for o in labels for w in re.findall(r"\w+", o)}
    answers_from_labels = 0
    for e in a:
        options = [o.removeprefix("- ") for o in _first_option_line(e.instruction)]
        assert e.output in options  # every answer is one listed option (§7.1)
        assert set(re.findall(r"\w+", e.output)) <= words | label_words
        answers_from_labels += e.output in labels
    assert 10 <= answers_from_labels <= 100  # label words are answers too, not only pool words
    # no Flan-mini instruction wording appears in the corpus
    flan = generate_flan_mini(0, 20, 5)
    first_lines = {e.instruction.split("\n")[0] for s in flan.values() for e in s["train"]}
    assert not first_lines & {e.instruction.split("\n")[0] for e in a}


@pytest.fixture(scope="module")
def foundation_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("foundation") / "tiny"
    cfg = FoundationConfig(steps=60, warmup_steps=5, eval_examples=20, lr=1e-2, corpus_size=1000)
    losses: list[float] = []
    meta = pretrain_foundation(cfg, out, lambda step, loss: losses.append(loss))
    return out, meta, losses


def test_pretraining_learns_and_saves_a_loadable_directory(foundation_dir):
    out, meta, losses = foundation_dir
    assert len(losses) == 60
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.5
    assert foundation_metadata(out) == meta
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert meta["parameters"] > 100_000 and 0 <= meta["heldout_exact_match"] <= 1
    # which weights, and where they were made: the digest is the saved file's
    assert (
        meta["weights_sha256"]
        == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    )
    assert meta["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_a_run_dataset_with_the_foundation_tokenizer_has_no_unknown_words(foundation_dir):
    out = foundation_dir[0]
    text = TextTaskConfig(tokenizer=str(out), n_train=60, n_test=20, data_seed=0)
    ds = build_text_task_dataset(text, "flan_mini", 6, seed=7)  # run seed differs: data seed wins
    unk = ds.special_ids["unk_token"]
    assert all((c["input_ids"] != unk).all() for c in ds.clients)
    assert all((es.encoded["input_ids"] != unk).all() for es in ds.eval_sets.values())
    assert ds.vocab_size == foundation_dir[1]["vocab_size"]


def test_a_data_seed_other_than_the_foundation_s_is_refused(foundation_dir):
    out = foundation_dir[0]
    with pytest.raises(ValueError, match="data seed 0.*data.text.data_seed=0"):
        build_text_task_dataset(TextTaskConfig(tokenizer=str(out)), "flan_mini", 6, seed=3)


def test_the_foundation_model_loads_as_hf_causal_lm_with_lora(foundation_dir):
    from raysim.algorithms.fedoa.method import PERSONAL_GROUPS
    from raysim.models.registry import DataSpec, ModelConfig, build_handle

    out = foundation_dir[0]
    cfg = ModelConfig(name="hf_causal_lm", path=str(out))
    spec = DataSpec("causal_lm", (32,), 0, None)
    handle = build_handle(cfg, spec, PERSONAL_GROUPS)
    trainable = [n for n, p in handle.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert handle.get_adapter("global").size == 2 * 2 * 8 * (64 + 64)  # 2 layers x q/v x A,B


@pytest.mark.matrix  # suite time: pretraining runs fast in process (above)
def test_cli_pretrain_tiny_llama_writes_the_directory(tmp_path, capsys):
    """``raysim pretrain tiny-llama`` (one verb for every foundation); ``raysim foundation``, the
    old name, does the same and says it is an alias; an option of another kind is refused."""
    from raysim.cli import main

    out = tmp_path / "f"
    native = ["--kernels", "native"]  # this test's process loaded torch with its own kernels
    args = ["--out", str(out), "--steps", "3", "--seed", "3", *native]
    assert main(["pretrain", "tiny-llama", *args]) == 0
    assert foundation_metadata(out)["config"]["steps"] == 3
    assert foundation_metadata(out)["config"]["init_seed"] == 3
    capsys.readouterr()
    old = tmp_path / "old"
    assert main(["foundation", "--out", str(old), "--steps", "2", "--data-seed", "1", *native]) == 0
    assert foundation_metadata(old)["config"]["steps"] == 2
    assert "raysim pretrain tiny-llama" in capsys.readouterr().err
    assert main(["pretrain", "tiny-llama", "--out", str(out), "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert "--epochs applies to raysim pretrain digits or markov, not tiny-llama" in err
    # the default, portable kernels, cannot be had once torch is loaded: one line, nothing made
    fresh = tmp_path / "portable"
    assert main(["pretrain", "tiny-llama", "--out", str(fresh), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "portable kernels: torch was loaded with" in err and "fresh process" in err
    assert not fresh.exists()


def _driver():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "fedoa" / "qualitative.py"
    spec = importlib.util.spec_from_file_location("qualitative", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _t2_rows(q, table, noise=0.1, seeds=5):
    """Five seeds of ``table`` (method -> figures), each figure moved by its own small draw per
    method and seed: the paired differences vary from seed to seed, as a run's do."""
    rng = np.random.default_rng(7)
    return {
        m: [{k: v + noise * rng.standard_normal() for k, v in row.items()} for _ in range(seeds)]
        for m, row in table.items()
    }


def _t2_table(q):
    base = {"ood_rouge1": 40.0, "id_rouge1": 60.0, "fd_last": 1.0, "fd_ratio": 1.0}
    t = {m: dict(base) for m in q.METHODS}
    t["zero_shot"]["ood_rouge1"] = 20.0  # gate: 40 − 20 > 5
    t["local_only"].update(ood_rouge1=30.0, fd_ratio=3.0)  # 1a: 40 − 30 > 5; 3: 1 − 3 < 0
    for m, ood, fd in zip(q.LAMBDAS, (38.0, 39.0, 40.0, 41.0), (4.0, 3.0, 2.0, 1.0), strict=True):
        t[m].update(ood_rouge1=ood, fd_last=fd)  # 2a: rises with λ; 2b: falls with λ
    return t


def test_the_t2_driver_judges_the_claims_from_the_numbers():
    """Each claim is decided paired by seed (``raysim.verdicts``) on five seeds whose differences
    vary: held where its interval clears the margin and every seed agrees, not held where it lies
    beyond, inconclusive where the seeds cannot tell."""
    from raysim.verdicts import HELD, INCONCLUSIVE, NOT_HELD

    q = _driver()
    t = _t2_table(q)
    verdicts = [v for _, v, _ in q.claims(_t2_rows(q, t))]
    assert verdicts == [HELD, HELD, HELD, "report", HELD, HELD, HELD, HELD, HELD, "report"]
    t["fedoa_l2"]["ood_rouge1"] = 37.0  # a fall of 3 points from λ = 0.5 to 2 breaks 2a
    t["fedlora"]["id_rouge1"] = 50.0  # 4a: FedLoRA 10 below FedIT
    rows = _t2_rows(q, t)
    held = {text[:2]: v for text, v, _ in q.claims(rows)}
    assert held["2a"] == NOT_HELD and held["4a"] == NOT_HELD and held["1b"] == HELD
    for s, ood in enumerate((30.0, 38.0, 22.0, 31.0, 29.0)):  # 1a: the seeds disagree
        rows["local_only"][s]["ood_rouge1"] = ood
    held = {text[:2]: v for text, v, _ in q.claims(rows)}
    assert held["1a"] == INCONCLUSIVE
    previous = "| 1a. old text | yes | x |\n| 2a. old | yes | y |\n| 4b. old | **no** | z |"
    assert q.changed(q.claims(rows), previous) == [
        "- 1a: held → inconclusive", "- 2a: held → not held", "- 4b: not held → held"
    ]  # fmt: skip
    report = (
        f"{q.CLAIMS_HEADING}\n{previous}\n## x\n### grid, entailment held out\n| 1a. e | no | |"
    )
    assert q.claims_section(report, None).strip() == previous
    assert q.claims_section(report, "entailment").strip() == "| 1a. e | no | |"


def test_the_t2_claims_use_student_s_t_and_the_sample_deviation():
    """1a's five differences (5.6, 8.6, 5.3, 8.0, 6.5) all clear +5, but the 95 % interval with
    t(4) and ddof = 1 starts at 4.99: inconclusive. A normal quantile (low 5.53) or ddof = 0 (low
    5.18) would call it held (issue 62: the claims test must see a wrong quantile or ddof)."""
    from raysim.verdicts import INCONCLUSIVE

    q = _driver()
    rows = _t2_rows(q, _t2_table(q))
    for s, d in enumerate((5.6, 8.6, 5.3, 8.0, 6.5)):
        rows["local_only"][s]["ood_rouge1"] = rows["fedoa_l0.5"][s]["ood_rouge1"] - d
    checks = {text[:2]: (v, n) for text, v, n in q.claims(rows)}
    assert checks["1a"][0] == INCONCLUSIVE, checks["1a"]
    assert "[4.99, " in checks["1a"][1]


def test_a_failed_sanity_gate_voids_every_later_claim():
    """FedOA spec §7.1: the gate comes before any claim, and where it fails "the results are void":
    every later verdict says so (the descriptive rows stay reports), numbers still shown."""
    q = _driver()
    t = _t2_table(q)
    t["zero_shot"]["ood_rouge1"] = 38.0  # FedIT − zero-shot = 2 points: the gate is not held
    checks = q.claims(_t2_rows(q, t))
    assert checks[0][1] == "not held"
    assert [v for _, v, _ in checks[1:]] == [
        q.VOID, q.VOID, "report", q.VOID, q.VOID, q.VOID, q.VOID, q.VOID, "report"
    ]  # fmt: skip
    assert all(n for _, _, n in checks)


def test_claim_2a_allows_one_inversion_of_at_most_a_point():
    """FedOA spec §7.1 claim 2: "non-decreasing in λ from 0 to 2 (allow one inversion ≤ 1 point)":
    one step falling half a point keeps it, a second falling step refutes it."""
    from raysim.verdicts import HELD, NOT_HELD

    q = _driver()
    t = _t2_table(q)
    t["fedoa_l2"]["ood_rouge1"] = 39.5  # λ 0.5 → 2 falls 0.5
    assert {x[:2]: v for x, v, _ in q.claims(_t2_rows(q, t))}["2a"] == HELD
    t["fedoa_l0.1"]["ood_rouge1"] = 37.5  # λ 0 → 0.1 falls 0.5 too: two inversions
    assert {x[:2]: v for x, v, _ in q.claims(_t2_rows(q, t))}["2a"] == NOT_HELD


def _by_foundation(q, gaps=(20.0, 20.0, 20.0, 20.0, 20.0), seeds=2):
    """Five foundations of two seeds each: foundation k shifts every OOD score by 4·k (the spread
    between foundations dwarfs the seeds'), FedOA(0.5) − Local-only is 8 + k, and FedIT −
    zero-shot is ``gaps[k]``."""
    out = {}
    for k, gap in enumerate(gaps):
        t = _t2_table(q)
        for row in t.values():
            row["ood_rouge1"] += 4.0 * k
        t["local_only"]["ood_rouge1"] = t["fedoa_l0.5"]["ood_rouge1"] - (8.0 + k)
        t["zero_shot"]["ood_rouge1"] = t["fedit"]["ood_rouge1"] - gap
        out[f"tiny-f{k}"] = _t2_rows(q, t, seeds=seeds)
    return out


def test_fedoa_claims_are_decided_over_foundations_with_the_gate_per_foundation():
    """Issue 62, item 10: per foundation the mean of its seeds, then paired by foundation (n = F,
    t with F − 1 degrees of freedom), the gate per foundation deciding which count."""
    from raysim.verdicts import HELD, INCONCLUSIVE, Paired

    q = _driver()
    by = _by_foundation(q)
    checks = {text[:2]: (v, n) for text, v, n in q.nested_claims(by)}
    assert checks["Sa"][0] == HELD
    assert checks["1a"][0] == HELD and "(n = 5)" in checks["1a"][1]  # five foundations, not ten
    means = q.foundation_means(by)
    expect = Paired.of(
        [r["ood_rouge1"] for r in means["fedoa_l0.5"]],
        [r["ood_rouge1"] for r in means["local_only"]],
        5.0,
    )
    assert f"{expect.low:.2f}, {expect.high:.2f}]" in checks["1a"][1]
    # one foundation fails the gate: the claims stand on the other four (p ≥ 1/16: undecided)
    four = q.nested_claims(_by_foundation(q, gaps=(20.0, 20.0, 2.0, 20.0, 20.0)))
    assert four[0][1] == "held on 4 of 5" and re.search(r"tiny-f2 \+1\.\d\d;", four[0][2])
    assert {t[:2]: v for t, v, _ in four}["1a"] == INCONCLUSIVE
    assert "(n = 4)" in {t[:2]: n for t, _, n in four}["1a"]
    # fewer than two pass: every later claim is void
    void = q.nested_claims(_by_foundation(q, gaps=(20.0, 1.0, 2.0, 3.0, 0.0)))
    assert void[0][1] == "held on 1 of 5"
    assert {v for _, v, _ in void[1:]} == {"void (gate held on 1 of 5 foundations)", "report"}
    with pytest.raises(ValueError, match="2\\+ foundations are needed, got 1"):
        q.nested_claims(dict(list(by.items())[:1]))


def test_fedoa_report_is_written_from_raw_results_alone(tmp_path):
    """``examples/fedoa/report.py`` turns qualitative.py's results.json into RESULTS.md, and a
    second pass over its own output keeps the changed-verdicts block (regenerates it)."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    q = _driver()
    here = Path(__file__).parents[1] / "examples" / "fedoa"
    sys.modules.setdefault("qualitative", q)
    spec = importlib.util.spec_from_file_location("fedoa_report", here / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    base = {"weights_sha256": "ab" * 32, "heldout_exact_match": 0.75, "cpu": "AMD EPYC",
            "cpu_capability": "DEFAULT", "kernels": "portable", "path": "x"}  # fmt: skip
    shape = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    recipe = {
        "steps": 8000,
        "batch_size": 32,
        "lr": 0.003,
        "corpus_size": 40000,
        "families": ["copy"],
        "shape": shape,
        "parameters": 112320,
        "vocab_size": 235,
    }
    results = {"foundations": {
        name: {"foundation": base, "seeds": ["0", "1"], "rows": rows, "wall_s": 60.0,
               "parent_run_id": f"{i}" * 32,
               "pretraining": {**recipe, "init_seed": i, "pretrain_seconds": 60.0 * (i + 1)}}
        for i, (name, rows) in enumerate(_by_foundation(q).items())
    }}  # fmt: skip
    previous = "| 1a. old | inconclusive | x |\n| 2b. old | held | y |"
    text = report.markdown(json.loads(json.dumps(results)), previous)
    assert (
        "| tiny-f4 | 4 | `abababababab` | 0.750 | portable (DEFAULT) | AMD EPYC | 0, 1 "
        "| `444444444444` |" in text
    )
    assert "held on every foundation" in text and "- Later claims:" in text
    assert "112,320 parameters" in text and "1–5 min of wall time" in text
    assert "raysim pretrain tiny-llama --seed 4 --out x" in text
    assert "- 1a: inconclusive → held" in text
    assert report.markdown(results, text) == text
    # a claim void before and void again (another gate, another reason) is not a change
    for f, rows in _by_foundation(q, gaps=(20.0, 1.0, 2.0, 3.0, 0.0)).items():
        results["foundations"][f]["rows"] = rows
    text = report.markdown(results, "| 1a. old | void (gate not held) | x |")
    assert "| void (gate held on 1 of 5 foundations) |" in text
    assert "**So every later claim is void**" in text and "On 4 of 5 foundations" in text
    assert "| tiny-f1 | " in text and "(fails) |" in text  # the per-foundation gate
    assert "- none (a claim void before is void again" in text and "- 1a:" not in text


def test_the_t2_driver_names_its_foundation_and_will_not_mix_two(foundation_dir, tmp_path):
    """A report names the frozen base by its weights' digest (the same code pre-trains another
    foundation on another CPU), and seeds run on different bases are not combined."""
    import json

    q = _driver()
    out, meta = foundation_dir[:2]
    base = q.foundation_used(["seed=0", f"model.path={out}"])
    assert base["weights_sha256"] == meta["weights_sha256"]
    assert base["cpu_capability"] == meta["machine"]["cpu_capability"]
    assert f"weights sha256 `{meta['weights_sha256'][:12]}`" in q.describe_foundation(base)
    dirs = []
    for i, digest in enumerate((meta["weights_sha256"], "0" * 64)):
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "qualitative.json").write_text(json.dumps({"fedit": [{"ood_rouge1": 1.0}]}))
        (d / "meta.json").write_text(json.dumps({
            "seeds": [str(i)], "parent_run_id": None, "wall_s": 1.0, "held_out": None,
            "foundation": {**base, "weights_sha256": digest},
        }))  # fmt: skip
        dirs.append(str(d))
    with pytest.raises(SystemExit, match="different foundations"):
        q.combine(dirs, tmp_path / "combined")
    assert not (tmp_path / "combined").exists()


def test_the_corpus_families_are_a_checked_switch():
    some = generate_foundation_corpus(0, 30, families=["copy", "last_word"])
    assert {e.family for e in some} == {"copy", "last_word"}
    with pytest.raises(ValueError, match="unknown families.*option_in_txt"):
        FoundationConfig(families=["copy", "option_in_txt"])
