"""The engine ``config.json`` trtllm-build 1.2 writes, predicted from the plan, and its check.

``Engine.save`` writes ``{"version", "pretrained_config": <checkpoint config>, "build_config":
<BuildConfig.to_dict() minus dry_run/visualize_network>}``. The reference (CPU) build writes
exactly this prediction, so the CPU runtime runs the numbers the GPU build will produce;
after a real build, ``check_engine_config`` compares what trtllm-build wrote with the plan.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from pipeline.methods.base import SPECULATIVE_DECODING_MODES
from pipeline.plan.types import VariantPlan
from pipeline.trtllm import TRTLLM_SERIES, TRTLLM_VERSION
from pipeline.trtllm.build_command import TIMING_CACHE, checkpoint_architecture
from pipeline.trtllm.flags import load_flags

_MODE_NAMES = {value: (name or "none").upper() for name, value in SPECULATIVE_DECODING_MODES.items()}

# BuildConfig defaults that no flag sets (builder.py, 1.1/1.2 era).
_BUILD_DEFAULTS: dict[str, Any] = {
    "opt_batch_size": 8,
    "opt_num_tokens": None,
    "max_prompt_embedding_table_size": 0,
    "gather_context_logits": False,
    "gather_generation_logits": False,
    "strongly_typed": True,
    "force_num_profiles": None,
    "profiling_verbosity": "layer_names_only",
    "enable_debug_output": False,
    "use_refit": False,
    "input_timing_cache": None,
    "weight_sparsity": False,
    "weight_streaming": False,
    "use_strip_plan": False,
    "max_encoder_input_len": 1024,
    "monitor_memory": False,
    "use_mrope": False,
}
_LORA_DEFAULTS: dict[str, Any] = {
    "lora_dir": [],
    "lora_ckpt_source": "hf",
    "max_lora_rank": 64,
    "lora_target_modules": [],
    "trtllm_modules_to_hf_modules": {},
}
# Plugin dtype flags accept "auto"; trtllm-build may store it resolved to the model dtype.
_AUTO = "auto"


def _flag_value(name: str, value: Any) -> Any:
    """A CLI value as BuildConfig/PluginConfig stores it: enable/disable -> bool, disable dtype -> None."""
    entry = load_flags()[name]
    if entry.type == "choice" and entry.choices == ("enable", "disable"):
        return value == "enable"
    if entry.type == "choice" and value == "disable":
        return None
    return value


def _plugin_defaults() -> dict[str, Any]:
    plugins: dict[str, Any] = {"paged_kv_cache": True, "manage_weights": False}
    for entry in {f.name: f for f in load_flags().values()}.values():
        for path in entry.config:
            if path.startswith("build_config.plugin_config.") and entry.type != "store_true":
                default = entry.default if entry.default is not None else "disable"
                plugins[path.rsplit(".", 1)[1]] = _flag_value(entry.name, default)
    return plugins


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def predict_engine_config(
    variant: VariantPlan, checkpoint_config: dict[str, Any], *, output_dir: Path
) -> dict[str, Any]:
    """The config.json trtllm-build 1.2.1 writes for this variant's checkpoint into output_dir."""
    b = variant.build
    pretrained = copy.deepcopy(checkpoint_config)
    pretrained.get("mapping", {}).pop("rank", None)  # PretrainedConfig strips it on save

    plugins = _plugin_defaults()
    plugins.update(
        {
            "gpt_attention_plugin": _AUTO,
            "gemm_plugin": _flag_value("--gemm_plugin", b.gemm_plugin),
            "remove_input_padding": b.remove_input_padding,
            "paged_kv_cache": b.kv_cache_type == "paged",
            "tokens_per_block": b.tokens_per_block,
            "use_paged_context_fmha": b.use_paged_context_fmha,
            "use_fp8_context_fmha": b.use_fp8_context_fmha,
            "multiple_profiles": b.multiple_profiles,
            # trtllm-build: nccl_plugin = model dtype when world_size > 1, else None.
            "nccl_plugin": b.dtype if variant.world_size > 1 else None,
            # build(): plugin_config.dtype = the checkpoint dtype; update_kv_cache_type() turns paged_state
            # (the Mamba/RecurrentGemma flag) off for every other architecture.
            "dtype": b.dtype,
            "paged_state": False,
        }
    )
    build: dict[str, Any] = {
        "max_input_len": b.max_input_len,
        "max_seq_len": b.engine_max_seq_len,
        "max_batch_size": b.max_batch_size,
        "max_beam_width": b.max_beam_width,
        "max_num_tokens": b.engine_max_num_tokens,
        "kv_cache_type": b.kv_cache_type.upper(),
        "max_draft_len": b.max_draft_len,
        "speculative_decoding_mode": SPECULATIVE_DECODING_MODES[b.speculative_decoding_mode],
        "output_timing_cache": str(Path(output_dir) / TIMING_CACHE),
        **_BUILD_DEFAULTS,
        "lora_config": dict(_LORA_DEFAULTS),
        "plugin_config": plugins,
    }
    if b.lora is not None:  # trtllm-build --lora_plugin/--max_lora_rank/--lora_target_modules
        plugins["lora_plugin"] = b.lora.plugin_dtype
        build["lora_config"] |= {"max_lora_rank": b.lora.max_rank, "lora_target_modules": list(b.lora.target_modules)}
    config = {"version": TRTLLM_VERSION, "pretrained_config": pretrained, "build_config": build}
    for key in sorted(b.extra_flags):  # already validated by the argv builder
        entry = load_flags()["--" + key.lstrip("-")]
        for path in entry.config:
            _set(config, path, _flag_value(entry.name, b.extra_flags[key]))
    return config


