"""Shipped head folders (``heads/``): what was trained, small, with a sha256 manifest.

* Medusa (``heads/smollm2-medusa``), format ``specdeploy-medusa-resblocks``:
  ``medusa_resblocks.safetensors`` (float32, FasterDecoding names ``{h}.{l}.linear.weight|bias``
  without the lm_heads), ``config.json`` (``medusa_num_heads``, ``medusa_num_layers`` and a
  ``specdeploy`` block saying the lm_heads are the base lm_head), ``manifest.json``, README.md.
  :func:`pipeline.heads.expand.expand_medusa` turns it into the standard FasterDecoding folder.
* EAGLE-1 (``heads/smollm2-eagle``): directly the layout TensorRT-LLM's
  ``examples/eagle/convert_checkpoint.py`` reads: ``config.json`` (drafter LlamaConfig) +
  ``model.safetensors`` (float16: ``fc.weight`` [H, 2H], ``fc.bias``, ``layers.0.*`` without
  input_layernorm; no ``embed_tokens.weight``: the base embedding is used), manifest, README.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from pipeline.embedded import sha256_file
from pipeline.geometry import ModelGeometry
from pipeline.heads.eagle import EagleDrafter, drafter_llama_config
from pipeline.heads.medusa import MedusaResBlocks
from pipeline.methods.heads_reader import MEDUSA_FORMAT

MEDUSA_RESBLOCKS = "medusa_resblocks.safetensors"
MANIFEST = "manifest.json"
MAX_ARTIFACT_BYTES = 20 * 1024 * 1024


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def file_entries(folder: Path, names: list[str]) -> dict[str, dict]:
    return {name: {"bytes": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)} for name in names}


def write_manifest(folder: Path, names: list[str], info: dict) -> dict:
    manifest = {"files": file_entries(folder, names), **info}
    write_json(folder / MANIFEST, manifest)
    return manifest


def medusa_config(blocks: MedusaResBlocks, hidden_size: int, vocab_size: int, base_model: str) -> dict:
    return {
        "medusa_num_heads": blocks.num_heads,
        "medusa_num_layers": blocks.num_layers,
        "hidden_size": hidden_size,
        "vocab_size": vocab_size,
        "specdeploy": {
            "format": MEDUSA_FORMAT,
            "weights": MEDUSA_RESBLOCKS,
            "lm_head": "base",  # every head's lm_head = the base model's lm_head (tied to its embedding)
            "base_model": base_model,
            "feature": "base last hidden state after the final norm",
            "targets": "head i predicts token t+2+i",
        },
    }


def export_medusa(
    blocks: MedusaResBlocks, out: Path, *, hidden_size: int, vocab_size: int, base_model: str, info: dict, readme: str
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.float().contiguous() for k, v in blocks.fasterdecoding_state().items()}
    save_file(state, str(out / MEDUSA_RESBLOCKS), metadata={"format": "pt"})
    write_json(out / "config.json", medusa_config(blocks, hidden_size, vocab_size, base_model))
    (out / "README.md").write_text(readme)
    return write_manifest(out, ["config.json", MEDUSA_RESBLOCKS, "README.md"], info)


def export_eagle(
    drafter: EagleDrafter, out: Path, *, info: dict, readme: str, dtype: torch.dtype = torch.float16
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    save_file(drafter.export_state(dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    name = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
    write_json(out / "config.json", drafter_llama_config(drafter.config, name))
    (out / "README.md").write_text(readme)
    return write_manifest(out, ["config.json", "model.safetensors", "README.md"], info)


def verify_manifest(folder: Path) -> list[str]:
    """Problems with a shipped folder: missing/changed files, files over the size limit."""
    problems = []
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        return [f"{folder / MANIFEST}: {exc}"]
    for name, entry in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            problems.append(f"{path}: does not match the manifest sha256")
        if path.stat().st_size > MAX_ARTIFACT_BYTES:
            problems.append(f"{path}: {path.stat().st_size} bytes, over the 20 MiB limit")
    return problems


def load_medusa_folder(folder: Path) -> MedusaResBlocks:
    """The shipped ResBlocks (``export_medusa``'s folder) as a float32 module (evaluation, bench)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    blocks = MedusaResBlocks(cfg["hidden_size"], cfg["medusa_num_heads"], cfg["medusa_num_layers"])
    blocks.load_fasterdecoding_state(load_file(str(folder / MEDUSA_RESBLOCKS)))
    return blocks.eval()


def load_eagle_folder(folder: Path) -> EagleDrafter:
    """The shipped drafter as a float32 module (evaluation, tests)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    drafter = EagleDrafter(ModelGeometry.from_hf(cfg, str(folder / "config.json"), require_architecture=False))
    drafter.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
    return drafter.eval()
