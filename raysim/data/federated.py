"""The ``data`` section and ``build_federated_dataset``.

``data`` is a tagged union on ``name``: one config class per source (``DigitsData``, ``HFData``,
``TextTaskData``, ``SyntheticData``, …), each with only the options that apply to it and its own
loading. Sources whose rows are pooled and then split share ``PooledData`` (test fraction,
partition, server data) and its pipeline (``raysim.data.pooled``); those whose inputs are dense or
tokenized text also take ``data.shift``. A new source is one new class here plus its entry in
``SOURCES``. ``DataConfig(name=..., ...)`` and ``DataConfig.model_validate`` build the class that
``name`` picks (``digits`` when it is absent).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

import numpy as np
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from raysim.data.builtin import BUILTIN_LOADERS, RawData
from raysim.data.container import FederatedDataset
from raysim.data.digits_split import DigitsConfig, load_fedbaf_digits, load_fedot_digits
from raysim.data.hf import HFConfig, load_hf
from raysim.data.images import HFImageConfig, load_hf_image
from raysim.data.markov import MarkovConfig, load_markov
from raysim.data.partition import PartitionConfig
from raysim.data.pooled import (
    PARTITION_TAG,
    SPLIT_TAG,
    build_pooled,
    encode_with,
    split_indices,
)
from raysim.data.server import ServerDataConfig
from raysim.data.shifts import ShiftConfig
from raysim.data.synthetic import SyntheticConfig
from raysim.data.text import build_vocab, encode
from raysim.data.text_lm import HFTextLMConfig, load_text_lm
from raysim.data.text_tasks import TextTaskConfig, TextTaskDataset, build_text_task_dataset
from raysim.launch.inputs import FOLDER_BUILDERS, written_as_path
from raysim.schema import StrictModel, closest

__all__ = [
    "PARTITION_TAG",
    "SOURCES",
    "SPLIT_TAG",
    "DataConfig",
    "DataSection",
    "build_federated_dataset",
    "encode_with",
    "split_indices",
]

DEFAULT_SOURCE = "digits"

#: (config key, path, what it is) of a local input a config names (``raysim.launch.inputs``)
Input = tuple[str, str, str]


class _Dispatch(type(StrictModel)):  # type: ignore[misc]
    """``DataConfig(name=..., ...)`` builds the source class ``name`` picks."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is DataConfig:
            if args:
                raise TypeError("DataConfig takes keyword arguments only")
            return section_adapter().validate_python(kwargs)
        return super().__call__(*args, **kwargs)


