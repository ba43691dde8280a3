"""PEFT LoRA adapters: read a folder, check it against a base checkpoint, compute merged tensors.

A PEFT LoRA folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` (or the
older ``adapter_model.bin``, read only through ``torch.load(weights_only=True)``). Its tensors
are named after the base model's modules with the ``base_model.model.`` prefix PEFT adds:

* ``<module>.lora_A.weight`` (r, in) and ``<module>.lora_B.weight`` (out, r) for a Linear;
  merged as ``W + scale * B @ A`` with ``scale = lora_alpha / r`` (``lora_alpha / sqrt(r)``
  with ``use_rslora``; ``rank_pattern``/``alpha_pattern`` override r/alpha per module),
  exactly as PEFT's ``LoraLayer.get_delta_weight`` does (fp32 matmul, then added to W);
* ``<module>.lora_magnitude_vector`` (out,) for DoRA (Liu et al. 2024, arXiv:2402.09353):
  ``m / ||W + dW||_row * (W + dW)``;
* ``<module>.lora_embedding_A`` (r, vocab) and ``lora_embedding_B`` (hidden, r) for an embedding:
  ``W + scale * (B @ A)^T``;
* ``modules_to_save`` copies (``<module>.weight``) and saved embedding bases
  (``<module>.base_layer.weight``) replace the base tensor; they must have its shape.

Values are checked too, naming the adapter file and tensor: NaN or Inf in any adapter tensor (before
the merge writes a byte), and an update so large that nothing of the base weight survives it (see
:data:`MAX_UPDATE_RATIO`).

Refused, with the file and tensor named: bias training (``lora_bias``, any ``.bias`` tensor;
Llama has no biases to merge them into), ``fan_in_fan_out`` (GPT-2 Conv1D only), PEFT options
whose merge is not a weight update (layer replication, trainable tokens, aLoRA, ...), and
adapters that change the tied embedding of a model with ``tie_word_embeddings``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.checkpoint.hf_reader import HFCheckpoint
from pipeline.checkpoint.safetensors_io import SafetensorsFile, StateDictSource, TensorSource
from pipeline.checkpoint.values import non_finite_row
from pipeline.errors import InputError
from pipeline.plan.adapters import WEIGHT_FILES, AdapterConfig, adapter_folder_problem, read_adapter_config

PREFIX = "base_model.model."
EMBEDDING_BASES = ("model.embed_tokens.weight", "lm_head.weight")
# The largest |update| may be at most this many times the largest |weight| of the tensor it changes.
# Engines hold weights in bfloat16 (the default model.dtype, 8 significant bits): where |dW| > 2**8 * |W|,
# the rounding error of W + dW exceeds W itself, so the merged value has no trace of the base weight left. A
# fine-tune's update is a small fraction of its weight (the shipped adapters' largest update is 0.009
# and 0.018 times its tensor's largest value), so a larger one is a corrupt or foreign adapter.
MAX_UPDATE_RATIO = 2.0**8


@dataclass(frozen=True)
class LoraUpdate:
    """One base tensor's low-rank update from one adapter."""

    base: str  # base tensor name, e.g. model.layers.0.self_attn.q_proj.weight
    kind: str  # "linear" | "embedding"
    a: str
    b: str
    magnitude: str | None  # DoRA
    scale: float
    rank: int


@dataclass
class Adapter:
    folder: Path
    config: AdapterConfig
    weights: Path
    source: TensorSource
    updates: dict[str, LoraUpdate]  # by base tensor name
    replacements: dict[str, str]  # base tensor name -> adapter tensor name (full copies)
    largest_change: tuple[float, str] = (0.0, "")  # max |update| / max |weight| so far, and its base tensor

    def where(self, tensor: str) -> str:
        return f"{self.weights}: tensor {tensor}"

    def read(self, tensor: str) -> torch.Tensor:
        meta = self.source.meta(tensor)
        return self.source.read_rows(tensor, 0, meta.rows).reshape(meta.shape)

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.source.meta(tensor).shape

    def close(self) -> None:
        if isinstance(self.source, SafetensorsFile):
            self.source.close()


def _open_weights(folder: Path) -> tuple[Path, TensorSource]:
    safetensors_path, bin_path = (folder / name for name in WEIGHT_FILES)
    if safetensors_path.is_file():
        return safetensors_path, SafetensorsFile(safetensors_path)
    if bin_path.is_file():
        try:
            state = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as exc:  # unpickling refused or a corrupt file: several unrelated types
            raise InputError(
                f"{bin_path}: cannot be loaded safely ({type(exc).__name__}); only plain tensor "
                "state dicts are accepted (torch.load weights_only=True); re-save it as "
                "adapter_model.safetensors"
            ) from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise InputError(f"{bin_path}: expected a state dict of tensors; re-save it as adapter_model.safetensors")
        return bin_path, StateDictSource(str(bin_path), {str(k): v for k, v in state.items()})
    raise InputError(
        f"{folder}: no adapter_model.safetensors or adapter_model.bin; model.adapter must name a PEFT LoRA folder"
    )


