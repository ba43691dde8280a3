"""What ``validate`` checks in the files on this host: everything but the weights' values.

:func:`pipeline.plan.planner.make_plan` checks the spec against TensorRT-LLM's rules. A spec that passes
must also build, so :func:`checked_plan` adds, per variant and located at the spec line:

* ``build.extra_flags`` against the trtllm-build 1.2 flag table (the build stage checks them again);
* the checkpoint (when its weights are here) exactly as the converter will read it: config.json types and values, every
  safetensors header (names, shapes, dtypes, offsets), the heads' headers against the base and the
  per-rank plan (:func:`pipeline.checkpoint.convert.check_checkpoint`, which reads no tensor data);
  on the FP8 path the base must be safetensors, which is what the quantizer loads;
* each LoRA adapter (``model.adapter``) as the merge will read it: its safetensors header, ranks
  against ``r``/``rank_pattern``, and, with the base's weights here, ``target_modules``, tensor names
  and shapes against the base's headers (:func:`pipeline.checkpoint.merge.open_checked_adapter`);
* the tokenizer the package stage copies: present, parseable, and no larger than the vocabulary;
* on the FP8 path, the calibration file (every line parsed, errors at ``file:line``).

What remains for ``engine`` is in the values: NaN/Inf are refused while the tensors stream
through convert (and before the merge and the FP8 calibration read them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.errors import InputError
from pipeline.io.files import read_json, require_regular_file
from pipeline.plan.planner import PlanErrors, make_plan
from pipeline.plan.types import OutputRoots, Plan, VariantPlan
from pipeline.quantize.calibration import read_calibration
from pipeline.quantize.fp8 import EXPORT_DTYPES
from pipeline.spec.document import Spec
from pipeline.spec.yaml_source import KeyPath
from pipeline.trtllm.build_command import extra_flag_problems

TOKENIZER_JSON_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json")
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024


def checked_plan(spec: Spec, roots: OutputRoots) -> Plan:
    """The plan of ``spec``, or InputError listing every problem the spec and the input files show."""
    try:
        plan = make_plan(spec, roots)
    except PlanErrors as exc:  # the variants that did plan may have problems of their own in their files
        problems = [problem for variant in exc.planned for problem in variant_problems(spec, variant)]
        if not problems:
            raise
        raise InputError("\n".join(dict.fromkeys([*str(exc).splitlines(), *problems]))) from None
    problems = [problem for variant in plan.variants for problem in variant_problems(spec, variant)]
    if problems:
        raise InputError("\n".join(dict.fromkeys(problems)))
    return plan


def variant_problems(spec: Spec, variant: VariantPlan) -> list[str]:
    def located(path: KeyPath, message: str) -> str:
        position, shown = spec.locate(variant.name, path)
        return f"{position} {shown}: {message} [variant {variant.name}]"

    problems = [located(("build", "extra_flags", key), problem) for key, problem in extra_flag_problems(variant)]
    if variant.quant.weights_fp8 and not variant.quant.prequantized:
        if variant.build.dtype not in EXPORT_DTYPES:  # the quantize stage's refusal (pipeline/quantize/fp8.py)
            problems.append(
                located(
                    ("model", "dtype"),
                    f"{variant.build.dtype} with quantization.weights: fp8: the FP8 export keeps its unquantized "
                    f"tensors in {' or '.join(EXPORT_DTYPES)}; use one of them",
                )
            )
        try:
            read_calibration(variant.quant.calibration_data)  # what the quantize stage reads first
        except InputError as exc:
            problems.append(located(("quantization", "calibration", "data"), str(exc)))
    problems += _adapter_problems(spec, variant, located)
    problems += _quantization_header_problems(variant, located)
    if not variant.weights_present or variant.model_dir is None or not _has_weights(variant.model_dir):
        return problems  # planned from a preset or a config.json alone: no checkpoint here to read yet
    model_key: KeyPath = ("model", "builtin") if variant.builtin else ("model", "path")
    try:
        _check_checkpoint(variant)
    except InputError as exc:
        heads = variant.heads_dir
        where = ("heads", variant.method, "path") if heads is not None and str(heads) in str(exc) else model_key
        problems.append(located(where, str(exc)))
    try:
        check_tokenizer(variant.model_dir, variant.arch.vocab_size)
    except InputError as exc:
        problems.append(located(model_key, str(exc)))
    return problems


def _adapter_problems(spec: Spec, variant: VariantPlan, located: Callable[[KeyPath, str], str]) -> list[str]:
    """The merge's checks of each adapter (merged, or shared on a LoRA group's engine, where the lora
    stage reads it: its tensors against its adapter_config.json and the base's shapes), against the
    base's headers when its weights are here."""
    written = next(v for v in spec.variants if v.name == variant.name).model.adapter
    merge = next((stage for stage in variant.stages if stage.name == "merge"), None)
    lora = next((stage for stage in variant.stages if stage.name == "lora"), None)
    if merge is not None:
        folders, base_dir = list(merge.params["adapters"]), merge.inputs["model"]
    elif lora is not None and written:
        adapters = [written] if isinstance(written, str) else list(written)
        folders, base_dir = [str(spec.resolve_path(a)) for a in adapters], lora.inputs["model"]
    else:
        return []
    from pipeline.plan.adapters import has_weights

    if merge is not None and variant.quant.prequantized:  # the merge's refusal (checkpoint/merge.py), from headers
        return [
            located(
                ("model", "adapter"),
                f"{base_dir}: is an FP8 checkpoint; merge adapters into the unquantized base and set "
                "quantization.weights: fp8 to quantize the merged model",
            )
        ]
    # Planned from a preset and the adapters' configs alone, an adapter has nothing to read yet.
    readable = [(i, Path(f)) for i, f in enumerate(folders) if variant.weights_present or has_weights(Path(f))]
    if not readable:
        return []
    from pipeline.checkpoint.hf_reader import open_hf_checkpoint  # torch: only when there are tensors to read
    from pipeline.checkpoint.merge import open_checked_adapter

    base = None
    if variant.weights_present and _has_weights(base_dir):
        try:
            base = open_hf_checkpoint(base_dir)
        except InputError:
            pass  # the checkpoint's own problem is reported at model.path; the adapters are read alone
    problems = []
    try:
        for index, folder in readable:
            where: KeyPath = ("model", "adapter") if isinstance(written, str) else ("model", "adapter", index)
            try:
                open_checked_adapter(folder, base).close()
            except InputError as exc:
                problems.append(located(where, str(exc)))
    finally:
        if base is not None:
            base.close()
    return problems


