"""Federated data layer: offline datasets, train/test split and client partitions.

Everything returned is plain numpy so a single Ray object-store copy serves all workers.
"""

from raysim.data.federated import DataConfig, FederatedDataset, build_federated_dataset
from raysim.data.hf import HFConfig
from raysim.data.partition import PartitionConfig

__all__ = [
    "DataConfig",
    "FederatedDataset",
    "HFConfig",
    "PartitionConfig",
    "build_federated_dataset",
]
