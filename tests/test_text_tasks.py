"""Tests for the instruction-tuning data layer (fedoa spec §4.1-4.6, §6.3 I15/I16, §7.1)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json  # noqa: E402
import pickle  # noqa: E402
import re  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from raysim.data import (  # noqa: E402
    FAMILIES,
    TASK_FAMILY,
    DataConfig,
    PartitionConfig,
    TextExample,
    TextTaskConfig,
    TextTaskDataset,
    build_federated_dataset,
    build_word_tokenizer,
    encode_for_training,
    encode_prompts,
    format_prompt,
    generate_flan_mini,
    leave_one_task_out,
    load_flan,
    load_tokenizer,
)
from raysim.data.text_tasks import TEMPLATES, word_pools  # noqa: E402
from raysim.training.text_metrics import extract_answer, rouge1, rouge1_scores  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tasks() -> dict[str, dict[str, list[TextExample]]]:
    return generate_flan_mini(seed=5, n_train=60, n_test=20)


def _options(instruction: str) -> list[str]:
    block = instruction.rsplit("OPTIONS:\n", 1)[1]
    return [line[2:] for line in block.split("\n")]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text)


# ---------------------------------------------------------------- synthetic Flan-mini


def test_generator_deterministic_and_seeded(tasks) -> None:
    again = generate_flan_mini(seed=5, n_train=60, n_test=20)
    assert again == tasks
    other = generate_flan_mini(seed=6, n_train=60, n_test=20)
    assert other["entail_d1"]["train"] != tasks["entail_d1"]["train"]
    assert list(tasks) == list(TASK_FAMILY) and len(tasks) == 8
    for task, splits in tasks.items():
        assert len(splits["train"]) == 60 and len(splits["test"]) == 20
        train = {e.instruction for e in splits["train"]}
        test = {e.instruction for e in splits["test"]}
        assert len(train) == 60 and len(test) == 20 and not train & test
        assert {e.task for e in splits["train"] + splits["test"]} == {task}
        assert {e.family for e in splits["train"]} == {TASK_FAMILY[task]}
    # every split has its own stream: a smaller n_train gives a prefix of the same split
    small = generate_flan_mini(seed=5, n_train=3, n_test=20)
    assert small["senti_d1"]["train"] == tasks["senti_d1"]["train"][:3]


def test_answers_are_options_and_follow_the_rules(tasks) -> None:
    pools = word_pools(5)
    for task, splits in tasks.items():
        for ex in splits["train"] + splits["test"]:
            opts = _options(ex.instruction)
            assert ex.output in opts, (task, ex)
            assert len(ex.instruction.split()) < 60
            body = ex.instruction.rsplit("OPTIONS:", 1)[0]
            lines = [ln for ln in body.split("\n") if ln]
            if task == "para_d2":
                a, b = (set(_words(ln.split(":")[-1])) for ln in lines[-3:-1])
                assert ex.output == str(len(a & b)) and opts == list("012345")
            elif task == "para_d1":
                a, b = (sorted(_words(ln.split(":", 1)[1])) for ln in lines[:2])
                assert ex.output == ("yes" if a == b else "no")
            elif task == "rc_d2":
                counts = Counter(_words(lines[-2]) if len(lines) > 1 else [])
                assert len(opts) == 6 and counts[ex.output] == 2
            elif task == "rc_d1":
                facts = dict(re.findall(r"(\w+) is (\w+)\.", body))
                subject = re.search(r"what is (\w+)\?|(\w+) is what\?", body)
                assert len(opts) == 4 and facts[subject[1] or subject[2]] == ex.output
            elif task.startswith("senti"):
                pool = pools[task[-2:]]
                words = _words(body)
                pos = sum(w in pool.positive for w in words)
                neg = sum(w in pool.negative for w in words)
                assert ex.output == ("positive" if pos > neg else "negative")
            elif task.startswith("entail"):
                field = {ln.split(":")[0]: set(_words(ln.split(":", 1)[-1])) for ln in lines}
                if task == "entail_d1":
                    premise, hyp = field["Premise"], field["Hypothesis"]
                elif "Claim" in field:
                    premise, hyp = field["Text"], field["Claim"]
                else:
                    premise, hyp = set(_words(lines[0])), set(_words(body.split('"')[1]))
                yes, maybe, no = opts
                want = yes if hyp <= premise else no if not hyp & premise else maybe
                assert ex.output == want and len(hyp) == (2 if task == "entail_d1" else 3)
    # different option capitalization across the two entailment domains
    assert _options(tasks["entail_d1"]["train"][0].instruction)[0] == "yes"
    assert _options(tasks["entail_d2"]["train"][0].instruction)[0] == "Yes"
    counts = Counter(e.output for e in tasks["entail_d2"]["train"])
    assert set(counts) == {"Yes", "It's impossible to say", "No"}


def test_domains_have_disjoint_content_words(tasks) -> None:
    from rouge_score.tokenizers import DefaultTokenizer

    pools = word_pools(5)
    d1, d2 = pools["d1"].words(), pools["d2"].words()
    assert len(d1) == len(d2) == 52 and not d1 & d2
    templates = " ".join(TEMPLATES.values()).lower()
    assert not (d1 | d2) & set(_words(templates))
    stemmed = DefaultTokenizer(use_stemmer=True).tokenize(" ".join(sorted(d1 | d2)))
    assert stemmed == sorted(d1 | d2)  # ROUGE's stemmer never merges two pseudo-words
    for task, splits in tasks.items():
        own, other = (d1, d2) if task.endswith("d1") else (d2, d1)
        for ex in splits["train"]:
            words = set(_words(ex.instruction + " " + ex.output))
            assert words & own and not words & other, (task, ex)
    wording = {t: {e.instruction.split("\n")[0].split(":")[0] for e in s["train"]}
               for t, s in tasks.items()}  # fmt: skip
    assert wording["senti_d1"] != wording["senti_d2"]


# ---------------------------------------------------------------- leave-one-task-out (I15)


def test_leave_one_task_out_i15(tasks) -> None:
    seen_held_out = []
    for held_out in FAMILIES:
        split = leave_one_task_out(tasks, held_out)
        held_tasks = {t for t, f in TASK_FAMILY.items() if f == held_out}
        assert len(split.clients) == 6 and len(split.client_tasks) == 6
        assert not held_tasks & set(split.client_tasks)
        assert all(e.family != held_out for c in split.clients for e in c)
        assert [len(c) for c in split.clients] == [60] * 6
        assert len(split.ood_test) == 2 * 20
        assert {e.task for e in split.ood_test} == held_tasks
        assert len(split.id_test) == 6 and sum(map(len, split.id_test)) == 6 * 20
        for task, client, id_test in zip(
            split.client_tasks, split.clients, split.id_test, strict=True
        ):
            assert client == tasks[task]["train"] and id_test == tasks[task]["test"]
        seen_held_out.append({TASK_FAMILY[t] for t in held_tasks})
    assert sorted(f.pop() for f in seen_held_out) == sorted(FAMILIES)


def test_shards_per_task_are_disjoint_equal(tasks) -> None:
    split = leave_one_task_out(tasks, "reading_comprehension", shards_per_task=5, seed=1)
    assert len(split.clients) == 30 and [len(c) for c in split.clients] == [12] * 30
    for task in set(split.client_tasks):
        shards = [c for c, t in zip(split.clients, split.client_tasks, strict=True) if t == task]
        union = [e.instruction for s in shards for e in s]
        assert len(shards) == 5 and len(set(union)) == 60
        assert set(union) == {e.instruction for e in tasks[task]["train"]}
        assert shards[0] != tasks[task]["train"][:12]  # shuffled, not contiguous
    again = leave_one_task_out(tasks, "reading_comprehension", shards_per_task=5, seed=1)
    assert again.clients == split.clients


def test_leave_one_task_out_errors(tasks) -> None:
    with pytest.raises(ValueError, match="held_out must be one of"):
        leave_one_task_out(tasks, "rc")
    with pytest.raises(ValueError, match="shards"):
        leave_one_task_out(tasks, "sentiment", shards_per_task=61)


# ---------------------------------------------------------------- tokenizer and encoding


def test_word_tokenizer_ids_and_decode(tmp_path) -> None:
    tok = build_word_tokenizer(["b b a c c c", "c, d"])
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == (
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    )
    vocab = tok.get_vocab()
    assert [vocab[w] for w in ["c", "b", ",", "a", "d"]] == [4, 5, 6, 7, 8]  # freq, then alpha
    assert len(tok) == 9
    ids = tok("c zz, b</s>", add_special_tokens=False)["input_ids"]
    assert ids == [4, 3, 6, 5, 2]
    assert tok("a")["input_ids"] == [1, 7]  # BOS prepended with special tokens
    assert tok.decode([1, 4, 6, 5, 2, 0]) == "<s> c , b </s> <pad>"
    assert tok.decode([1, 4, 6, 5, 2, 0], skip_special_tokens=True) == "c , b"
    small = build_word_tokenizer(["b b a c c c"], vocab_size=6)
    assert len(small) == 6 and small("a")["input_ids"] == [1, 3]
    with pytest.raises(ValueError, match="vocab_size"):
        build_word_tokenizer(["a"], vocab_size=4)
    tok.save_pretrained(str(tmp_path / "tok"))
    loaded = load_tokenizer(str(tmp_path / "tok"))
    assert loaded("c zz, b", add_special_tokens=False)["input_ids"] == [4, 3, 6, 5]
    assert loaded.pad_token_id == 0 and loaded.eos_token_id == 2 and len(loaded) == 9


def test_format_prompt_template() -> None:
    ex = TextExample("Say hi.\nOPTIONS:\n- hi\n- yo", "hi", "t", "sentiment")
    want = "### Instruction:\nSay hi.\nOPTIONS:\n- hi\n- yo\n\n### Response:\n"
    assert format_prompt(ex, "alpaca_short") == format_prompt(ex.instruction) == want
    assert format_prompt("x", "alpaca").startswith("Below is an instruction")
    assert format_prompt("x", "alpaca").endswith("### Instruction:\nx\n\n### Response:\n")
    with pytest.raises(ValueError, match="unknown template"):
        format_prompt(ex, "vicuna")


def _examples() -> list[TextExample]:
    return [
        TextExample("Is a b ?\nOPTIONS:\n- yes\n- no", "yes", "t", "entailment"),
        TextExample("c", "it is not", "t", "entailment"),
    ]


@pytest.mark.parametrize("template", ["alpaca_short", "alpaca"])
def test_encode_for_training_masks_exactly_the_prompt(template: str) -> None:
    exs = _examples()
    tok = build_word_tokenizer([format_prompt(e, template) + e.output for e in exs])
    enc = encode_for_training(tok, exs, template, cutoff_len=128)
    prompts = encode_prompts(tok, exs, template)
    assert set(enc) == {"input_ids", "attention_mask", "labels"}
    assert all(v.dtype == np.int64 for v in enc.values())
    lengths = enc["attention_mask"].sum(axis=1)
    assert enc["input_ids"].shape[1] == lengths.max()  # padded to the longest row only
    for i, ex in enumerate(exs):
        p, n = len(prompts[i]), int(lengths[i])
        row, labels = enc["input_ids"][i], enc["labels"][i]
        assert prompts[i][0] == 1 and 2 not in prompts[i]
        assert row.tolist()[:p] == prompts[i] and row[n - 1] == 2  # BOS ... EOS
        assert (labels[:p] == -100).all()
        assert np.array_equal(labels[p:n], row[p:n])
        assert tok.decode(row[p : n - 1].tolist()) == ex.output
        assert (row[n:] == 0).all() and (labels[n:] == -100).all()
        assert enc["attention_mask"][i].tolist() == [1] * n + [0] * (len(row) - n)
    full = encode_for_training(tok, exs, template, cutoff_len=128, train_on_inputs=True)
    mask = full["attention_mask"] == 1
    assert np.array_equal(full["labels"][mask], full["input_ids"][mask])
    assert (full["labels"][~mask] == -100).all()


def test_encode_truncates_at_cutoff() -> None:
    exs = _examples()
    tok = build_word_tokenizer([format_prompt(e) + e.output for e in exs])
    n_prompt = len(encode_prompts(tok, exs[:1])[0])
    enc = encode_for_training(tok, exs[:1], cutoff_len=n_prompt + 1)
    assert enc["input_ids"].shape == (1, n_prompt + 1)
    assert enc["input_ids"][0, -1] != 2  # no room for EOS: not appended
    assert enc["labels"][0, -1] == tok.convert_tokens_to_ids("yes")
    short = encode_for_training(tok, exs[:1], cutoff_len=5)
    assert short["input_ids"].shape == (1, 5) and (short["labels"] == -100).all()
    exact = encode_for_training(tok, exs[:1], cutoff_len=n_prompt + 2)
    assert exact["input_ids"][0, -1] == 2  # output fits, EOS fits exactly
    empty = encode_for_training(tok, [], cutoff_len=8)
    assert empty["input_ids"].shape == (0, 0)


# ---------------------------------------------------------------- ROUGE-1 (I16)


def test_rouge1_i16() -> None:
    assert rouge1(["it is not possible to tell"], ["it is not possible to tell"]) == 100.0
    assert rouge1(["positive"], ["negative"]) == 0.0
    assert rouge1(["Yes!"], ["yes"]) == 100.0
    assert rouge1(["It's IMPOSSIBLE, to say."], ["it s impossible to say"]) == 100.0
    assert rouge1(["positives"], ["positive"]) == 100.0
    assert rouge1(["yes", "no"], ["yes", "yes"]) == 50.0
    half = rouge1_scores(["a b"], ["a c"])[0]
    assert half == pytest.approx(0.5)
    with pytest.raises(ValueError, match="predictions"):
        rouge1(["a"], [])


def test_extract_answer() -> None:
    text = "### Instruction:\nq\n\n### Response:\n positive </s> junk"
    assert extract_answer(text) == "positive"
    assert extract_answer("no marker here</s>x") == "no marker here"
    assert extract_answer("### Response: a ### Response:\n b") == "b"


# ---------------------------------------------------------------- TextTaskDataset


def _flan_mini(**text) -> DataConfig:
    return DataConfig(name="flan_mini", text=TextTaskConfig(n_train=8, n_test=4, **text))


def test_text_task_dataset_build_pickle_and_tokenizer() -> None:
    ds = build_federated_dataset(_flan_mini(), 6, seed=0)
    assert isinstance(ds, TextTaskDataset) and ds.input_kind == "causal_lm"
    assert ds.num_clients == 6 and ds.client_sizes().tolist() == [8] * 6
    assert ds.client_tasks == [t for t in TASK_FAMILY if not t.startswith("rc_")]
    assert ds.num_classes == ds.vocab_size == len(ds.tokenizer())
    assert sorted(ds.eval_sets) == ["id/0", "id/1", "id/2", "id/3", "id/4", "id/5", "ood"]
    ood = ds.eval_sets["ood"]
    assert ood.client is None and len(ood) == 8 and set(ood.tasks) == {"rc_d1", "rc_d2"}
    assert ds.eval_sets["id/3"].client == 3 and set(ds.eval_sets["id/3"].tasks) == {"senti_d2"}
    assert ood.encoded["input_ids"].shape[0] == len(ood.prompts) == 8
    widths = [c["input_ids"].shape[1] for c in ds.clients] + [len(p) for p in ood.prompts]
    assert ds.feature_shape == (max(widths + [ood.encoded["input_ids"].shape[1]]),)
    x = ds.client_data(2)
    assert set(x) == {"input_ids", "attention_mask", "labels"} and len(x["input_ids"]) == 8
    with pytest.raises(IndexError):
        ds.client_data(6)
    # answer tokens decode to the reference; the OOD answers are known words (no <unk>)
    tok = ds.tokenizer()
    assert (ood.encoded["input_ids"] != tok.unk_token_id).all()
    assert tok.decode(ood.prompts[0][1:]).startswith("### Instruction :")
    labels = ood.encoded["labels"][0]
    answer = tok.decode(labels[(labels != -100)][:-1].tolist())
    assert answer == ood.references[0]
    # pickles as plain data; the rebuilt tokenizer matches
    back = pickle.loads(pickle.dumps(ds))
    assert back.tokenizer_json == ds.tokenizer_json and back.special_ids == ds.special_ids
    for a, b in zip(back.clients, ds.clients, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    t2 = back.tokenizer()
    assert t2.get_vocab() == tok.get_vocab() and t2.pad_token_id == 0 and t2.eos_token_id == 2
    assert back.pad_id == 0 and back.eos_id == 2 and back.bos_id == 1
    assert back.summary()["num_train"] == 48
    json.dumps(back.summary())
    # deterministic in the seed
    again = build_federated_dataset(_flan_mini(), 6, seed=0)
    assert again.tokenizer_json == ds.tokenizer_json
    assert np.array_equal(again.clients[5]["input_ids"], ds.clients[5]["input_ids"])


def test_text_task_dataset_options() -> None:
    ds = build_federated_dataset(
        _flan_mini(held_out="sentiment", shards_per_task=2, eval_id=False, template="alpaca"),
        12,
        seed=1,
    )
    assert ds.num_clients == 12 and ds.client_sizes().tolist() == [4] * 12
    assert "senti_d1" not in ds.client_tasks and list(ds.eval_sets) == ["ood"]
    assert set(ds.eval_sets["ood"].references) <= {"negative", "positive"}
    assert ds.tokenizer().decode(ds.clients[0]["input_ids"][0, 1:3].tolist()) == "Below is"


def test_text_task_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="yields 6 clients"):
        build_federated_dataset(_flan_mini(), 5, seed=0)
    with pytest.raises(ValueError, match="yields 18 clients"):
        build_federated_dataset(_flan_mini(shards_per_task=3), 6, seed=0)
    with pytest.raises(ValidationError, match="held_out"):
        TextTaskConfig(held_out="rc")
    with pytest.raises(ValidationError, match="needs data.text.data_dir"):
        DataConfig(name="flan")
    with pytest.raises(ValidationError, match="only apply to data.name='flan'"):
        DataConfig(name="flan_mini", text={"data_dir": str(tmp_path)})
    with pytest.raises(
        ValidationError, match="data.text applies only to name in \\('flan_mini', 'flan'\\)"
    ):
        DataConfig(name="digits", text={"n_train": 5})
    with pytest.raises(
        ValidationError, match="data.partition applies only to .*leave-one-task-out"
    ):
        DataConfig(name="flan_mini", partition=PartitionConfig(kind="iid"))
    with pytest.raises(ValidationError, match="did you mean 'held_out'"):
        DataConfig.model_validate({"name": "flan_mini", "text": {"heldout": "sentiment"}})


# ---------------------------------------------------------------- released-format Flan files

_FILES = {
    "entailment": ("snli", "anli"),
    "sentiment": ("sst2", "sentiment140"),
    "paraphrase": ("glue_mrpc", "stsb"),
    "reading_comprehension": ("openbook_qa", "record"),
}


def _write_flan(root: Path, n_train: int = 10, n_test: int = 5) -> None:
    for family, names in _FILES.items():
        (root / family).mkdir(parents=True)
        for name in names:
            for split, n in (("train", n_train), ("test", n_test)):
                with open(root / family / f"{name}_{split}.jsonl", "w") as f:
                    for i in range(n):
                        row = {
                            "instruction": f"{name} {split} question {i}?\n\nOPTIONS:\n- x{i}\n- y",
                            "output": f"x{i}",
                            "task": name.replace("_", ""),
                            "category": "read_comp_and_common_sense",
                        }
                        f.write(json.dumps(row) + "\n")


def test_flan_loader_local_files(tmp_path) -> None:
    _write_flan(tmp_path / "data")
    cache = str(tmp_path / "cache")
    tasks = load_flan(tmp_path / "data", seed=0, n_train=6, n_test=3, cache_dir=cache)
    assert sorted(tasks) == sorted(n for ns in _FILES.values() for n in ns)
    for family, names in _FILES.items():
        for name in names:
            train, test = tasks[name]["train"], tasks[name]["test"]
            assert len(train) == 6 and len(test) == 3
            assert {e.family for e in train + test} == {family}  # folder, not category
            idx = [int(e.output[1:]) for e in train]
            assert idx == sorted(idx) and len(set(idx)) == 6 and max(idx) <= 9
            assert all(e.instruction.startswith(f"{name} train") for e in train)
    again = load_flan(tmp_path / "data", seed=0, n_train=6, n_test=3, cache_dir=cache)
    assert again == tasks
    other = load_flan(tmp_path / "data", seed=1, n_train=6, n_test=3, cache_dir=cache)
    assert any(other[n]["train"] != tasks[n]["train"] for n in tasks)
    full = load_flan(tmp_path / "data", seed=0, cache_dir=cache)
    assert len(full["stsb"]["train"]) == 10 and len(full["stsb"]["test"]) == 5

    text = TextTaskConfig(
        data_dir=str(tmp_path / "data"), cache_dir=cache, held_out="paraphrase", n_train=4
    )
    ds = build_federated_dataset(DataConfig(name="flan", text=text), 6, seed=0)
    assert ds.name == "flan" and ds.client_sizes().tolist() == [4] * 6
    assert set(ds.eval_sets["ood"].tasks) == {"glue_mrpc", "stsb"}
    assert len(ds.eval_sets["ood"]) == 10 and "stsb" not in ds.client_tasks


def test_flan_loader_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_flan(tmp_path / "missing", seed=0)
    _write_flan(tmp_path / "data")
    (tmp_path / "data" / "sentiment" / "sst2_test.jsonl").unlink()
    with pytest.raises(ValueError, match="no test file"):
        load_flan(tmp_path / "data", seed=0)
    (tmp_path / "other" / "entailment").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="lacks family folder"):
        load_flan(tmp_path / "other", seed=0)


def test_leave_one_domain_out_split():
    """The held-out domain's sub-datasets never train; one client per family of the other."""
    from raysim.data.text_tasks import leave_one_domain_out, task_domains

    tasks = generate_flan_mini(0, 8, 3)
    domains = task_domains(tasks)
    assert sorted(set(domains.values())) == ["d1", "d2"]
    split = leave_one_domain_out(tasks, "d2")
    assert len(split.clients) == 4 and all(domains[t] == "d1" for t in split.client_tasks)
    assert len(split.ood_test) == 4 * 3
    assert {e.task for e in split.ood_test} == {t for t, d in domains.items() if d == "d2"}
    with pytest.raises(ValueError, match="held_out_domain must be one of"):
        leave_one_domain_out(tasks, "d3")