class DataConfig(StrictModel, metaclass=_Dispatch):
    """The base of every source's config: ``name`` and what the rest of raysim asks of a source.

    A key that belongs to another source fails naming the sources that take it (set to that
    source's default it is dropped, as configs written before the split into classes have it).
    """

    name: str = Field(description="the data source")
    #: why an option of other sources does not apply to this one (key → reason)
    WHY_NOT: ClassVar[dict[str, str]] = {}

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if cls is DataConfig:
            return section_adapter().validate_python(obj, *args, **kwargs)
        return super().model_validate(obj, *args, **kwargs)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The ``data.name`` values this class takes."""
        return get_args(cls.model_fields["name"].annotation)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        own = list(cls.model_fields)
        name = data.get("name", cls.model_fields["name"].default)
        out = dict(data)
        for key, value in data.items():
            if key in own:
                continue
            takers = [n for source in SOURCES if key in source.model_fields for n in source.names()]
            if not takers:
                raise ValueError(_unknown_key(str(key), own, name))
            if _at_default(key, value):
                del out[key]  # another source's option at its default: what dumps once held
                continue
            why = cls.WHY_NOT.get(key)
            raise ValueError(
                f"data.{key} applies only to {_where(takers)}, not to name={name!r}"
                + (f": {why}" if why else "")
            )
        return out

    def build(self, num_clients: int, seed: int) -> Any:
        """The federated dataset of ``num_clients`` clients (``seed``: the run's)."""
        raise NotImplementedError

    def dataset_name(self) -> str:
        return self.name

    def server_data(self) -> ServerDataConfig:
        """``data.server`` where the source takes it, else the default (no server data)."""
        return ServerDataConfig()

    def input_shift(self) -> ShiftConfig:
        """``data.shift`` where the source takes it, else the default (no shift)."""
        return ShiftConfig()

    def partition_label(self) -> str:
        """How the clients' data differ, for run names (`` α=0.3``, `` iid``); empty where the
        source splits its own way."""
        return ""

    def local_inputs(self) -> Iterator[Input]:
        """The local files and folders this source reads (checked before Ray starts)."""
        return iter(())


def _unknown_key(key: str, own: list[str], name: Any) -> str:
    close = closest(key, own)
    hint = f" (did you mean {close!r}?)" if close else ""
    if not close:
        every = sorted({k for source in SOURCES for k in source.model_fields})
        other = closest(key, every)
        if other:
            takers = [n for s in SOURCES if other in s.model_fields for n in s.names()]
            hint = f" (did you mean {other!r}? it applies to {_where(takers)})"
    return f"unknown key {key!r}{hint}; valid keys for name={name!r}: {', '.join(sorted(own))}"


def _where(names: list[str]) -> str:
    return f"name={names[0]!r}" if len(names) == 1 else f"name in {tuple(names)}"


def _at_default(key: str, value: Any) -> bool:
    """Whether ``value`` is the default of another source's option ``key``."""
    field = next(s.model_fields[key] for s in SOURCES if key in s.model_fields)
    try:
        given = TypeAdapter(field.annotation).validate_python(value)
    except ValidationError:
        return False
    return bool(given == field.get_default(call_default_factory=True))


# ------------------------------------------------------------------ sources pooled, then split


class PooledData(DataConfig):
    """A source whose rows are loaded, split train/test and partitioned among the clients."""

    test_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="share of the rows held out for testing where the source has no test split",
    )
    partition: PartitionConfig = Field(
        default_factory=PartitionConfig, description="how the training rows go to the clients"
    )
    server: ServerDataConfig = Field(
        default_factory=ServerDataConfig,
        description="data the server holds (Feddle, Center, FedDF, ...); none by default",
    )

    @model_validator(mode="after")
    def _check_natural(self) -> PooledData:
        if self.partition.kind == "natural" and not self.natural_ids():
            raise ValueError(
                "partition.kind='natural' needs per-sample client ids: name='hf' with "
                "hf.client_column, or name='hf_image' with hf_image.client_column or a LEAF "
                "preset"
            )
        return self

    def load(self, seed: int) -> RawData:
        """The rows before the split (``seed``: the run's, for data noise); here the built-in
        loader of the source's name."""
        return BUILTIN_LOADERS[self.name]()

    def build(self, num_clients: int, seed: int) -> FederatedDataset:
        return build_pooled(self, num_clients, seed)

    def natural_ids(self) -> bool:
        """Whether the rows carry client ids (``partition.kind: natural``)."""
        return False

    def encode_text(self, train: RawData, test: RawData) -> tuple[np.ndarray, np.ndarray, int, int]:
        raise TypeError(f"name={self.name!r} gave text rows but has no tokenizer options")

    def server_data(self) -> ServerDataConfig:
        return self.server

    def partition_label(self) -> str:
        part = self.partition
        return f" α={part.alpha:g}" if part.kind == "dirichlet" else f" {part.kind}"


class ShiftedData(PooledData):
    """A pooled source whose inputs are dense or tokenized text: it takes ``data.shift``."""

    shift: ShiftConfig = Field(
        default_factory=ShiftConfig,
        description="a per-client transform of the inputs (FedOT spec §6.2); none by default",
    )

    @model_validator(mode="after")
    def _check_shift(self) -> ShiftedData:
        if self.shift.kind == "none":
            return self
        if self.token_inputs() != (self.shift.kind == "embedding"):
            raise ValueError(
                "data.shift.kind embedding shifts token embeddings (text data); affine and "
                f"colour shift dense inputs: name={self.name!r} does not take "
                f"{self.shift.kind!r}"
            )
        if self.server != ServerDataConfig():
            raise ValueError("data.shift does not combine with data.server yet")
        return self

    def token_inputs(self) -> bool:
        """Whether the inputs are token ids (text), not dense features."""
        return False

    def input_shift(self) -> ShiftConfig:
        return self.shift


class TokenisedText(DataConfig):
    """Options of a source whose text is tokenized here (listed first among a class's bases)."""

    vocab_size: int = Field(
        5000,
        ge=3,
        description="the word vocabulary's size, pad (0) and unknown (1) included (no tokenizer)",
    )
    max_tokens: int = Field(256, ge=1, description="tokens per sample, truncated or padded")
    tokenizer: str | None = Field(
        None,
        description="text classification: token ids from this Hugging Face tokenizer (a "
        "directory, a hub id, or smollm2), what a pretrained model at model.path reads; None: "
        "raysim's word vocabulary",
    )

    def encode_text(self, train: RawData, test: RawData) -> tuple[np.ndarray, np.ndarray, int, int]:
        if self.tokenizer:
            return encode_with(self.tokenizer, train, test, self.max_tokens)
        vocab = build_vocab(train.x, self.vocab_size)
        x_train, x_test = (encode(d.x, vocab, self.max_tokens) for d in (train, test))
        return x_train, x_test, len(vocab) + 2, 0

    def local_inputs(self) -> Iterator[Input]:
        tok = self.tokenizer
        if tok and tok != "smollm2" and written_as_path(tok):
            yield "data.tokenizer", tok, "a tokenizer folder"


