"""Tasks: how to index a client's data into batches and compute the training loss."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Task(Protocol):
    """What the local training loop needs to know about the data (``ClientContext.task``):
    ``ClassificationTask`` for ``(inputs, targets)``, ``CausalLMTask`` for token tensors."""

    def num_examples(self, data: Any) -> int:
        """How many examples ``data`` holds."""

    def batch(self, data: Any, index: torch.Tensor) -> Any:
        """The examples ``index`` of ``data``, as ``loss`` takes them."""

    def loss(self, module: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The mean training loss of ``module`` on ``batch`` (a scalar to differentiate)."""


class ClassificationTask:
    """``data = (inputs, targets)``; cross-entropy on the module's logits."""

    def __init__(self) -> None:
        self._ce = torch.nn.CrossEntropyLoss()

    def num_examples(self, data: tuple[torch.Tensor, torch.Tensor]) -> int:
        return len(data[1])

    def batch(self, data, index):
        return data[0][index], data[1][index]

    def loss(self, module, batch):
        return self._ce(module(batch[0]), batch[1])


def mask_absent(logits: torch.Tensor, present: torch.Tensor, mode: str) -> torch.Tensor:
    """Logits of classes the client lacks set to 0 (``zero``, §4.2's literal reading) or −inf
    (``neg_inf``); ``present`` holds the class ids it has."""
    absent = torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device)
    absent[present.to(logits.device)] = False
    shape = (1, -1) + (1,) * (logits.ndim - 2)
    fill = 0.0 if mode == "zero" else float("-inf")
    return logits.masked_fill(absent.view(shape), fill)


class AbsentClassTask(ClassificationTask):
    """Classification whose loss sees the absent classes' logits masked (FedBaF spec §4.2)."""

    def __init__(self, present: torch.Tensor, mode: str) -> None:
        super().__init__()
        self.present, self.mode = present, mode

    def loss(self, module, batch):
        return self._ce(mask_absent(module(batch[0]), self.present, self.mode), batch[1])


class CausalLMTask:
    """``data`` = dict of equal-length tensors ``input_ids``, ``attention_mask``, ``labels``
    (-100 where no loss); the loss is the model's token-mean cross-entropy on labelled tokens."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = device

    def num_examples(self, data: dict[str, torch.Tensor]) -> int:
        return len(data["input_ids"])

    def batch(self, data, index):
        """Rows ``index``, trimmed to the longest real row (right padding) and moved to device."""
        rows = {k: v[index] for k, v in data.items()}
        length = int(rows["attention_mask"].sum(1).max())
        return {k: v[:, :length].to(self.device or v.device) for k, v in rows.items()}

    def loss(self, module, batch):
        return module(**batch).loss


def task_for(spec: Any, device: torch.device | None = None) -> Task:
    """The task implied by a ``DataSpec``: causal LM for ``input_kind='causal_lm'``, else
    classification."""
    return CausalLMTask(device) if spec.input_kind == "causal_lm" else ClassificationTask()
