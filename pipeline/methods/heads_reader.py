"""What the planner learns from heads folders without loading any weights.

Only safetensors headers and small config files are read here, so ``plan`` stays fast
on a 70B checkpoint. Head counts come from tensor names, never from the head config:
FasterDecoding's own Medusa config says 2 heads for a checkpoint that has 4.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from pipeline.errors import InputError
from pipeline.io.files import read_json, require_regular_file

_FASTERDECODING_KEY = re.compile(r"^(\d+)\.(\d+)\.(?:linear\.)?weight$")
_MODELOPT_KEY = re.compile(r"^medusa_heads\.(\d+)\.(\d+)\.(?:linear\.)?weight$")


@dataclass(frozen=True)
class MedusaLayout:
    format: str  # "fasterdecoding" | "modelopt"
    num_heads: int
    num_layers: int
    config_num_heads: int | None  # what the head config claims, for the mismatch warning


@dataclass(frozen=True)
class EagleLayout:
    num_layers: int
    has_fc_bias: bool
    hidden_size: int | None


def safetensors_keys(path: Path) -> list[str]:
    require_regular_file(path, "safetensors file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except Exception as exc:  # safetensors raises several unrelated types for bad files
        raise InputError(f"{path}: not a readable safetensors file ({exc}); re-download or re-export it") from None


def _pickle_keys(path: Path) -> list[str]:
    import torch

    require_regular_file(path, "weights file")
    try:
        state = torch.load(path, map_location="meta", weights_only=True)
    except Exception as exc:
        raise InputError(
            f"{path}: cannot be loaded safely ({type(exc).__name__}); only plain tensor state dicts are "
            "accepted (torch.load weights_only=True) — convert it to safetensors"
        ) from None
    if not isinstance(state, dict):
        raise InputError(f"{path}: expected a state dict of tensors, found {type(state).__name__}")
    return list(state)


def _read_json(path: Path) -> dict:
    data = read_json(path, "config")
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def model_weight_files(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("*.safetensors"))


def inspect_medusa(head_dir: Path) -> MedusaLayout:
    if not head_dir.is_dir():
        raise InputError(f"{head_dir}: Medusa head folder not found")
    config_file = head_dir / "config.json"
    config = _read_json(config_file) if config_file.exists() else {}
    compact = (config.get("specdeploy") or {}).get("weights")
    if compact:
        # specdeploy's shipped heads: trained ResBlocks only, every head's lm_head is the base
        # model's (pipeline/heads/expand.py writes the FasterDecoding folder at convert time).
        keys = safetensors_keys(head_dir / compact)
        layout = _layout_from_keys(keys, _FASTERDECODING_KEY, "specdeploy-compact", head_dir, has_lm_head=False)
        return MedusaLayout(layout[0], layout[1], layout[2], config.get("medusa_num_heads"))
    for name in ("medusa_lm_head.safetensors", "medusa_lm_head.pt"):
        weights = head_dir / name
        if weights.exists():
            keys = safetensors_keys(weights) if name.endswith(".safetensors") else _pickle_keys(weights)
            layout = _layout_from_keys(keys, _FASTERDECODING_KEY, "fasterdecoding", weights)
            return MedusaLayout(layout[0], layout[1], layout[2], config.get("medusa_num_heads"))
    files = model_weight_files(head_dir)
    if files and "medusa" in config:
        keys = [key for file in files for key in safetensors_keys(file)]
        layout = _layout_from_keys(keys, _MODELOPT_KEY, "modelopt", head_dir)
        return MedusaLayout(layout[0], layout[1], layout[2], config["medusa"].get("num_medusa_heads"))
    raise InputError(
        f"{head_dir}: no Medusa heads found; expected medusa_lm_head.safetensors / medusa_lm_head.pt "
        "(FasterDecoding layout) or a ModelOpt checkpoint with 'medusa' in config.json"
    )


def _layout_from_keys(
    keys: list[str], pattern: re.Pattern, fmt: str, where: Path, has_lm_head: bool = True
) -> tuple[str, int, int]:
    per_head: dict[int, set[int]] = {}
    for key in keys:
        match = pattern.match(key)
        if match:
            per_head.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    if not per_head:
        raise InputError(f"{where}: no Medusa head tensors (like '0.0.linear.weight') found")
    heads = sorted(per_head)
    if heads != list(range(len(heads))):
        raise InputError(f"{where}: Medusa heads are not numbered 0..{len(heads) - 1} (found {heads})")
    # Each head has num_layers ResBlocks (0..L-1) and its lm_head at index L.
    depths = {len(indices) - has_lm_head for indices in per_head.values()}
    if len(depths) != 1 or min(depths) < 1:
        raise InputError(f"{where}: Medusa heads have different or missing ResBlock layers ({per_head})")
    return fmt, len(heads), depths.pop()


def inspect_eagle(head_dir: Path) -> EagleLayout:
    if not head_dir.is_dir():
        raise InputError(f"{head_dir}: EAGLE head folder not found")
    config_file = head_dir / "config.json"
    if not config_file.exists():
        raise InputError(f"{config_file}: not found; an EAGLE-1 folder needs the drafter's LlamaConfig")
    config = _read_json(config_file)
    safetensors_files = model_weight_files(head_dir)
    if safetensors_files:
        keys = [key for file in safetensors_files for key in safetensors_keys(file)]
    elif (head_dir / "pytorch_model.bin").exists():
        keys = _pickle_keys(head_dir / "pytorch_model.bin")
    else:
        raise InputError(f"{head_dir}: no EAGLE weights (model.safetensors or pytorch_model.bin)")
    if "fc.weight" not in keys:
        raise InputError(
            f"{head_dir}: tensor 'fc.weight' missing; this is not an EAGLE-1 checkpoint "
            "(EAGLE-3 drafters are not supported by the TensorRT engine flow)"
        )
    layers = {int(m.group(1)) for key in keys if (m := re.match(r"^layers\.(\d+)\.", key))}
    return EagleLayout(len(layers), "fc.bias" in keys, config.get("hidden_size"))


# specdeploy's compact Medusa folder (ResBlocks only; pipeline/heads/export.py writes it, the convert
# stage expands it): its config.json says so.
MEDUSA_FORMAT = "specdeploy-medusa-resblocks"


def is_compact_medusa(heads_dir: Path) -> bool:
    """A shipped ResBlocks-only folder (needs expansion before the converter can read it)."""
    try:
        config = read_json(Path(heads_dir) / "config.json", "Medusa head config")  # regular files only
    except InputError:
        return False
    return isinstance(config, dict) and (config.get("specdeploy") or {}).get("format") == MEDUSA_FORMAT
