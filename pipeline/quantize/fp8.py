"""FP8 post-training quantization with NVIDIA ModelOpt 0.47, exported as a unified HF checkpoint.

HF folder in -> ModelOpt HF FP8 folder out (``*.safetensors`` with F8_E4M3 weights and 0-d F32
``weight_scale``/``input_scale``, ``k_scale``/``v_scale`` with an FP8 KV cache,
``hf_quant_config.json``, tokenizer files, config and generation config).

Placement (``pipeline.quantize.placement``): on the CPU the model is one module in host RAM; on
CUDA hosts it is dispatched over the GPUs with accelerate (meta-device init, shards streamed to
their GPU at the calibration dtype), with CPU or disk offload only when asked. Dispatch changes
where tensors live, not the numbers: the export equals the undispatched one (tested).

Precision choices:

* Calibration runs in float32 on CPU (exact activation ranges, no bf16 rounding of the
  reference weights) and in the export dtype on CUDA (memory).
* Quantized weights are divided by their scale in float32 and rounded once to E4M3.
  ModelOpt's exporter casts the weight to the export ``dtype`` *before* dividing, which
  with bf16 rounds twice (about 3 % of codes off by one step); so we export with
  ``dtype=float32`` and then cast the unquantized tensors (norms, embeddings, lm_head,
  excluded layers) in the written files to the export dtype.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pipeline.quantize.calibration as calib
import pipeline.quantize.placement as place
from pipeline.errors import InputError, StageError, StageUnavailable
from pipeline.io.files import hf_offline
from pipeline.plan.resources import EXPORT_SHARD, calibration_bytes
from pipeline.quantize.checks import require_plain_checkpoint, verify_fp8_export
from pipeline.quantize.hf import copy_tokenizer_files, fix_config_file, make_readable, read_json

Progress = Callable[[str], None]

EXPORT_DTYPES = ("bfloat16", "float16")
# Always kept in high precision, on top of ModelOpt's own list (which already has *lm_head*):
# TRT-LLM's FP8 path expects BF16/FP16 embeddings and output layer.
ALWAYS_EXCLUDED = ("*lm_head*", "*embed_tokens*")


@dataclass(frozen=True)
class AmaxStats:
    count: int
    min: float
    max: float
    mean: float


@dataclass(frozen=True)
class QuantizeSummary:
    output: Path
    device: str  # "cpu", "cuda", or the devices of a dispatched model ("cuda:0+cuda:1", "cpu+disk")
    calib_dtype: str
    export_dtype: str
    kv_cache_fp8: bool
    num_quantizers: int  # enabled (calibrated) quantizers
    num_quantized_linears: int
    excluded_modules: tuple[str, ...]  # as written to hf_quant_config.json
    unmatched_exclude: tuple[str, ...]  # ``exclude`` patterns that matched no module (typo?)
    calib_file: Path
    calib_samples: int
    calib_tokens: int
    calib_truncated: int  # samples cut to calib_max_len
    calibrate_s: float
    export_s: float
    elapsed_s: float
    amax_stats: dict[str, AmaxStats]  # by quantizer kind: weight, input, k_bmm, v_bmm
    amax: dict[str, float] = field(repr=False)  # quantizer name -> calibrated amax
    calib_batch: int = 1  # samples per calibration forward (equal-length samples only, no padding)
    device_map: dict[str, str] | None = None  # module -> device of a dispatched model

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["output"], data["calib_file"] = str(self.output), str(self.calib_file)
        return data


def fp8_quant_config(*, kv_cache_fp8: bool, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """ModelOpt 0.47 config: FP8_DEFAULT_CFG (+ FP8_KV_CFG) plus our exclusions.

    0.47's ``quant_cfg`` is an ordered *list* of entries and later entries win, so the
    exclusions go last. A pattern without a trailing ``*`` is a module name; it also gets a
    ``<name>.*`` entry so it matches that module's quantizers.
    """
    import modelopt.torch.quantization as mtq

    config = _deepcopy(mtq.FP8_DEFAULT_CFG)
    entries = list(config["quant_cfg"])
    if kv_cache_fp8:
        entries += _deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
    for pattern in (*ALWAYS_EXCLUDED, *exclude):
        entries.append({"quantizer_name": pattern, "enable": False})
        if not pattern.endswith("*"):
            entries.append({"quantizer_name": f"{pattern}.*", "enable": False})
    config["quant_cfg"] = entries
    return config


def quantize_fp8(
    hf_dir: Path,
    out_dir: Path,
    *,
    kv_cache_fp8: bool,
    calib_path: Path | None,
    calib_size: int,
    calib_max_len: int,
    dtype: str = "bfloat16",
    exclude: Sequence[str] = (),
    placement: place.Placement | None = None,
    progress: Progress | None = None,
) -> QuantizeSummary:
    """Calibrate ``hf_dir`` with ModelOpt FP8 PTQ and export the FP8 checkpoint into ``out_dir``.

    ``out_dir`` may exist (the stage runner passes an empty temp folder) but must hold no weights.
    ``placement`` says where the model goes (default: the CPU, or every GPU of a CUDA host).
    Raises InputError for bad inputs (before any heavy import) and StageError when ModelOpt fails
    or the export misses a tensor.
    """
    say: Progress = progress or (lambda _msg: None)
    start = time.monotonic()
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)

    # --- cheap validation first: a typo should not cost a 10 s import -------------------------
    require_plain_checkpoint(hf_dir)
    if dtype not in EXPORT_DTYPES:
        raise InputError(f"export dtype '{dtype}' is not supported for FP8 (use {' or '.join(EXPORT_DTYPES)})")
    if calib_size < 1 or calib_max_len < 1:
        raise InputError(f"calibration size ({calib_size}) and max_seq_len ({calib_max_len}) must be >= 1")
    if not any((hf_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise InputError(f"{hf_dir}: no tokenizer files; calibration needs the model's tokenizer")
    calib_file = Path(calib_path) if calib_path is not None else calib.DEFAULT_CALIBRATION
    samples = calib.read_calibration(calib_file)[:calib_size]
    if out_dir.exists() and any(out_dir.glob("*.safetensors")):
        raise InputError(f"{out_dir}: already holds .safetensors files; give an empty output folder")
    say(f"checking the values of {hf_dir}")
    require_finite_weights(hf_dir)

    hf_offline()
    try:
        import modelopt.torch.export as mte
        import modelopt.torch.quantization as mtq
        import torch
        from modelopt.torch.quantization.nn import TensorQuantizer
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise StageError(
            f"FP8 quantization needs torch, transformers and nvidia-modelopt==0.47.0 ({exc}); run `make setup`"
        ) from None

    placement = placement or place.Placement()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    export_dtype = getattr(torch, dtype)
    calib_dtype = export_dtype if cuda else torch.float32
    load_kwargs = placement.load_kwargs(cuda)

    target = "an accelerate dispatch" if load_kwargs else device
    say(f"loading {hf_dir} ({_dtype_name(calib_dtype)} on {target})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
        model: Any
        loading: dict[str, Any]
        model, loading = AutoModelForCausalLM.from_pretrained(  # type: ignore[misc]
            hf_dir, dtype=calib_dtype, local_files_only=True, output_loading_info=True, **load_kwargs
        )
    except ValueError as exc:
        if load_kwargs and "offload" in str(exc):  # the dispatch needs a folder it was not given
            raise StageUnavailable(
                f"{hf_dir} does not fit the GPU memory given to the quantize stage "
                f"({placement.max_memory_gib or 'all visible GPUs'}); run on a host with "
                "more GPU memory, or set quantization.offload: cpu or disk"
            ) from None
        raise InputError(f"{hf_dir}: transformers cannot load this model ({_first_line(exc)})") from None
    except (OSError, KeyError) as exc:
        raise InputError(f"{hf_dir}: transformers cannot load this model ({_first_line(exc)})") from None
    dropped = sorted(loading.get("unexpected_keys") or ())
    if dropped:
        # e.g. Medusa/EAGLE heads merged into the folder: the model class does not load them, so
        # the export would silently lose them.
        raise InputError(
            f"{hf_dir}: {len(dropped)} tensors (e.g. '{dropped[0]}') are not part of "
            f"{type(model).__name__} and would be dropped by the FP8 export; quantize the base "
            f"model folder and keep heads separate"
        )
    missing = sorted(loading.get("missing_keys") or ())
    if missing:  # randomly initialised weights would be quantized and exported as if real
        raise InputError(f"{hf_dir}: {len(missing)} weights missing from the checkpoint (e.g. '{missing[0]}')")
    mapped = place.check_device_map(model, placement, cuda)
    if mapped is None:
        model = model.to(device)
    model = model.eval()
    where = place.describe(mapped, device)
    inputs_on = place.input_device(mapped, device)
    tokens = calib.tokenize_samples(samples, tokenizer, calib_max_len, hf_dir)
    config = model.config
    per_sample = calibration_bytes(
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
        config.num_attention_heads,
        calib_max_len,
        calib_dtype.itemsize,
    )
    batch = place.calibration_batch(
        placement, mapped, cuda=cuda, bytes_per_sample=per_sample, samples=len(tokens.batches)
    )
    forwards = calib.batch_equal_lengths(tokens.batches, batch)
    say(
        f"calibrating on {where}: {len(tokens.batches)} samples / {tokens.num_tokens} tokens from {calib_file}, "
        f"{len(forwards)} forward passes of up to {batch}"
    )

    def forward_loop(m: torch.nn.Module) -> None:
        with torch.no_grad():
            for i, ids in enumerate(forwards, 1):
                # use_cache=False: no KV cache to allocate; the k/v quantizers still see every key/value.
                m(input_ids=ids.to(inputs_on), use_cache=False)
                if i % 16 == 0 or i == len(forwards):
                    say(f"calibration {i}/{len(forwards)}")

    t0 = time.monotonic()
    try:
        model = mtq.quantize(model, fp8_quant_config(kv_cache_fp8=kv_cache_fp8, exclude=exclude), forward_loop)
    except Exception as exc:  # ModelOpt raises many types; the user needs the message, not the stack
        raise StageError(f"ModelOpt FP8 calibration of {hf_dir} failed: {_first_line(exc)}") from exc
    calibrate_s = time.monotonic() - t0

    amax, linears, kv_attention = _calibrated_quantizers(model, TensorQuantizer)
    module_names = [name for name, _ in model.named_modules()]
    # Reported, not raised: callers pass generic patterns ("*medusa_heads*") for every model,
    # but a typo would silently quantize the layer it meant to protect.
    unmatched = tuple(p for p in exclude if not any(fnmatch.fnmatch(name, p) for name in module_names))
    if not linears:
        raise StageError(
            f"{hf_dir}: ModelOpt quantized no Linear layer (architecture not supported, or "
            f"everything excluded by {list(exclude)})"
        )

    say(f"exporting FP8 checkpoint to {out_dir}")
    t0 = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        # No deepcopy: exports mutate the model (weights become FP8), but nothing uses it after
        # this call and a copy would double peak memory on large models. float32 = single rounding.
        mte.export_hf_checkpoint(model, dtype=torch.float32, export_dir=out_dir, max_shard_size=EXPORT_SHARD)
    except Exception as exc:
        raise StageError(f"ModelOpt export_hf_checkpoint to {out_dir} failed: {_first_line(exc)}") from exc
    del model
    cast = _cast_unquantized_tensors(out_dir, dtype)
    export_s = time.monotonic() - t0

    _finish_export_folder(hf_dir, out_dir, dtype)
    verify_fp8_export(out_dir, linears, kv_attention, kv_cache_fp8=kv_cache_fp8)
    excluded = tuple(
        (read_json(out_dir / "hf_quant_config.json").get("quantization") or {}).get("exclude_modules") or ()
    )
    summary = QuantizeSummary(
        output=out_dir,
        device=where,
        calib_dtype=_dtype_name(calib_dtype),
        export_dtype=dtype,
        kv_cache_fp8=kv_cache_fp8,
        num_quantizers=len(amax),
        num_quantized_linears=len(linears),
        excluded_modules=excluded,
        unmatched_exclude=unmatched,
        calib_file=calib_file,
        calib_samples=len(tokens.batches),
        calib_tokens=tokens.num_tokens,
        calib_truncated=tokens.num_truncated,
        calibrate_s=calibrate_s,
        export_s=export_s,
        elapsed_s=time.monotonic() - start,
        amax_stats=_amax_stats(amax),
        amax=amax,
        calib_batch=batch,
        device_map={name: str(d) for name, d in mapped.items()} if mapped else None,
    )
    say(
        f"quantized {len(linears)} linears ({len(amax)} quantizers), cast {cast} other tensors to {dtype}, "
        f"in {summary.elapsed_s:.1f} s"
    )
    return summary


def _calibrated_quantizers(model: Any, quantizer_type: Any) -> tuple[dict[str, float], list[str], list[str]]:
    """amax of every enabled quantizer, the quantized Linear names, the KV-quantized attention names."""
    amax: dict[str, float] = {}
    for name, module in model.named_modules():
        if isinstance(module, quantizer_type) and module.is_enabled:
            value = module.amax
            if value is None:
                # Never saw data: e.g. a layer the forward pass skips. Its scale would be garbage.
                raise StageError(
                    f"quantizer '{name}' was never calibrated (no calibration data reached it); "
                    f"use more varied calibration data or exclude that module"
                )
            amax[name] = float(value.float().max())
    linears = sorted(n.rsplit(".", 1)[0] for n in amax if n.endswith(".weight_quantizer"))
    kv_attention = sorted(n.rsplit(".", 1)[0] for n in amax if n.endswith(".k_bmm_quantizer"))
    return amax, linears, kv_attention


def _cast_unquantized_tensors(out_dir: Path, dtype: str) -> int:
    """Rewrite the export's high-precision tensors (norms, embeddings, lm_head, excluded layers)
    in the export dtype. FP8 weights and the float32 ``*_scale`` tensors are left alone.

    Done on the files because it cannot be done on the model: the exporter runs a dummy
    forward pass first, which fails on a model with mixed fp32/bf16 parameters. One shard is
    in memory at a time; files that need no cast are not rewritten. Returns tensors cast.
    """
    import json
    import os

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    target = getattr(torch, dtype)
    high = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    cast_total = 0
    for file in sorted(out_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            names = [
                k
                for k in handle.keys()
                if not k.endswith("_scale") and high.get(handle.get_slice(k).get_dtype(), target) != target
            ]
            if not names:
                continue
            metadata = handle.metadata() or {"format": "pt"}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}
        for name in names:
            tensors[name] = tensors[name].to(target)
        tmp = file.with_name(f".{file.name}.tmp")
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, file)
        cast_total += len(names)
        del tensors
    index = out_dir / "model.safetensors.index.json"
    if cast_total and index.is_file():  # total_size changed with the dtype
        data = json.loads(index.read_text())
        total = 0
        for file in sorted(out_dir.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                for k in handle.keys():
                    piece = handle.get_slice(k)
                    numel = 1
                    for dim in piece.get_shape():
                        numel *= dim
                    total += numel * _ELEMENT_SIZE[piece.get_dtype()]
        data.setdefault("metadata", {})["total_size"] = total
        index.write_text(json.dumps(data, indent=2) + "\n")
    return cast_total


_ELEMENT_SIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def _finish_export_folder(hf_dir: Path, out_dir: Path, dtype: str) -> None:
    """Tokenizer, generation config and a config.json that says the real dtype."""
    import shutil

    copied = copy_tokenizer_files(hf_dir, out_dir)
    if not copied:
        raise StageError(f"{hf_dir}: no tokenizer files were found to copy into {out_dir}")
    if not (out_dir / "generation_config.json").is_file() and (hf_dir / "generation_config.json").is_file():
        shutil.copy2(hf_dir / "generation_config.json", out_dir / "generation_config.json")
    # config.json says the calibration dtype (float32); readers size buffers from it.
    fix_config_file(out_dir / "config.json", dtype=dtype)
    make_readable(out_dir, root=False)


def _amax_stats(amax: dict[str, float]) -> dict[str, AmaxStats]:
    groups: dict[str, list[float]] = {}
    for name, value in amax.items():
        kind = name.rsplit(".", 1)[-1].removesuffix("_quantizer")
        groups.setdefault(kind, []).append(value)
    return {kind: AmaxStats(len(v), min(v), max(v), sum(v) / len(v)) for kind, v in sorted(groups.items())}


def require_finite_weights(hf_dir: Path) -> None:
    """InputError naming file, tensor and row for a NaN or Inf weight, before calibration starts.

    ModelOpt would otherwise stop in the middle of calibration with ``AssertionError: detected nan
    values in amax`` and no tensor named. Reads every tensor once, a chunk at a time.
    """
    from pipeline.checkpoint.hf_reader import open_hf_checkpoint
    from pipeline.checkpoint.values import require_all_finite

    checkpoint = open_hf_checkpoint(hf_dir)
    try:
        require_all_finite(checkpoint.files)
    finally:
        checkpoint.close()


def _deepcopy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
