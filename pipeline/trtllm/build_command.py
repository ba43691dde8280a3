"""The trtllm-build argv for one variant, from the plan only.

Derived numbers (max_draft_len, the engine's max_seq_len, ...) are never recomputed here:
``max_seq_len``/``max_num_tokens`` are passed as requested and trtllm-build adds the draft
length itself, exactly as ``BuildConfig.engine_max_*`` in the plan predicts. The result is
an argument list for ``subprocess`` (never a shell string); ``display`` is for humans only.
"""

from __future__ import annotations

import difflib
import shlex
from pathlib import Path
from typing import Any

from pipeline import methods
from pipeline.errors import InputError
from pipeline.plan.types import VariantPlan
from pipeline.trtllm.flags import Flag, load_flags, table_version

PROGRAM = "trtllm-build"
TIMING_CACHE = "model.cache"

# Where a plan-owned flag comes from, for the error when extra_flags tries to set it.
_PLAN_SOURCE = {
    "checkpoint_dir": "the convert stage's output",
    "output_dir": "the build stage's output",
    "max_batch_size": "build.max_batch_size",
    "max_input_len": "build.max_input_len",
    "max_seq_len": "build.max_seq_len",
    "max_num_tokens": "build.max_num_tokens",
    "speculative_decoding_mode": "speculative.method",
    "max_draft_len": "the speculative settings",
    "use_fp8_context_fmha": "quantization.weights and gpu.type",
    "workers": "parallel.tp * parallel.pp",
    "gemm_plugin": "quantization.weights and build.max_batch_size",
    "lora_plugin": "serving.lora: shared (the LoRA group's engine)",
}
# Switches that only make sense with FP8 weights (TensorRT-LLM would fail or silently ignore them).
_FP8_ONLY = {"gemm_swiglu_plugin": "fp8", "low_latency_gemm_plugin": "fp8", "low_latency_gemm_swiglu_plugin": "fp8"}
# reduce_fusion is forced off by trtllm-build unless tp > 1 and the model is one of these.
_REDUCE_FUSION_ARCHS = ("LlamaForCausalLM", "MedusaForCausalLM")


def _switch(value: bool) -> str:
    return "enable" if value else "disable"


def workers(world_size: int, visible_gpus: int | None) -> int:
    """Parallel engine builds: one per rank, at most one per visible GPU (unknown: one per rank)."""
    return world_size if visible_gpus is None else max(1, min(world_size, visible_gpus))


def trtllm_build_argv(
    variant: VariantPlan, checkpoint_dir: Path, output_dir: Path, *, visible_gpus: int | None
) -> list[str]:
    b = variant.build
    output_dir = Path(output_dir)
    argv = [
        PROGRAM,
        "--checkpoint_dir",
        str(checkpoint_dir),
        "--output_dir",
        str(output_dir),
        "--max_batch_size",
        str(b.max_batch_size),
        "--max_input_len",
        str(b.max_input_len),
        "--max_seq_len",
        str(b.max_seq_len),
        "--max_num_tokens",
        str(b.max_num_tokens),
        "--max_beam_width",
        str(b.max_beam_width),
        "--kv_cache_type",
        b.kv_cache_type,
        "--remove_input_padding",
        _switch(b.remove_input_padding),
        "--gpt_attention_plugin",
        "auto",
        "--gemm_plugin",
        b.gemm_plugin,
        "--use_paged_context_fmha",
        _switch(b.use_paged_context_fmha),
        "--use_fp8_context_fmha",
        _switch(b.use_fp8_context_fmha),
        "--tokens_per_block",
        str(b.tokens_per_block),
        "--multiple_profiles",
        _switch(b.multiple_profiles),
    ]
    if b.speculative_decoding_mode is not None:
        # Always explicit: 0 would make trtllm-build read the checkpoint's value, and Lookahead
        # checkpoints have none (tensorrtllm_backend#473: "maximum number of draft tokens (0)").
        argv += ["--speculative_decoding_mode", b.speculative_decoding_mode, "--max_draft_len", str(b.max_draft_len)]
    if b.lora is not None:  # a LoRA group's engine: the adapters come at run time (lora_prefetch_dir)
        argv += ["--lora_plugin", b.lora.plugin_dtype, "--max_lora_rank", str(b.lora.max_rank)]
        argv += ["--lora_target_modules", *b.lora.target_modules]
    argv += ["--workers", str(workers(variant.build.workers or variant.world_size, visible_gpus))]
    # trtllm-build's default timing cache path is relative, i.e. it lands in the CWD.
    argv += ["--output_timing_cache", str(output_dir / TIMING_CACHE)]
    return argv + extra_flag_args(variant)