def _quantization_header_problems(variant: VariantPlan, located: Callable[[KeyPath, str], str]) -> list[str]:
    """The converter's refusals of a quantized input (pipeline/checkpoint/hf_reader.py, layout.py), made
    from config.json and hf_quant_config.json alone, so that they hold before the weights arrive too."""
    if not variant.weights_present or variant.model_dir is None or variant.builtin:
        return []
    from pipeline.checkpoint.hf_reader import _detect_fp8  # torch: only when there are headers to read

    config = read_json(variant.model_dir / "config.json", "config")
    if not isinstance(config, dict):
        return []  # the planner reported it at model.path
    try:
        fp8 = _detect_fp8(variant.model_dir, config)
    except InputError as exc:
        return [located(("model", "path"), str(exc))]
    if variant.quant.kv_cache_fp8 and variant.quant.prequantized and (fp8 is None or not fp8.kv_scales):
        return [
            located(
                ("quantization", "kv_cache"),
                f"fp8, but {variant.model_dir} is an FP8 export without FP8 KV-cache scales (hf_quant_config.json "
                "kv_cache_quant_algo is not FP8); re-quantize it with FP8_KV_CFG, or use kv_cache: auto",
            )
        ]
    return []


def _has_weights(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.pt"))


def _check_checkpoint(variant: VariantPlan) -> None:
    from pipeline.checkpoint.convert import check_checkpoint
    from pipeline.checkpoint.heads import heads_options
    from pipeline.methods.heads_reader import is_compact_medusa

    assert variant.model_dir is not None
    spec, heads = variant.speculative, variant.heads_dir
    heads_here = heads if heads is not None and heads.is_dir() else None  # heads present on this host
    medusa, eagle = heads_options(spec, heads_here) if heads_here else (None, None)
    # specdeploy's shipped ResBlocks-only heads: the convert stage expands them first; checked below
    compact = medusa is not None and heads_here is not None and is_compact_medusa(heads_here)
    # Before an FP8 quantize stage the converter reads the quantizer's output, which has the base's
    # layout; the base itself must be what the quantizer loads (safetensors).
    kv_cache_fp8 = variant.quant.kv_cache_fp8 and variant.quant.prequantized
    check_checkpoint(
        variant.model_dir,
        tp=variant.tp,
        pp=variant.pp,
        dtype=variant.build.dtype,
        medusa=None if compact else medusa,
        eagle=eagle,
        kv_cache_fp8=kv_cache_fp8,
    )
    if compact and heads_here is not None:
        _check_compact_medusa(heads_here, variant.arch.hidden_size)


def _check_compact_medusa(heads: Path, hidden_size: int) -> None:
    """specdeploy's shipped ResBlocks-only heads: every block is hidden x hidden (lm_heads come from the base)."""
    from pipeline.checkpoint.safetensors_io import SafetensorsFile
    from pipeline.heads.export import MEDUSA_RESBLOCKS

    source = SafetensorsFile(heads / MEDUSA_RESBLOCKS)
    try:
        for name in source.names():
            shape = source.meta(name).shape
            want = (hidden_size, hidden_size) if name.endswith(".weight") else (hidden_size,)
            if shape != want:
                raise InputError(
                    f"{source.label}: tensor {name} has shape {list(shape)}, the base model needs "
                    f"{list(want)}; these heads were trained for a different base model"
                )
    finally:
        source.close()


def check_tokenizer(folder: Path, vocab_size: int) -> None:
    """The tokenizer files the package stage copies: present, regular, parseable, within the vocabulary."""
    present = {
        name
        for name in ("tokenizer.json", "tokenizer.model", "spiece.model", *TOKENIZER_JSON_FILES)
        if (folder / name).exists() or (folder / name).is_symlink()
    }
    if not present & {"tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json"}:
        raise InputError(
            f"{folder}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json); the Triton "
            "pre/postprocessing models need the model's own tokenizer next to its weights"
        )
    for name in sorted(present & set(TOKENIZER_JSON_FILES)):
        if not isinstance(read_json(folder / name, "tokenizer file", max_bytes=MAX_TOKENIZER_BYTES), dict):
            raise InputError(f"{folder / name}: tokenizer file must be a JSON object")
    for name in sorted(present & {"tokenizer.model", "spiece.model"}):
        if require_regular_file(folder / name, "SentencePiece model").st_size == 0:
            raise InputError(f"{folder / name}: SentencePiece model is empty; re-download it")
    if "tokenizer.json" in present:
        _check_tokenizer_json(folder / "tokenizer.json", vocab_size)


def _check_tokenizer_json(path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer

    read_json(path, "tokenizer", max_bytes=MAX_TOKENIZER_BYTES)  # regular file, valid JSON, with line:col
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises plain Exception with serde's message
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a loadable tokenizer ({reason}); re-download it") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise InputError(
            f"{path}: the tokenizer has {size} tokens but the model's vocab_size is {vocab_size}; "
            "ids beyond it would index past the embedding: is this the model's own tokenizer?"
        )