_SUFFIXES = (
    (".lora_A.weight", "linear", "a"),
    (".lora_B.weight", "linear", "b"),
    (".lora_magnitude_vector.weight", "linear", "m"),
    (".lora_magnitude_vector", "linear", "m"),
    (".lora_embedding_A", "embedding", "a"),
    (".lora_embedding_B", "embedding", "b"),
)


def open_adapter(folder: Path) -> Adapter:
    """Read and check an adapter on its own (config, tensor names, ranks); see :func:`check_against_base`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(adapter_folder_problem(folder))
    config = read_adapter_config(folder)
    weights, source = _open_weights(folder)
    parts: dict[str, dict[str, str]] = {}
    kinds: dict[str, str] = {}
    replacements: dict[str, str] = {}
    for name in source.names():
        where = f"{weights}: tensor {name}"
        if not name.startswith(PREFIX):
            raise InputError(
                f"{where}: not a PEFT tensor name (expected the prefix {PREFIX!r}); re-save the adapter "
                "with PEFT's save_pretrained"
            )
        key = name[len(PREFIX) :]
        if key.endswith(".bias"):
            raise InputError(f"{where}: a trained bias; Llama layers have no biases to merge it into")
        for suffix, kind, part in _SUFFIXES:
            if key.endswith(suffix):
                module = key[: -len(suffix)]
                parts.setdefault(module, {})[part] = name
                kinds[module] = kind
                break
        else:
            if ".lora_" in key:
                raise InputError(
                    f"{where}: unknown LoRA tensor kind; only LoRA/DoRA Linear and Embedding updates can be merged"
                )
            base = key.replace(".base_layer.weight", ".weight")
            if not base.endswith(".weight"):
                raise InputError(f"{where}: not a weight; cannot be merged")
            replacements[base] = name
    updates: dict[str, LoraUpdate] = {}
    for module, found in parts.items():
        missing = [p for p in ("a", "b") if p not in found]
        if missing:
            have = next(iter(found.values()))
            raise InputError(
                f"{weights}: tensor {have} has no matching lora_{missing[0].upper()} tensor; the adapter is incomplete"
            )
        if "m" in found and kinds[module] == "embedding":
            raise InputError(f"{weights}: tensor {found['m']}: DoRA on an embedding is not supported")
        if "m" in found and not config.use_dora or config.use_dora and "m" not in found:
            raise InputError(
                f"{weights}: module {module}: use_dora is {config.use_dora} in {config.file} but the "
                f"magnitude vector is {'present' if 'm' in found else 'missing'}"
            )
        rank, _ = config.rank_and_alpha(module)
        a_shape, b_shape = source.meta(found["a"]).shape, source.meta(found["b"]).shape
        if len(a_shape) != 2 or len(b_shape) != 2 or a_shape[0] != rank or b_shape[1] != rank:
            raise InputError(
                f"{weights}: tensor {found['a']} {list(a_shape)} / {found['b']} {list(b_shape)}: "
                f"rank does not match r={rank} of {config.file} (lora_A must be [r, in], "
                "lora_B [out, r])"
            )
        updates[f"{module}.weight"] = LoraUpdate(
            f"{module}.weight", kinds[module], found["a"], found["b"], found.get("m"), config.scale(module), rank
        )
    both = sorted(set(updates) & set(replacements))
    if both and any(not replacements[b].endswith(".base_layer.weight") for b in both):
        raise InputError(f"{weights}: tensor {replacements[both[0]]} is both adapted and replaced (modules_to_save)")
    return Adapter(folder, config, weights, source, updates, replacements)


def check_against_base(adapter: Adapter, base: HFCheckpoint) -> None:
    """Every update and replacement must land on a base tensor of the right shape."""
    names = list(base.tensors)
    if isinstance(adapter.config.target_modules, tuple):
        for target in adapter.config.target_modules:
            if not any(n.endswith(f".{target}.weight") or n == f"{target}.weight" for n in names):
                raise InputError(
                    f"{adapter.config.file}: target module {target!r} is absent from the base model "
                    f"{base.path}; the adapter was trained on another architecture"
                )
    tied = base.spec.tie_word_embeddings
    for name, update in adapter.updates.items():
        where = adapter.where(update.a)
        if name not in base.tensors:
            raise InputError(f"{where}: targets {name}, which the base model {base.path} does not have")
        if tied and name in EMBEDDING_BASES:
            raise InputError(
                f"{where}: updates {name} of a model with tied embeddings (embed_tokens = lm_head); "
                "merging it would change both; retrain without embed_tokens/lm_head"
            )
        shape = base.meta(name).shape
        (_, a_in), (b_out, _) = adapter.shape(update.a), adapter.shape(update.b)
        expected = (b_out, a_in) if update.kind == "linear" else (a_in, b_out)
        if tuple(shape) != expected:
            raise InputError(
                f"{where}: the update has shape {list(expected)} but base tensor {name} is "
                f"{list(shape)}; the adapter was trained on another model"
            )
        if update.magnitude is not None and adapter.shape(update.magnitude) not in ((shape[0],), (1, shape[0])):
            raise InputError(
                f"{adapter.where(update.magnitude)}: shape {list(adapter.shape(update.magnitude))}, "
                f"expected [{shape[0]}] (one magnitude per output row of {name})"
            )
    for name, tensor in adapter.replacements.items():
        where = adapter.where(tensor)
        if name not in base.tensors:
            raise InputError(f"{where}: replaces {name}, which the base model {base.path} does not have")
        if tuple(adapter.shape(tensor)) != tuple(base.meta(name).shape):
            raise InputError(
                f"{where}: shape {list(adapter.shape(tensor))} differs from the base's {name} "
                f"{list(base.meta(name).shape)} (a resized vocabulary?); only same-shape "
                "modules_to_save can be merged"
            )
        if tied and name in EMBEDDING_BASES and not tensor.endswith(".base_layer.weight"):
            raise InputError(f"{where}: replaces {name} of a model with tied embeddings; not supported")


def check_adapter_values(adapter: Adapter) -> None:
    """NaN or Inf in any tensor of ``adapter`` (lora_A/B, magnitudes, saved modules), with file, tensor and row.

    Adapters are small (r x (in + out) per module), so this reads them all before the merge writes."""
    for name in adapter.source.names():
        row = non_finite_row(adapter.source, name)
        if row is not None:
            raise InputError(
                f"{adapter.where(name)} holds NaN or Inf at row {row}; the adapter is corrupt (a diverged "
                "training run?), retrain it or re-save it from a good checkpoint"
            )


def _peak(t: torch.Tensor) -> float:
    """max |t| without a temporary the size of ``t`` (NaN when ``t`` holds one)."""
    if t.numel() == 0:
        return 0.0
    low, high = float(t.min()), float(t.max())
    return math.nan if math.isnan(low) or math.isnan(high) else max(-low, high)


def _check_change(
    adapter: Adapter, name: str, tensors: str, change: float, weight: torch.Tensor, *, update: bool
) -> None:
    """Refuse a change (an update's or a saved module's largest value) that leaves nothing of ``weight``;
    an update's ratio is recorded in ``adapter.largest_change``."""
    base = _peak(weight)
    ratio = change / base if base > 0 else 0.0  # an all-zero base has no scale to compare with
    if update and (ratio > adapter.largest_change[0] or math.isnan(ratio)):
        adapter.largest_change = (ratio, name)
    if math.isnan(ratio) or ratio > MAX_UPDATE_RATIO:
        raise InputError(
            f"{adapter.weights}: {tensors}: the change to {name} reaches {change:.3g}, {ratio:.3g} times the "
            f"base tensor's largest value {base:.3g} (the limit is {MAX_UPDATE_RATIO:g}x: beyond it no trace of "
            "the base weight survives bfloat16's rounding); the adapter is corrupt or was trained on another model"
        )


