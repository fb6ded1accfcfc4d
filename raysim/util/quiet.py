"""Keep the console to raysim's own progress and warnings: the chatter of the libraries it
drives (transformers' per-load progress bars, their deprecation warnings, DeepSpeed's accelerator
probe) is switched off in every raysim process, before those libraries are imported."""

from __future__ import annotations

import os
import sys
import warnings

#: the start of torch's warning when ``vmap`` has no batching rule for an operator
VMAP_FALLBACK = "There is a performance drop because we have not yet implemented the batching rule"


def quiet_libraries() -> None:
    """Call at the start of a raysim process (driver, coordinator, worker); idempotent."""
    # transformers reads this at import for its own bars ("Loading weights", GGUF conversion)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if not (_is_terminal(sys.stdout) and _is_terminal(sys.stderr)):
        # the driver prints the workers' lines behind a coloured "(Worker pid=…)" prefix; a
        # console that is a file or a pipe gets them without colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    for module in ("transformers", "peft"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
    # torch's note that vmap runs CPU attention in a loop (batched clients of a Transformer): a
    # remark on torch's own internals that no user can act on
    warnings.filterwarnings("ignore", message=VMAP_FALLBACK, category=UserWarning)
    torch = sys.modules.get("torch")  # not imported here: a driver may never need it
    if "DS_ACCELERATOR" not in os.environ and torch is not None and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"  # DeepSpeed warns when it probes and finds no GPU


def _is_terminal(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # None, or a closed stream
        return False