def extra_flag_args(variant: VariantPlan) -> list[str]:
    """build.extra_flags as argv, or InputError listing every flag that is not allowed."""
    problems = [
        f"build.extra_flags.{key.lstrip('-')}: {problem} [variant {variant.name}]"
        for key, problem in extra_flag_problems(variant)
    ]
    if problems:
        raise InputError("\n".join(problems))
    args = []
    for key in sorted(variant.build.extra_flags):
        value = variant.build.extra_flags[key]
        entry = load_flags()["--" + key.lstrip("-")]
        if entry.type == "store_true":
            args += [entry.name] if value else []
        else:
            args += [entry.name, str(value)]
    return args


def extra_flag_problems(variant: VariantPlan) -> list[tuple[str, str]]:
    """(key as written in build.extra_flags, why trtllm-build 1.2 would refuse or ignore it), for each bad one."""
    problems, seen = [], set()
    for key in sorted(variant.build.extra_flags):
        name = key.lstrip("-")
        entry = load_flags().get("--" + name)
        problem = extra_flag_problem(variant, name, variant.build.extra_flags[key])
        if entry is not None and entry.name in seen:
            problem = f"{entry.name} is given twice (as a name, an alias or with dashes)"
        if entry is not None:
            seen.add(entry.name)
        if problem:
            problems.append((key, problem))
    return problems


def extra_flag_problem(variant: VariantPlan, name: str, value: Any) -> str | None:
    flags = load_flags()
    entry: Flag | None = flags.get("--" + name)
    if entry is None:
        close = difflib.get_close_matches("--" + name, list(flags), n=1)
        hint = f"; did you mean '{close[0].lstrip('-')}'?" if close else ""
        return f"not a trtllm-build {table_version()} flag{hint}"
    if entry.owner == "plan":
        source = _PLAN_SOURCE.get(entry.key, "fixed by specdeploy")
        return f"set by the plan ({source}); it cannot be overridden here"
    if entry.forbid:
        return f"not allowed: {entry.forbid}"
    allowed = entry.value_problem(value)
    if allowed and isinstance(value, bool) and entry.choices == ("enable", "disable"):
        return f"{str(value).lower()} is not legal (YAML reads on/off/yes/no as booleans); write enable or disable"
    if allowed:
        return f"{value!r} is not legal; allowed: {allowed}"
    if isinstance(value, str) and value in entry.reject_values:
        return f"{value} is refused: {entry.reject_values[value]}"
    return _variant_rule(variant, entry.key, value)


def _variant_rule(variant: VariantPlan, name: str, value: Any) -> str | None:
    """Combinations trtllm-build rejects, or silently ignores, for this variant."""
    if name in ("gather_context_logits", "gather_all_token_logits") and value and variant.build.max_draft_len > 0:
        return "trtllm-build raises an error for context logits with speculative decoding (max_draft_len > 0)"
    if _FP8_ONLY.get(name) == value and not variant.quant.weights_fp8:
        return f"{value} needs FP8 weights (quantization.weights: fp8); allowed here: disable"
    if name == "reduce_fusion" and value == "enable":
        architecture = checkpoint_architecture(variant)
        if variant.tp < 2 or architecture not in _REDUCE_FUSION_ARCHS:
            return (
                f"enable needs tp > 1 and one of {', '.join(_REDUCE_FUSION_ARCHS)} (this is tp {variant.tp}, "
                f"{architecture}); trtllm-build would silently turn it off; allowed here: disable"
            )
    given = {key.lstrip("-"): setting for key, setting in variant.build.extra_flags.items()}
    if name == "user_buffer" and value == "enable" and given.get("reduce_fusion") != "enable":
        return "enable needs build.extra_flags.reduce_fusion: enable; allowed here: disable"
    return None


def checkpoint_architecture(variant: VariantPlan) -> str:
    """The checkpoint architecture the convert stage writes for this method."""
    return methods.definition(variant.method).checkpoint_architecture


def display(argv: list[str]) -> str:
    """A copy-pasteable rendering of an argv, for messages only (never executed)."""
    return shlex.join(argv)