def _require_finite_result(adapter: Adapter, name: str, tensors: str, merged: torch.Tensor) -> None:
    if math.isfinite(float(merged.sum())):
        return
    flat = merged.reshape(merged.shape[0], -1) if merged.dim() > 1 else merged.reshape(-1, 1)
    bad = (~torch.isfinite(flat)).any(dim=1).nonzero()
    if len(bad):
        dtype = str(merged.dtype).removeprefix("torch.")
        raise InputError(
            f"{adapter.weights}: {tensors}: merged into {name}, it overflows {dtype} at row {int(bad[0, 0])}; "
            "the adapter is corrupt or was trained on another model"
        )


def apply_adapter(weight: torch.Tensor, adapter: Adapter, name: str) -> torch.Tensor:
    """``weight`` (the base tensor, or the previous adapters' result) with this adapter's change to ``name``.

    The arithmetic is PEFT's merge (LoraLayer.merge with adapters upcast to float32, PEFT's default):
    the update is computed in float32 and added to the weight in the weight's own dtype. A change
    larger than :data:`MAX_UPDATE_RATIO` times the weight, or a result that overflows its dtype, is
    refused naming the adapter file and tensors (``weight`` must be finite; the adapter's tensors are
    checked by :func:`check_adapter_values`)."""
    if name in adapter.replacements:  # modules_to_save, or a saved embedding base under its update
        saved = adapter.replacements[name]
        replacement = adapter.read(saved).to(weight.dtype)
        _check_change(adapter, name, f"tensor {saved}", _peak(replacement), weight, update=False)
        _require_finite_result(adapter, name, f"tensor {saved}", replacement)
        weight = replacement
    update = adapter.updates.get(name)
    if update is None:
        return weight
    tensors = f"tensors {update.a} / {update.b}"
    a, b = adapter.read(update.a).float(), adapter.read(update.b).float()
    delta = (b @ a) * update.scale
    if update.kind == "embedding":
        delta = delta.T
    _check_change(adapter, name, tensors, _peak(delta), weight, update=True)
    if update.magnitude is None:
        merged = weight.clone()
        merged += delta
    else:
        magnitude = adapter.read(update.magnitude).float().reshape(-1, 1)
        combined = weight.float() + delta
        norm = torch.linalg.norm(combined, dim=1, keepdim=True)
        merged = (magnitude / norm * combined).to(weight.dtype)
    _require_finite_result(adapter, name, tensors, merged)
    return merged
