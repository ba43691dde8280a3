"""Base HF checkpoint + LoRA adapters (applied in order) -> merged HF checkpoint, streamed.

The output has the base's layout: the same safetensors files (and index), the same tensor
names, dtypes and order, and the base's other files (config.json, tokenizer, ...) copied. One
tensor is in memory at a time (plus its float32 update): tensors no adapter touches are copied
file-to-file by the kernel, so peak memory is bounded by the largest tensor, not the model.

Several adapters: each is merged into the result of the ones before it, as if that merged model
were its base; this equals PEFT's ``merge_and_unload`` applied adapter by adapter. (Plain LoRA
updates add up, so only DoRA, whose row norms read the weight, depends on the order.)

Everything checkable from headers and configs (names, ranks, shapes, tied embeddings, the
adapter's base model) and NaN/Inf in the adapters' tensors fail before the first output byte is
written (:func:`open_checked_adapter` is also what ``validate`` runs); an update too large for its
base tensor, or one whose result overflows, fails while merging, and the files written so far are
removed, so a refused merge leaves ``out`` empty.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.checkpoint.hf_reader import HFCheckpoint, open_hf_checkpoint
from pipeline.checkpoint.lora import Adapter, apply_adapter, check_adapter_values, check_against_base, open_adapter
from pipeline.checkpoint.safetensors_io import HeaderEntry, StreamWriter
from pipeline.checkpoint.values import require_finite
from pipeline.errors import InputError

PROVENANCE_FILE = "specdeploy_merge.json"


@dataclass(frozen=True)
class MergeSummary:
    out: Path
    adapters: tuple[Path, ...]
    updated_tensors: int
    replaced_tensors: int
    copied_tensors: int
    total_bytes: int
    largest_change: tuple[float, str]  # max |update| / max |weight| over every adapter, and its tensor


def merge_adapters(
    base_dir: Path, adapter_dirs: list[Path], out: Path, progress: Callable[[int, int], None] | None = None
) -> MergeSummary:
    """Write the merged checkpoint into ``out`` (an existing empty folder the caller renames into place)."""
    out = Path(out)
    if not out.is_dir() or any(out.iterdir()):
        raise InputError(f"{out}: output folder must exist and be empty (a temp folder the caller renames)")
    if not adapter_dirs:
        raise InputError("merge needs at least one adapter")
    base = open_hf_checkpoint(Path(base_dir))
    adapters: list[Adapter] = []
    try:
        for folder in adapter_dirs:
            adapters.append(open_checked_adapter(Path(folder), base))
        for adapter in adapters:
            check_adapter_values(adapter)
        _write_merged(base, adapters, out, progress)
        _copy_other_files(base.path, out)
        updated = {n for a in adapters for n in a.updates}
        touched = {name for a in adapters for name in (*a.updates, *a.replacements)}
        summary = MergeSummary(
            out=out,
            adapters=tuple(a.folder for a in adapters),
            updated_tensors=len(updated),
            replaced_tensors=len(touched - updated),
            copied_tensors=len(base.tensors) - len(touched),
            total_bytes=sum(ref.meta.nbytes for ref in base.tensors.values()),
            largest_change=max((a.largest_change for a in adapters), default=(0.0, "")),
        )
        _write_provenance(out, adapters, summary)
        return summary
    except BaseException:
        for path in out.iterdir():  # what was written so far: a refused merge leaves nothing behind
            with contextlib.suppress(OSError):
                path.unlink()
        raise
    finally:
        base.close()
        for adapter in adapters:
            adapter.close()


def open_checked_adapter(folder: Path, base: HFCheckpoint | None) -> Adapter:
    """The adapter at ``folder``, checked on its own and, with ``base``, against the base's headers
    (tensor names, ranks, shapes, tied embeddings): everything but the values. The caller closes it."""
    if base is not None and base.fp8 is not None:
        raise InputError(
            f"{base.path}: is an FP8 checkpoint; merge adapters into the unquantized base and set "
            "quantization.weights: fp8 to quantize the merged model"
        )
    adapter = open_adapter(folder)
    try:
        if base is not None:
            check_against_base(adapter, base)
    except BaseException:
        adapter.close()
        raise
    return adapter


def _write_merged(
    base: HFCheckpoint, adapters: list[Adapter], out: Path, progress: Callable[[int, int], None] | None
) -> None:
    touched = {name for a in adapters for name in (*a.updates, *a.replacements)}
    total = sum(ref.meta.nbytes for ref in base.tensors.values())
    done = 0
    for source in base.files:
        metas = sorted((source.meta(name) for name in source.names()), key=lambda m: m.offset)
        writer = StreamWriter(
            out / source.path.name,
            [HeaderEntry(m.name, m.dtype, m.shape) for m in metas],
            metadata=source.metadata or None,
        )
        try:
            for meta in metas:
                if meta.name in touched:
                    tensor = base.tensors[meta.name].read()
                    if not math.isfinite(float(tensor.sum())):  # the base's fault, not the adapter's
                        require_finite(source, meta.name)
                    for adapter in adapters:
                        tensor = apply_adapter(tensor, adapter, meta.name)
                    writer.write_tensor_bytes(tensor)
                    del tensor
                else:
                    fd, offset, nbytes = source.byte_span(meta.name, 0, meta.rows)
                    writer.copy_range(fd, offset, nbytes, f"{source.label}: tensor {meta.name}")
                done += meta.nbytes
                if progress is not None:
                    progress(done, total)
            writer.close(sync=False)
        finally:
            writer.abort()


def _copy_other_files(base_dir: Path, out: Path) -> None:
    """config.json, the tokenizer, generation config, the shard index: everything but the weights."""
    for path in sorted(base_dir.iterdir()):
        if (
            path.is_file()
            and not path.name.startswith(".")
            and path.suffix != ".safetensors"
            and not (out / path.name).exists()
        ):
            shutil.copyfile(path, out / path.name)


def _write_provenance(out: Path, adapters: list[Adapter], summary: MergeSummary) -> None:
    body = {
        "adapters": [
            {
                "path": str(a.folder),
                "weights": a.weights.name,
                "r": a.config.r,
                "lora_alpha": a.config.lora_alpha,
                "use_rslora": a.config.use_rslora,
                "use_dora": a.config.use_dora,
                "base_model_name_or_path": a.config.base_model_name_or_path,
                "updated": len(a.updates),
                "replaced": len(a.replacements),
                # max |update| / max |weight| of the tensor it changes (refused above MAX_UPDATE_RATIO)
                "largest_change": {"ratio": a.largest_change[0], "tensor": a.largest_change[1]},
            }
            for a in adapters
        ],
        "updated_tensors": summary.updated_tensors,
        "replaced_tensors": summary.replaced_tensors,
        "copied_tensors": summary.copied_tensors,
    }
    (out / PROVENANCE_FILE).write_text(json.dumps(body, indent=2) + "\n")