def check_engine_config(
    actual: dict[str, Any],
    variant: VariantPlan,
    *,
    engine_dir: Path | None = None,
    rank_file: str = "rank{rank}.engine",
) -> list[str]:
    """Where an engine config.json (and its rank files) disagrees with the plan; empty if none."""
    problems = (
        []
        if str(actual.get("version", "")).startswith(TRTLLM_SERIES)
        else [f"version {actual.get('version')!r}: engines must come from TensorRT-LLM {TRTLLM_SERIES}x"]
    )
    pretrained, build = actual.get("pretrained_config"), actual.get("build_config")
    if not isinstance(pretrained, dict) or not isinstance(build, dict):
        return problems + ["pretrained_config/build_config missing: not an engine config.json"]
    problems += check_checkpoint_config(pretrained, variant, where="pretrained_config")
    b = variant.build
    expected = {
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_beam_width": b.max_beam_width,
        "max_seq_len": b.engine_max_seq_len,
        "max_num_tokens": b.engine_max_num_tokens,
        "max_draft_len": b.max_draft_len,
    }
    problems += _compare(build, expected, "build_config")
    mode = _mode_int(build.get("speculative_decoding_mode"))
    want_mode = SPECULATIVE_DECODING_MODES[b.speculative_decoding_mode]
    if mode != want_mode:
        problems.append(
            f"build_config.speculative_decoding_mode is {build.get('speculative_decoding_mode')!r}, "
            f"the plan needs {want_mode} ({_MODE_NAMES[want_mode]})"
        )
    if str(build.get("kv_cache_type", "")).upper().split(".")[-1] != b.kv_cache_type.upper():
        problems.append(f"build_config.kv_cache_type is {build.get('kv_cache_type')!r}, not {b.kv_cache_type.upper()}")
    if b.max_draft_len > 0 and build.get("gather_context_logits"):
        problems.append("build_config.gather_context_logits is true with speculative decoding")
    plugins = _section(build, "plugin_config")
    # use_fp8_context_fmha is not compared: trtllm-build decides it from the build GPU's SM and
    # the KV-cache dtype (with paged context FMHA it ends up equal to "FP8 KV cache").
    plugin_expected: dict[str, Any] = {
        "remove_input_padding": b.remove_input_padding,
        "paged_kv_cache": b.kv_cache_type == "paged",
        "tokens_per_block": b.tokens_per_block,
        "use_paged_context_fmha": b.use_paged_context_fmha,
    }
    problems += _compare(plugins, plugin_expected, "build_config.plugin_config")
    if plugins.get("gpt_attention_plugin") in (None, "disable"):
        problems.append("build_config.plugin_config.gpt_attention_plugin is off; the runtime needs it")
    if engine_dir is not None:
        problems += rank_file_problems(Path(engine_dir), variant.world_size, rank_file)
    return problems


