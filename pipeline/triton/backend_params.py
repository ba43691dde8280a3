"""The ``parameters`` of the ``tensorrt_llm`` model: what the TensorRT-LLM backend reads, from the plan.

The C++ backend silently ignores a key it does not know (a typo means a default is used, and
a Lookahead model then dies at load with ``Assertion failed: 16 != 40``, tensorrtllm_backend#710).
So every key we emit must be in :data:`TENSORRT_LLM_PARAMETER_KEYS`, the keys that
``inflight_batcher_llm/src/model_instance_state.cc`` / ``model_state.cc`` read
(NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src/), and every value comes from the plan, never recomputed.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from pipeline import trees
from pipeline.errors import StageError
from pipeline.plan import VariantPlan
from pipeline.speculative import METHODS

TENSORRT_LLM_PARAMETER_KEYS: frozenset[str] = frozenset(
    {
        "max_beam_width",
        "FORCE_CPU_ONLY_INPUT_TENSORS",
        "gpt_model_type",
        "gpt_model_path",
        "encoder_model_path",
        "max_tokens_in_paged_kv_cache",
        "max_attention_window_size",
        "sink_token_length",
        "batch_scheduler_policy",
        "kv_cache_free_gpu_mem_fraction",
        "cross_kv_cache_fraction",
        "kv_cache_host_memory_bytes",
        "kv_cache_onboard_blocks",
        "enable_trt_overlap",
        "exclude_input_in_output",
        "cancellation_check_period_ms",
        "stats_check_period_ms",
        "iter_stats_max_iterations",
        "request_stats_max_iterations",
        "enable_kv_cache_reuse",
        "normalize_log_probs",
        "enable_chunked_context",
        "gpu_device_ids",
        "participant_ids",
        "num_nodes",
        "lora_cache_optimal_adapter_size",
        "lora_cache_max_adapter_size",
        "lora_cache_gpu_memory_fraction",
        "lora_cache_host_memory_bytes",
        "lora_prefetch_dir",
        "decoding_mode",
        "executor_worker_path",
        "lookahead_window_size",
        "lookahead_ngram_size",
        "lookahead_verification_set_size",
        "medusa_choices",
        "eagle_choices",
        "gpu_weights_percent",
        "enable_context_fmha_fp32_acc",
        "multi_block_mode",
        "cuda_graph_mode",
        "cuda_graph_cache_size",
        "speculative_decoding_fast_logits",
        "tokenizer_dir",
        "guided_decoding_backend",
        "xgrammar_tokenizer_info_path",
        "recv_poll_period_ms",
    }
)


def _bool(value: bool) -> str:
    return "true" if value else "false"  # the C++ backend accepts true/false (and True/1/...)


def gpu_device_ids(variant: VariantPlan) -> list[int]:
    """One GPU per rank: the spec's list, else 0..tp*pp-1 (the plan already checked the length)."""
    ids = variant.serving.gpu_device_ids
    return list(ids) if ids is not None else list(range(variant.world_size))


def deployed_engine_path(variant: VariantPlan, engine_dir: Path) -> PurePosixPath:
    """``gpt_model_path``: the engine where the deployment mounts the engines root (deploy.mount_path).

    The engines root holds ``<variant>/engine`` (the plan's layout), so the path keeps the engine
    folder's last two parts: ``/models/engines/base/engine`` for ``engines/base/engine``. Absolute:
    the C++ backend reads it as given (a relative one resolves against the server's working
    directory); ``specdeploy serve`` elsewhere rewrites it against ``--engines-dir``
    (:mod:`pipeline.triton.relocate`).
    """
    engine_dir = Path(engine_dir)
    return variant.deploy.engines_root / engine_dir.parent.name / engine_dir.name


def packaged_engine_path(engine_dir: Path, repository: Path) -> str:
    """``reference_engine_path``: the engine relative to a model folder of ``repository`` (all sit one
    level down), where the CPU reference backend looks when ``gpt_model_path`` holds no engine. It
    holds wherever the engines and Triton repository roots move together."""
    model_folder = Path(repository).resolve() / "model"
    return os.path.relpath(Path(engine_dir).resolve(), model_folder)


def tensorrt_llm_parameters(variant: VariantPlan, engine_dir: Path, repository: Path) -> dict[str, str]:
    """The tensorrt_llm model's parameters for ``engine_dir``, packaged into ``repository``."""
    spec = variant.speculative
    params = {
        "max_beam_width": str(variant.build.max_beam_width),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(deployed_engine_path(variant, engine_dir)),
        "batch_scheduler_policy": variant.serving.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": repr(float(variant.serving.kv_cache_free_gpu_mem_fraction)),
        "enable_kv_cache_reuse": _bool(variant.serving.enable_kv_cache_reuse),
        # Clients want the completion; a request can still ask for the prompt back.
        "exclude_input_in_output": "true",
        "enable_chunked_context": "false",
        "gpu_device_ids": ",".join(str(i) for i in gpu_device_ids(variant)),
        "decoding_mode": METHODS[spec.method].triton_decoding_mode,
    }
    if variant.target == "reference":  # the GPU backend has no use for it
        params["reference_engine_path"] = packaged_engine_path(engine_dir, repository)
    if spec.medusa is not None:
        params["medusa_choices"] = trees.to_triton_choices(spec.medusa.tree)
    if spec.eagle is not None and spec.eagle.tree is not None:  # a dynamic tree has no choices to send
        params["eagle_choices"] = trees.to_triton_choices(spec.eagle.tree)
    if spec.eagle is not None and spec.eagle.dynamic_tree:
        # EAGLE-2 is not exposed by the C++ backend (it ignores unknown keys); the reference backend reads these.
        params["reference_eagle_use_dynamic_tree"] = "true"
        params["reference_eagle_dynamic_tree_max_top_k"] = str(spec.eagle.dynamic_tree_max_top_k)
    if spec.lookahead is not None:
        # All three or the backend throws; equal to the engine's build or it asserts at load (#710).
        look = spec.lookahead
        params.update(look.triton_parameters())
    check_parameter_keys(params)
    return params


# Parameters only the CPU reference backend reads; the C++ backend ignores keys it does not know.
REFERENCE_PARAMETER_KEYS = frozenset(
    {
        "reference_eagle_use_dynamic_tree",
        "reference_eagle_dynamic_tree_max_top_k",
        "reference_num_threads",
        "reference_engine_path",
    }
)


def check_parameter_keys(params: dict[str, str]) -> None:
    unknown = sorted(set(params) - TENSORRT_LLM_PARAMETER_KEYS - REFERENCE_PARAMETER_KEYS)
    if unknown:
        raise StageError(f"tensorrt_llm parameters not read by the TensorRT-LLM backend: {', '.join(unknown)}")
