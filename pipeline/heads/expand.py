"""Deterministic expansion of shipped Medusa ResBlocks into the standard FasterDecoding folder.

The shipped folder (``heads/smollm2-medusa``, format ``specdeploy-medusa-resblocks``) holds only
the trained ResBlocks (4 MB); every head's lm_head is the base model's lm_head (SmolLM2 ties it
to the embedding), which would add 3 x 113 MB. :func:`expand_medusa` writes::

    out_dir/config.json                   {"medusa_num_heads": N, "medusa_num_layers": L, ...}
    out_dir/medusa_lm_head.safetensors    {h}.{l}.linear.weight|bias  and  {h}.{L}.weight = base lm_head

which ``pipeline.methods.heads_reader.inspect_medusa``, ``pipeline.checkpoint.heads.load_medusa`` and
TensorRT-LLM's ``examples/medusa/convert_checkpoint.py --medusa_model_dir`` read. Same inputs ->
same bytes (safetensors orders keys; no timestamps). :func:`ensure_expanded_medusa` caches the
result under ``<cache>/heads/<name>-<key>/`` keyed by the inputs' hashes, so the convert stage can
call it on every run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pipeline.errors import InputError
from pipeline.heads.export import MEDUSA_RESBLOCKS, sha256_file, verify_manifest, write_json
from pipeline.methods.heads_reader import MEDUSA_FORMAT, is_compact_medusa

LM_HEAD_NAMES = ("lm_head.weight", "model.embed_tokens.weight")  # the second when the embedding is tied
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def compact_medusa_layout(heads_dir: Path) -> tuple[int, int]:
    """(num_heads, num_layers) from the ResBlock tensor names (the planner's view, no weights read)."""
    path = Path(heads_dir) / MEDUSA_RESBLOCKS
    try:
        with safe_open(str(path), framework="pt") as handle:
            keys = list(handle.keys())
    except Exception as exc:  # safetensors raises several types for a bad file
        raise InputError(f"{path}: not a readable safetensors file ({exc})") from None
    pairs = {tuple(int(p) for p in key.split(".")[:2]) for key in keys if key.endswith(".linear.weight")}
    heads = sorted({h for h, _ in pairs})
    if not heads or heads != list(range(len(heads))):
        raise InputError(f"{path}: Medusa ResBlocks are not numbered 0..N-1 (found heads {heads})")
    layers = {h: sorted(l for hh, l in pairs if hh == h) for h in heads}
    if any(ls != list(range(len(layers[0]))) for ls in layers.values()):
        raise InputError(f"{path}: heads have different ResBlock layers ({layers})")
    return len(heads), len(layers[0])


def base_lm_head(base_model_dir: Path) -> torch.Tensor:
    """The base model's lm_head ([V, H]); the embedding when lm_head is tied and not stored."""
    files = sorted(Path(base_model_dir).glob("*.safetensors"))
    for name in LM_HEAD_NAMES:
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                if name in handle.keys():
                    return handle.get_tensor(name)
    raise InputError(f"{base_model_dir}: no lm_head.weight or model.embed_tokens.weight in *.safetensors")


def expand_medusa(heads_dir: Path, base_model_dir: Path, out_dir: Path, *, dtype: str | None = None) -> Path:
    """Write the FasterDecoding folder for a shipped ResBlocks folder; returns ``out_dir``.

    ``dtype`` None keeps each tensor's stored dtype (ResBlocks float32, lm_head as the base model
    stores it), so the expanded heads compute exactly what was evaluated.
    """
    heads_dir, out_dir = Path(heads_dir), Path(out_dir)
    if not is_compact_medusa(heads_dir):
        raise InputError(f"{heads_dir}: not a {MEDUSA_FORMAT} folder (config.json specdeploy.format)")
    if (heads_dir / "manifest.json").exists():
        problems = verify_manifest(heads_dir)
        if problems:
            raise InputError("; ".join(problems))
    config = json.loads((heads_dir / "config.json").read_text())
    num_heads, num_layers = compact_medusa_layout(heads_dir)
    blocks = load_file(str(heads_dir / MEDUSA_RESBLOCKS))
    lm_head = base_lm_head(base_model_dir)
    hidden = blocks["0.0.linear.weight"].shape[0]
    if lm_head.shape[1] != hidden or lm_head.shape[0] != config.get("vocab_size", lm_head.shape[0]):
        raise InputError(
            f"{base_model_dir}: lm_head {list(lm_head.shape)} does not fit heads with hidden "
            f"{hidden} and vocab {config.get('vocab_size')}; wrong base model for {heads_dir}"
        )
    cast = _DTYPES[dtype] if dtype else None
    state = {key: (t.to(cast) if cast else t).contiguous() for key, t in blocks.items()}
    for h in range(num_heads):
        state[f"{h}.{num_layers}.weight"] = (lm_head.to(cast) if cast else lm_head).clone()  # no shared storage
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        save_file(state, str(tmp / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
        write_json(
            tmp / "config.json",
            {
                "medusa_num_heads": num_heads,
                "medusa_num_layers": num_layers,
                "hidden_size": hidden,
                "vocab_size": int(lm_head.shape[0]),
                "expanded_from": {
                    "heads": heads_dir.name,
                    "resblocks_sha256": sha256_file(heads_dir / MEDUSA_RESBLOCKS),
                },
            },
        )
        for path in tmp.iterdir():
            path.chmod(0o644)
        tmp.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def expansion_key(heads_dir: Path, base_model_dir: Path, dtype: str | None = None) -> str:
    """Hash of everything the expansion reads: ResBlocks, config, the base weights' identity."""
    import hashlib

    digest = hashlib.sha256(f"{dtype}|".encode())
    digest.update(sha256_file(Path(heads_dir) / MEDUSA_RESBLOCKS).encode())
    digest.update((Path(heads_dir) / "config.json").read_bytes())
    for file in sorted(Path(base_model_dir).glob("*.safetensors")):
        stat = file.stat()
        digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def ensure_expanded_medusa(heads_dir: Path, base_model_dir: Path, cache_dir: Path, *, dtype: str | None = None) -> Path:
    """``<cache_dir>/heads/<name>-<key>/``, expanded once and reused while the inputs are unchanged."""
    heads_dir = Path(heads_dir)
    out = Path(cache_dir) / "heads" / f"{heads_dir.resolve().name}-{expansion_key(heads_dir, base_model_dir, dtype)}"
    if (out / "config.json").exists() and (out / "medusa_lm_head.safetensors").exists():
        return out
    return expand_medusa(heads_dir, base_model_dir, out, dtype=dtype)
