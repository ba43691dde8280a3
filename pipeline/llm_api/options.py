"""A variant's TensorRT-LLM LLM API arguments: the ``--extra_llm_api_options`` YAML of ``trtllm-serve``
and the keys of Triton's ``llmapi`` model (its ``model.yaml`` maps every key to an ``LLM()`` argument).

Every key and value is held to TensorRT-LLM's own classes (``TorchLlmArgs``, ``KvCacheConfig``,
``NGramDecodingConfig``, ``Eagle3DecodingConfig``, ``LoraConfig`` in ``tensorrt_llm/llmapi/llm_args.py``
and the LoRA config it imports) by ``tests/test_pytorch_target.py``, against
``pipeline/targets/pytorch_sources.json`` (file and commit of each). Worked example, the SmolLM2
LoRA fleet's shared engine (NGram, K=4)::

    tensor_parallel_size: 1
    pipeline_parallel_size: 1
    dtype: float32
    max_batch_size: 8
    max_seq_len: 2052          # the plan's max_seq_len plus the draft tokens
    max_num_tokens: 2048
    kv_cache_config: {dtype: auto, max_tokens: 16416}
    speculative_config: {decoding_type: NGram, max_draft_len: 4, max_matching_ngram_size: 2,
                         is_keep_all: true, is_use_oldest: true, is_public_pool: true}
    lora_config: {lora_dir: [], max_lora_rank: 8, max_loras: 8, max_cpu_loras: 8,
                  lora_target_modules: [attn_q, attn_k, attn_v, attn_dense, mlp_4h_to_h, mlp_gate]}
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, cast

from pipeline.plan.types import StagePlan, VariantPlan

# trtllm-serve's --backend for this flow (its default in 1.2; the only one after the engine flow's removal).
BACKEND = "pytorch"


def speculative_config(variant: VariantPlan, drafter: PurePosixPath) -> dict[str, Any] | None:
    """``speculative_config`` as the LLM API parses it (``decoding_type`` picks the class); None: plain.
    ``drafter``: where the deployment mounts an EAGLE-3 drafter."""
    config = variant.speculative.config
    if config is None:
        return None
    make = getattr(config, "llm_api_config", None)  # each method's config says its own (NGramConfig, Eagle3Config)
    if make is not None:
        return cast(dict[str, Any], make(drafter))
    raise ValueError(f"{variant.name}: {variant.speculative.method} has no LLM API decoding config")  # refused at plan


def lora_config(package: StagePlan, adapters_root: PurePosixPath) -> dict[str, Any] | None:
    """``lora_config`` for a LoRA group's engine: the cache sizes the plan chose; the adapters are loaded
    per request (``LoRARequest(name, id, path)``) from ``adapters_root/<task id>``, not preloaded."""
    lora = package.params.get("lora")
    if lora is None:
        return None
    return {
        "lora_dir": [],
        "max_lora_rank": lora["max_lora_rank"],
        "max_loras": lora["max_loras"],
        "max_cpu_loras": lora["max_cpu_loras"],
        "lora_target_modules": list(lora["target_modules"]),
    }


def llm_api_options(
    variant: VariantPlan, package: StagePlan, adapters_root: PurePosixPath, drafter: PurePosixPath
) -> dict[str, Any]:
    """The LLM API arguments of this variant's deployment, beyond the model path and the backend;
    ``adapters_root`` and ``drafter``: where the deployment mounts the adapters and the EAGLE-3 drafter."""
    build = package.params["build"]
    options: dict[str, Any] = {
        "tensor_parallel_size": package.params["parallel"]["tp"],
        "pipeline_parallel_size": package.params["parallel"]["pp"],
        "dtype": build["dtype"],
        "max_batch_size": build["max_batch_size"],
        "max_seq_len": build["engine_max_seq_len"],
        "max_num_tokens": build["engine_max_num_tokens"],
        "kv_cache_config": {
            "dtype": "fp8" if variant.quant.kv_cache_fp8 else "auto",
            # the KV cache the plan's memory estimate holds: a full batch of full sequences
            "max_tokens": build["max_batch_size"] * build["engine_max_seq_len"],
        },
    }
    speculative = speculative_config(variant, drafter)
    if speculative is not None:
        options["speculative_config"] = speculative
    lora = lora_config(package, adapters_root)
    if lora is not None:
        options["lora_config"] = lora
    return options
