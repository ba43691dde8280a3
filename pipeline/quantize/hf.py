"""Small Hugging Face folder helpers shared by the quantize stage and the builtin-model preparation.

Nothing here imports torch or transformers, so the planner can use it cheaply.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.errors import InputError

# Files a tokenizer may consist of (any of the fast/slow/sentencepiece layouts), plus chat templates.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: cannot read JSON ({exc}); fix or re-export the file") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def write_json(path: Path, data: dict[str, Any], *, indent: int = 2) -> None:
    path.write_text(json.dumps(data, indent=indent) + "\n")


def add_legacy_rope_keys(config: dict[str, Any]) -> bool:
    """Also write ``rope_theta`` (and ``rope_scaling``) at the top level of an HF config dict.

    transformers 5 keeps RoPE settings only in ``rope_parameters``. Readers built on
    transformers 4 (TensorRT-LLM 1.2's HF loaders, ModelOpt's legacy TRT-LLM exporter, which
    reads ``config.rope_theta``) do not know that key and silently fall back to theta=10000:
    SmolLM2 needs 100000. transformers 5 ignores the legacy keys when ``rope_parameters``
    is present, so writing both is safe. Returns True when the dict changed.
    """
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" not in params:
        return False
    changed = False
    if config.get("rope_theta") != params["rope_theta"]:
        config["rope_theta"] = params["rope_theta"]
        changed = True
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default" and not config.get("rope_scaling"):
        config["rope_scaling"] = {"type": rope_type, **{k: v for k, v in params.items() if k != "rope_theta"}}
        changed = True
    return changed


def fix_config_file(path: Path, **updates: Any) -> None:
    """Apply ``updates`` and the legacy RoPE keys to a saved config.json."""
    config = read_json(path)
    config.update(updates)
    add_legacy_rope_keys(config)
    write_json(path, config)


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy whatever tokenizer files ``src`` has; the HF FP8 export writes none."""
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def make_readable(folder: Path, *, root: bool = True) -> None:
    """Give a finished output folder normal permissions (folders 0755, files 0644).

    tempfile.mkdtemp makes 0700 folders and transformers writes safetensors shards as 0600;
    caches and engine folders are read by other users (a Triton server account, CI).
    Fixed modes rather than the umask: reading the umask means setting it, which races
    with other threads creating files.
    """
    if root:  # only for a folder we created; never chmod a caller's existing folder
        folder.chmod(0o755)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
