"""Federated data layer: offline datasets, train/test split and client partitions.

Everything returned is plain numpy so a single Ray object-store copy serves all workers.
"""

from raysim.data.container import FederatedDataset, LabelledSet
from raysim.data.federated import DataConfig, build_federated_dataset
from raysim.data.flan import load_flan
from raysim.data.hf import HFConfig
from raysim.data.partition import PartitionConfig
from raysim.data.text_tasks import (
    FAMILIES,
    TASK_FAMILY,
    TEMPLATES,
    EvalSet,
    LOTOSplit,
    TextExample,
    TextTaskConfig,
    TextTaskDataset,
    build_text_task_dataset,
    encode_for_training,
    encode_prompts,
    format_prompt,
    generate_flan_mini,
    leave_one_task_out,
)
from raysim.data.tokenizer import build_word_tokenizer, load_tokenizer

__all__ = [
    "FAMILIES",
    "TASK_FAMILY",
    "TEMPLATES",
    "DataConfig",
    "EvalSet",
    "FederatedDataset",
    "LabelledSet",
    "HFConfig",
    "LOTOSplit",
    "PartitionConfig",
    "TextExample",
    "TextTaskConfig",
    "TextTaskDataset",
    "build_federated_dataset",
    "build_text_task_dataset",
    "build_word_tokenizer",
    "encode_for_training",
    "encode_prompts",
    "format_prompt",
    "generate_flan_mini",
    "leave_one_task_out",
    "load_flan",
    "load_tokenizer",
]
