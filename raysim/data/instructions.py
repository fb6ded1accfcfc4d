"""Instruction examples, task families and the prompt template (FedOA spec §4.1, §4.5).

The bottom of the instruction-tuning data layer: every other text-task module (``flan_mini``,
``flan``, ``loto``, ``lm_encoding``, ``foundation_corpus``, ``text_tasks``) builds on these names
and this module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Family = Literal["entailment", "sentiment", "paraphrase", "reading_comprehension"]
FAMILIES: tuple[str, ...] = get_args(Family)
TemplateName = Literal["alpaca_short", "alpaca"]

TASK_FAMILY: dict[str, str] = {
    "entail_d1": "entailment",
    "entail_d2": "entailment",
    "senti_d1": "sentiment",
    "senti_d2": "sentiment",
    "para_d1": "paraphrase",
    "para_d2": "paraphrase",
    "rc_d1": "reading_comprehension",
    "rc_d2": "reading_comprehension",
}
FLAN_MINI_TASKS: tuple[str, ...] = tuple(TASK_FAMILY)


@dataclass(frozen=True)
class TextExample:
    """One instruction/answer pair (FedOA spec §4.1 line format; ``task`` = sub-dataset id)."""

    instruction: str
    output: str
    task: str
    family: str


# --- prompt template (FedOA spec §4.5) --------------------------------------------------------

TEMPLATES: dict[str, str] = {
    "alpaca_short": "### Instruction:\n{instruction}\n\n### Response:\n",
    "alpaca": (
        "Below is an instruction that describes a task. Write a response that appropriately "
        "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
    ),
}


def format_prompt(example_or_instruction: TextExample | str, template: str = "alpaca_short") -> str:
    """The prompt prefix (everything up to and including ``### Response:\\n``), FedOA spec §4.5.

    Training text is this prefix + ``output`` + EOS; generation starts right after it.
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {sorted(TEMPLATES)}")
    instruction = (
        example_or_instruction.instruction
        if isinstance(example_or_instruction, TextExample)
        else example_or_instruction
    )
    return TEMPLATES[template].format(instruction=instruction)
