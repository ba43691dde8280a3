"""A PEFT LoRA folder in the format TensorRT-LLM's C++ runtime takes (``lora_weights`` / ``lora_config``).

The layout is the one ``examples/hf_lora_convert.py`` writes (see :mod:`pipeline.lora.rules`):
one row per (layer, module), lora_A [r, in] flattened then ``scale * lora_B`` [out, r] flattened,
rows zero-padded to the longest; ``lora_config`` rows (module id, layer, r). Example, a rank-4
adapter on q_proj and v_proj of a 2-layer model with hidden 64 and 2 KV heads of 16::

    lora_config[0] = [[1, 0, 4], [3, 0, 4], [1, 1, 4], [3, 1, 4]]    # attn_q = 1, attn_v = 3
    lora_weights.shape = (1, 4, 4 * 64 + 64 * 4)                     # q's row is the longest

What the LoRA plugin cannot apply is refused with the file and tensor named: DoRA magnitudes,
embedding updates, ``modules_to_save`` copies and modules outside the decoder's seven projections
(such an adapter can still be served merged: ``serving.lora: merged``).
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from pipeline.checkpoint.hf_reader import open_hf_checkpoint
from pipeline.checkpoint.lora import Adapter, check_adapter_values, check_against_base, open_adapter
from pipeline.errors import InputError
from pipeline.lora.rules import FLOAT16_MAX, HF_TO_TRTLLM, MODULE_IDS, PREFETCH_FILES
from pipeline.plan.adapters import CONFIG_FILE, WEIGHT_FILES, AdapterConfig

_MODULE = re.compile(r"model\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)\.weight")
NP_DTYPES = {"float32": np.float32, "float16": np.float16}  # numpy has no bfloat16


@dataclass(frozen=True)
class RuntimeLora:
    """One adapter in the runtime's format: weights [1, rows, width], config [1, rows, 3] int32."""

    weights: np.ndarray
    config: np.ndarray

    @property
    def max_rank(self) -> int:
        return int(self.config[0, :, 2].max())

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / PREFETCH_FILES[0], self.weights)
        np.save(folder / PREFETCH_FILES[1], self.config)


def target_modules(adapter: Adapter) -> list[str]:
    """TensorRT-LLM module names (``attn_q``, ``mlp_4h_to_h``, ...) this adapter updates, in id order."""
    return sorted({_module(adapter, name)[1] for name in adapter.updates}, key=MODULE_IDS.__getitem__)


def _module(adapter: Adapter, name: str) -> tuple[int, str]:
    update = adapter.updates[name]
    match = _MODULE.fullmatch(name)
    if update.kind != "linear" or match is None or match.group(3) not in HF_TO_TRTLLM:
        raise InputError(
            f"{adapter.where(update.a)}: updates {name}; TensorRT-LLM's LoRA plugin applies adapters to "
            f"the decoder projections only ({', '.join(HF_TO_TRTLLM)}); serve it with serving.lora: merged"
        )
    return int(match.group(1)), HF_TO_TRTLLM[match.group(3)]


def convert_adapter(folder: Path, dtype: str = "float32", base: Path | None = None) -> RuntimeLora:
    """Read a PEFT folder and return it in the runtime format, in ``dtype`` (float32 or float16).

    ``base``: the base model's HF folder; every update must land on a base tensor of its shape (the
    merge's checks: a wrong base shape, a module the base lacks, with the file and tensor named)."""
    adapter = open_adapter(folder)
    try:
        check_adapter_values(adapter)  # NaN or Inf, as the merge refuses them
        if base is not None:
            check_against_base(adapter, open_hf_checkpoint(base))
        return _convert(adapter, dtype)
    finally:
        adapter.close()


def copy_peft_adapter(folder: Path, base: Path | None, out: Path) -> AdapterConfig:
    """Check a PEFT folder as :func:`convert_adapter` does and write it to ``out`` as the LLM API loads
    it (``LoRARequest(lora_path=...)``, PEFT's own layout): ``adapter_config.json`` as given and the
    tensors re-saved as ``adapter_model.safetensors`` (an ``adapter_model.bin`` read safely is never
    handed to a server that would unpickle it)."""
    adapter = open_adapter(folder)
    try:
        check_adapter_values(adapter)
        if base is not None:
            check_against_base(adapter, open_hf_checkpoint(base))
        tensors = {name: adapter.read(name).contiguous() for name in adapter.source.names()}
    finally:
        adapter.close()
    out.mkdir(parents=True)
    shutil.copyfile(folder / CONFIG_FILE, out / CONFIG_FILE)
    save_file(tensors, str(out / WEIGHT_FILES[0]))
    return adapter.config


def _convert(adapter: Adapter, dtype: str) -> RuntimeLora:
    if adapter.replacements:
        tensor = next(iter(adapter.replacements.values()))
        raise InputError(
            f"{adapter.where(tensor)}: a full copy of a base tensor (modules_to_save); the LoRA plugin "
            "cannot apply it; serve this adapter with serving.lora: merged"
        )
    rows: list[tuple[int, int, int, torch.Tensor]] = []  # (layer, module id, r, flat row)
    for name, update in adapter.updates.items():
        if update.magnitude is not None:
            raise InputError(
                f"{adapter.where(update.magnitude)}: DoRA; the TensorRT-LLM 1.2 engine's LoRA plugin applies "
                "plain LoRA only; serve this adapter with serving.lora: merged"
            )
        layer, module = _module(adapter, name)
        a = adapter.read(update.a).float()  # [r, in]
        b = adapter.read(update.b).float() * update.scale  # [out, r]
        limit = FLOAT16_MAX if dtype == "float16" else math.inf
        for tensor, values in ((update.a, a), (update.b, b)):
            if not bool(torch.isfinite(values).all()) or float(values.abs().max()) >= limit:
                raise InputError(
                    f"{adapter.where(tensor)}: scaled by lora_alpha / r it is not finite in {dtype}; the "
                    "adapter cannot be served in this engine's dtype (retrain it, or serve it merged)"
                )
        rows.append((layer, MODULE_IDS[module], update.rank, torch.cat((a.flatten(), b.flatten()))))
    if not rows:
        raise InputError(f"{adapter.weights}: the adapter has no LoRA updates")
    rows.sort(key=lambda row: (row[0], row[1]))
    width = max(row[3].numel() for row in rows)
    weights = torch.zeros(1, len(rows), width)
    for i, (*_, flat) in enumerate(rows):
        weights[0, i, : flat.numel()] = flat
    config = np.array([[[module, layer, rank] for layer, module, rank, _ in rows]], dtype=np.int32)
    return RuntimeLora(weights.numpy().astype(NP_DTYPES[dtype]), config)
