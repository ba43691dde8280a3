"""TensorRT-LLM's PyTorch backend on GPUs: the LLM API loads the Hugging Face checkpoint (or
ModelOpt's FP8 export) directly, served by ``trtllm-serve`` (an OpenAI-compatible HTTP server) with an
``--extra_llm_api_options`` YAML; no checkpoint conversion, no engine build.

The default flow of TensorRT-LLM 1.2 and the only one after it (``docs/source/legacy/
tensorrt-backend-removal.md``). Its speculative methods differ from the engine flow's: NGram and
EAGLE-3 here, no Medusa, Lookahead or EAGLE-1/2 (``tensorrt_llm/llmapi/llm_args.py``'s decoding
config classes); it applies LoRA adapters to the target while speculating (one shared draft), and
runs no speculation under pipeline parallelism (``docs/source/features/feature-combination-matrix.md``).
The rules, each with file, commit and line: ``pipeline/targets/pytorch_sources.json``.
"""

from __future__ import annotations

from pipeline.targets.base import TargetDefinition

DEFINITION = TargetDefinition(
    name="pytorch",
    title="TensorRT-LLM's PyTorch backend (LLM API, trtllm-serve) on GPUs",
    on_gpus=True,
    builds_engines=False,
    lora_on_bfloat16=True,  # the LLM API's LoRA loads PEFT adapters in the model's dtype
    dynamic_eagle_trees=False,  # EAGLE-1/2 do not run here at all (EAGLE-3's dynamic tree is its own)
    http_body_limit=None,
    # The adapters apply to the target, one drafter serves them all (NGram's pool; EAGLE-3's drafter, fed
    # the adapted target's hidden states). NGram + LoRA crashed until NVIDIA/TensorRT-LLM PR #12661, which
    # added LoRA +- speculative decoding tests; the feature matrix still marks the pair "Untested".
    lora_speculative_methods=("ngram", "eagle3"),
    pipeline_parallel_speculation=False,  # the feature-combination matrix: "No"
)
