"""Text-generation metrics (FedOA spec §4.6): answer extraction and ROUGE-1.

ROUGE-1 is Google's ``rouge_score`` with the Porter stemmer and its default tokenizer
(lower-case, non-alphanumerics dropped); the score is the mean F1 over examples x 100.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

RESPONSE_SPLIT = "### Response:"
EOS_TEXT = "</s>"


@lru_cache(maxsize=1)
def _scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)


def extract_answer(text: str) -> str:
    """The answer in a decoded generation (FedOA spec §4.5): the text after the last
    ``### Response:`` (all of it when absent), cut at ``</s>``, stripped."""
    answer = text.rsplit(RESPONSE_SPLIT, 1)[-1]
    return answer.split(EOS_TEXT, 1)[0].strip()


def rouge1_scores(predictions: list[str], references: list[str]) -> list[float]:
    """Per-example ROUGE-1 F1 in [0, 1] (FedOA spec §4.6)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions vs {len(references)} references")
    scorer = _scorer()
    return [
        float(scorer.score(ref, pred)["rouge1"].fmeasure)
        for pred, ref in zip(predictions, references, strict=True)
    ]


def rouge1(predictions: list[str], references: list[str]) -> float:
    """Mean ROUGE-1 F1 x 100 over examples (FedOA spec §4.6); NaN for an empty list."""
    scores = rouge1_scores(predictions, references)
    return 100.0 * sum(scores) / len(scores) if scores else float("nan")