class DigitsData(ShiftedData):
    """sklearn's 8×8 digits; ``data.digits`` picks FedBaF's or FedOT's split of them."""

    name: Literal["digits"] = Field("digits", description="the data source")
    digits: DigitsConfig = Field(
        default_factory=DigitsConfig, description="which split of the digits (FedBaF's, FedOT's)"
    )

    def load(self, seed: int) -> RawData:
        if self.digits.split == "fedbaf":
            return load_fedbaf_digits(self.digits, seed)
        if self.digits.split == "fedot":
            return load_fedot_digits(self.digits, seed)
        return BUILTIN_LOADERS["digits"]()


class Mnist1dData(ShiftedData):
    """MNIST-1D, 40 features a sample."""

    name: Literal["mnist1d"] = Field("mnist1d", description="the data source")


class BBCNewsData(TokenisedText, ShiftedData):
    """BBC News articles in 5 topics (text classification)."""

    name: Literal["bbc_news"] = Field("bbc_news", description="the data source")

    def token_inputs(self) -> bool:
        return True


class HFData(TokenisedText, ShiftedData):
    """Any Hugging Face ``datasets`` source with numeric feature columns or a text column."""

    name: Literal["hf"] = Field("hf", description="the data source")
    hf: HFConfig = Field(
        default_factory=HFConfig, description="the dataset and its columns (path is required)"
    )

    @model_validator(mode="after")
    def _check_hf(self) -> HFData:
        self.hf.check()
        return self

    def load(self, seed: int) -> RawData:
        return load_hf(self.hf)

    def dataset_name(self) -> str:
        return f"hf:{self.hf.path}"

    def natural_ids(self) -> bool:
        return bool(self.hf.client_column)

    def token_inputs(self) -> bool:
        return self.hf.text_column is not None

    def local_inputs(self) -> Iterator[Input]:
        yield from super().local_inputs()
        yield from _source_inputs("data.hf", self.hf)


class HFImageData(ShiftedData):
    """Image sets through ``datasets`` (Feddle spec §5.2), with presets (``raysim.data.images``)."""

    name: Literal["hf_image"] = Field("hf_image", description="the data source")
    hf_image: HFImageConfig = Field(
        default_factory=HFImageConfig, description="the image dataset: a preset, or path"
    )

    @model_validator(mode="after")
    def _check_image(self) -> HFImageData:
        self.hf_image.check()
        return self

    def load(self, seed: int) -> RawData:
        return load_hf_image(self.hf_image)

    def dataset_name(self) -> str:
        return f"hf_image:{self.hf_image.preset or self.hf_image.path}"

    def natural_ids(self) -> bool:
        return bool(self.hf_image.client_column)

    def local_inputs(self) -> Iterator[Input]:
        yield from _source_inputs("data.hf_image", self.hf_image)


def _source_inputs(key: str, source: HFConfig | HFImageConfig) -> Iterator[Input]:
    if source.load_from_disk and source.path:
        yield f"{key}.path", source.path, "a dataset saved with save_to_disk"
    elif source.path in FOLDER_BUILDERS and source.data_dir:
        yield f"{key}.data_dir", source.data_dir, f"a folder for {source.path}"


class MarkovData(PooledData):
    """Token sequences from Markov chains (FedBaF spec §8.1's language-model proxy)."""

    name: Literal["markov"] = Field("markov", description="the data source")
    markov: MarkovConfig = Field(
        default_factory=MarkovConfig, description="the two Markov chains and their corpora"
    )
    WHY_NOT: ClassVar[dict[str, str]] = {"shift": "shifts are for inputs of classifiers"}

    def load(self, seed: int) -> RawData:
        return load_markov(self.markov)


class HFLMData(PooledData):
    """A Hugging Face text corpus as language-model windows (WikiText-2, PTB presets)."""

    name: Literal["hf_lm"] = Field("hf_lm", description="the data source")
    hf_lm: HFTextLMConfig = Field(
        default_factory=HFTextLMConfig, description="the corpus: a preset, or path"
    )
    WHY_NOT: ClassVar[dict[str, str]] = MarkovData.WHY_NOT

    @model_validator(mode="after")
    def _check_lm(self) -> HFLMData:
        self.hf_lm.check()
        return self

    def load(self, seed: int) -> RawData:
        return load_text_lm(self.hf_lm)

    def dataset_name(self) -> str:
        return f"hf_lm:{self.hf_lm.preset or self.hf_lm.path}"


# ------------------------------------------------------------------ sources that split themselves