def check_checkpoint_config(
    config: dict[str, Any], variant: VariantPlan, *, where: str = "checkpoint config.json"
) -> list[str]:
    """The checkpoint (= engine pretrained_config) facts the plan fixed: mapping, method, quantization."""
    arch, spec = variant.arch, variant.speculative
    expected: dict[str, Any] = {
        "architecture": checkpoint_architecture(variant),
        "dtype": variant.build.dtype,
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
    }
    for resolved in spec.configs().values():  # the heads' fields, as the method's config says
        checkpoint_fields = getattr(resolved, "checkpoint_fields", None)
        if checkpoint_fields is not None:
            expected |= checkpoint_fields()
    problems = _compare(config, expected, where)
    mapping = _section(config, "mapping")
    problems += _compare(mapping, {"tp_size": variant.tp, "pp_size": variant.pp}, f"{where}.mapping")
    if "world_size" in mapping and mapping["world_size"] != variant.world_size:
        problems.append(
            f"{where}.mapping.world_size is {mapping['world_size']}, the plan needs tp*pp = {variant.world_size}"
        )
    quant = _section(config, "quantization")
    problems += _compare(
        quant,
        {"quant_algo": variant.quant.quant_algo, "kv_cache_quant_algo": variant.quant.kv_cache_quant_algo},
        f"{where}.quantization",
        missing_ok=True,
    )
    if arch.rope_scaling:
        problems += _rope_problems(config.get("rotary_scaling"), arch.rope_scaling, f"{where}.rotary_scaling")
        net = config.get("eagle_net_config")
        if isinstance(net, dict):
            problems += _rope_problems(
                net.get("rotary_scaling"), arch.rope_scaling, f"{where}.eagle_net_config.rotary_scaling"
            )
    return problems


def rank_file_problems(folder: Path, world_size: int, pattern: str) -> list[str]:
    """Exactly one file per rank: a missing rank fails at load, an extra one means another tp/pp."""
    problems = [
        f"{folder}: missing {pattern.format(rank=r)}"
        for r in range(world_size)
        if not (folder / pattern.format(rank=r)).is_file()
    ]
    regex = re.compile("^" + re.escape(pattern).replace(re.escape("{rank}"), r"(\d+)") + "$")
    extra = sorted(p.name for p in folder.iterdir() if (m := regex.match(p.name)) and int(m.group(1)) >= world_size)
    if extra:
        problems.append(f"{folder}: {', '.join(extra)} beyond world size {world_size} (tp*pp)")
    return problems


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    """``config[key]`` when it is an object, else empty (then every expected key is reported missing)."""
    value = config.get(key)
    return value if isinstance(value, dict) else {}


def _compare(actual: dict[str, Any], expected: dict[str, Any], where: str, missing_ok: bool = False) -> list[str]:
    problems = []
    for key, want in expected.items():
        if key not in actual:
            if not (missing_ok and want is None):
                problems.append(f"{where}.{key} is missing (the plan needs {want!r})")
        elif actual[key] != want:
            problems.append(f"{where}.{key} is {actual[key]!r}, the plan needs {want!r}")
    return problems


def _mode_int(value: Any) -> int | None:
    """The stored mode: an int, or (tolerated) an enum name such as 'SpeculativeDecodingMode.EAGLE'."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        name = value.split(".")[-1].upper()
        return next((number for number, known in _MODE_NAMES.items() if known == name), None)
    return None


def _rope_problems(actual: Any, expected: dict[str, Any], where: str) -> list[str]:
    """Llama 3.x rope scaling must survive conversion whole (the Medusa/EAGLE converters keep only the type)."""
    if not isinstance(actual, dict):
        return [
            f"{where} is missing; the model uses {expected.get('rope_type')} rope scaling "
            f"(factor {expected.get('factor')})"
        ]
    problems = []
    kind = actual.get("rope_type", actual.get("type"))
    if kind != expected.get("rope_type", expected.get("type")):
        problems.append(f"{where} type is {kind!r}, the model's is {expected.get('rope_type')!r}")
    for key, want in expected.items():
        if key not in ("rope_type", "type") and actual.get(key) != want:
            problems.append(f"{where}.{key} is {actual.get(key)!r}, the model's is {want!r}")
    return problems