class TextTaskData(DataConfig):
    """The instruction-tuning sets ``flan_mini`` and ``flan`` (fedoa spec §4): clients follow
    leave-one-task-out."""

    name: Literal["flan_mini", "flan"] = Field(
        "flan_mini",
        description="flan_mini: FedOA spec §7.1's 8 generated sub-datasets, offline; flan: the "
        "released Flan files (data.text.data_dir)",
    )
    text: TextTaskConfig = Field(
        default_factory=TextTaskConfig,
        description="the leave-one-out protocol, sizes, template and tokenizer",
    )
    vocab_size: int = Field(5000, ge=3, description="text.tokenizer word: its vocabulary size")
    WHY_NOT: ClassVar[dict[str, str]] = {
        "partition": "clients follow leave-one-task-out (use data.text.shards_per_task)",
        "server": "server-side data is not available for the text tasks yet",
        "tokenizer": "the text tasks' tokenizer is data.text.tokenizer",
        "max_tokens": "the text tasks cut at data.text.cutoff_len",
    }

    @model_validator(mode="after")
    def _check_text(self) -> TextTaskData:
        self.text.check(self.name)
        return self

    def build(self, num_clients: int, seed: int) -> TextTaskDataset:
        """Leave-one-task-out (``num_clients`` must be the number of clients it yields)."""
        return build_text_task_dataset(self.text, self.name, num_clients, seed, self.vocab_size)

    def local_inputs(self) -> Iterator[Input]:
        text = self.text
        if self.name == "flan" and text.data_dir:
            yield "data.text.data_dir", text.data_dir, "Flan's released jsonl files"
        if text.tokenizer not in ("word", "smollm2"):
            yield "data.text.tokenizer", text.tokenizer, "tokenizer"


class SyntheticData(DataConfig):
    """Synthetic(α, β) of FedProx §5.1: each client's rows come from its own generator, made
    when the client is dispatched (``raysim.data.generated``)."""

    name: Literal["synthetic"] = Field("synthetic", description="the data source")
    test_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of each client's samples held out for testing"
    )
    synthetic: SyntheticConfig = Field(
        default_factory=SyntheticConfig, description="Synthetic(α, β)'s generator"
    )
    WHY_NOT: ClassVar[dict[str, str]] = dict.fromkeys(
        ("partition", "server", "shift"),
        "each client's data is its own generator's (data.synthetic sets how they differ)",
    )

    def build(self, num_clients: int, seed: int) -> Any:
        from raysim.data.generated import build_synthetic

        return build_synthetic(self.synthetic, self.test_fraction, num_clients, seed)


# ------------------------------------------------------------------ the union

#: every source's class: a new source is a new class above and its entry here
SOURCES: tuple[type[DataConfig], ...] = (
    DigitsData,
    Mnist1dData,
    BBCNewsData,
    HFData,
    HFImageData,
    TextTaskData,
    MarkovData,
    HFLMData,
    SyntheticData,
)
SOURCE_NAMES: tuple[str, ...] = tuple(n for source in SOURCES for n in source.names())


def _source_name(data: Any) -> Any:
    if isinstance(data, Mapping):
        return data.get("name", DEFAULT_SOURCE)
    return getattr(data, "name", None)


def _known_source(data: Any) -> Any:
    """Fail on an unknown ``data.name`` naming the closest source (before pydantic's union)."""
    if isinstance(data, DataConfig):
        return data
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a mapping of options with a name in {SOURCE_NAMES}")
    name = _source_name(data)
    if name not in SOURCE_NAMES:
        close = closest(str(name), list(SOURCE_NAMES))
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ValueError(
            f"data.name {name!r} is no data source{hint}; sources: {', '.join(SOURCE_NAMES)}"
        )
    return data


#: the ``data`` section's type: the class its ``name`` picks (pydantic puts the name in error
#: locations after ``data``; ``raysim.config`` takes it out again)
DataSection = Annotated[
    Union[tuple(Annotated[s, Tag(n)] for s in SOURCES for n in s.names())],  # noqa: UP007
    Discriminator(_source_name),
    BeforeValidator(_known_source),
]

_ADAPTER: TypeAdapter[Any] | None = None


def section_adapter() -> TypeAdapter[Any]:
    global _ADAPTER
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(DataSection, config=ConfigDict(title="DataConfig"))
    return _ADAPTER


def build_federated_dataset(
    cfg: DataConfig, num_clients: int, seed: int
) -> FederatedDataset | TextTaskDataset:
    """The source's federated dataset: for pooled sources load, split train/test from ``seed``,
    tokenize text, partition train among clients; ``flan_mini``/``flan`` return a
    ``TextTaskDataset`` (leave-one-task-out; ``num_clients`` must equal the number of clients the
    protocol yields); ``synthetic`` a dataset whose clients are made on demand."""
    return cfg.build(num_clients, seed)
