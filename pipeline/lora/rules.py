"""What TensorRT-LLM 1.2.1's engine flow allows for LoRA, each rule with the source it was read from.

Sources (NVIDIA/TensorRT-LLM, read at the commits named; the v1.2.1 tag's own commit could not be
resolved here, these are the 1.2-era versions of the files in the public index):

* ``examples/hf_lora_convert.py`` @ 05316d3313360012536ace46c781518f5afae75e: the runtime format.
  For each (layer, module) of a PEFT adapter one row of ``lora_weights``: lora_A [r, in] flattened,
  then ``scale * lora_B`` [out, r] flattened (scale = alpha / r, alpha / sqrt(r) with rsLoRA),
  rows zero-padded to the longest; ``lora_weights`` [1, rows, max_row], ``lora_config`` [1, rows, 3]
  int32 of (module id, layer, adapter size = r); saved as ``model.lora_weights.npy`` /
  ``model.lora_config.npy``. HF module names map to TensorRT-LLM's as in :data:`HF_TO_TRTLLM`
  (note ``gate_proj`` -> ``mlp_h_to_4h``, ``up_proj`` -> ``mlp_gate``).
* ``tensorrt_llm/lora_manager.py`` @ 30e6fb55eb2a1dc42ae875213e83f00008422330: ``LORA_MODULE_IDS``.
* ``cpp/tensorrt_llm/runtime/loraUtils.cpp`` @ 2a9abd9536aa62ad3e4b9314be9286b1b1be523b: a request's
  tensors are checked: ``lora_task_id`` must be set, weights and config come together with batch 1,
  the weights' data type equals the engine's, every layer in range, adapter size > 0 and at most
  ``max_lora_rank``, every module enabled at build time (:data:`REQUEST_CHECKS`).
* ``cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp`` @ 9df6d722b0202549c3ac13add233baebdd12f8d8:
  the first request of a task id carries the weights, later ones the id alone; an id that is not
  cached is an error (:data:`UNKNOWN_TASK`); ``lora_prefetch_dir`` loads ``<dir>/<task id>/
  model.lora_{weights,config}.npy`` (folder names all digits, others skipped) into the host cache
  at startup; the adapter sizes are capped at ``max_lora_rank``; host cache default 1 GiB
  (``lora_cache_host_memory_bytes``), device cache a fraction of free GPU memory
  (``lora_cache_gpu_memory_fraction``, default 0.05), each must hold one adapter of
  ``lora_cache_max_adapter_size`` (else "Not enough space allocated to ... LoRA cache").
* ``cpp/tensorrt_llm/runtime/loraCache.cpp`` @ 063e02f73410f2f9172a581ca5e3f41d0d3dab8e: eviction
  takes the least recently used *done* tasks (no request in flight); when only in-progress tasks
  remain: "Cache is full. There are no done tasks to evict" (:data:`CACHE_FULL`).
* bfloat16: ``cpp/tensorrt_llm/runtime/utils/numpyUtils.cpp`` @ 05316d3313360012536ace46c781518f5afae75e
  (``typeFromNumpyDesc``: bool, u1, i1, i4, i8, f2, f4; numpy has no bfloat16) is what
  ``lora_prefetch_dir`` reads with, and the prefetch path puts the file's tensor into the cache
  unchecked; a float16 adapter prefetched into a bfloat16 engine is silently not applied
  (triton-inference-server/tensorrtllm_backend#791), and sent with a request it is refused by the
  dtype check (NVIDIA/TensorRT-LLM#2434); NVIDIA's ``tensorrt_llm`` config declares ``lora_weights``
  FP16 and its ``hf_lora_convert.py`` cannot write bfloat16 (tensorrtllm_backend#403). So a shared
  LoRA engine on GPUs is float16 or float32 (:data:`BFLOAT16_REFUSAL`).
* Speculative decoding: ``tensorrt_llm/models/eagle/model.py`` @ 06255cb759835a9797b656aa5d1dc8f7e75fdca6
  runs its EagleNets (``EagleNet.forward``) without ``lora_params``: the drafter of a LoRA engine
  is the unadapted base drafter; ``tensorrt_llm/models/medusa/model.py`` @
  0249976575050d2c624a5f285683c66de311a3b7 passes them to the base model only, its heads are
  shared by every adapter. No example, test or document of the 1.2 engine flow combines the LoRA
  plugin with any speculative mode; the PyTorch flow's feature-combination matrix marks LoRA with
  speculative decoding "Untested", and NGram + LoRA crashed there (NVIDIA/TensorRT-LLM#12617,
  fixed by PR #12661 after 1.2). So a shared LoRA engine is planned with plain decoding only
  (:func:`speculative_refusal`); a fine-tune that wants Medusa, EAGLE or Lookahead is merged.
"""

from __future__ import annotations

from pipeline import methods, targets

# tensorrt_llm/lora_manager.py LoraManager.LORA_MODULE_IDS (the decoder modules of a Llama).
MODULE_IDS: dict[str, int] = {
    "attn_qkv": 0,
    "attn_q": 1,
    "attn_k": 2,
    "attn_v": 3,
    "attn_dense": 4,
    "mlp_h_to_4h": 5,
    "mlp_4h_to_h": 6,
    "mlp_gate": 7,
}
MODULE_NAMES: dict[int, str] = {v: k for k, v in MODULE_IDS.items()}

# examples/hf_lora_convert.py hf_modules_to_trtllm_modules, for a Llama.
HF_TO_TRTLLM: dict[str, str] = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "up_proj": "mlp_gate",
    "down_proj": "mlp_4h_to_h",
}
TRTLLM_TO_HF: dict[str, str] = {v: k for k, v in HF_TO_TRTLLM.items()}

CONFIG_ROW = 3  # (module id, layer, adapter size); loraUtils.cpp also accepts 4 (DoRA flag)
MAX_LORA_RANK_DEFAULT = 64  # trtllm-build --max_lora_rank
PREFETCH_FILES = ("model.lora_weights.npy", "model.lora_config.npy")

# peftCacheManager.cpp / loraCache.cpp message texts, which the reference backend reproduces.
UNKNOWN_TASK = "LoRA task {task_id} not found in cache. Please send LoRA weights with request"
CACHE_FULL = "Cache is full. There are no done tasks to evict"
PEFT_CACHE_FULL = "PEFT Cache is full. Could not store taskId={task_id}"
# numpy.finfo(float16).max: an adapter value there has overflowed (refused by the lora stage and on requests).
FLOAT16_MAX = 65504.0

REQUEST_CHECKS = {
    "no_task_id": "lora_task_id must be set for LoRA inference",
    "pair": "Request for LoRA inference must have both lora_weights and lora_keys",
    "dtype": "Expected lora weights to be the same data type as base model",
    "layer": "Expected layerId to be in the range [0, numModelLayers)",
    "size": "Expected adapterSize to be > 0",
    "module": "lora module {module} not enabled for this model",
    "few_values": "lora_weights has to few values for {module}",  # sic, TensorRT-LLM's text
    "rank": "Invalid low_rank ({rank}). low_rank must be smaller than mMaxLowRank ({max_rank})",
}

# Triton tensorrt_llm model parameters of the LoRA cache (executor PeftCacheConfig) and the defaults
# the C++ side applies when they are left unset.
# (cpp/include/tensorrt_llm/batch_manager/peftCacheManagerConfig.h.)
HOST_CACHE_DEFAULT_BYTES = 1 << 30  # kDefaultHostCacheSize
GPU_CACHE_DEFAULT_FRACTION = 0.05  # kDefaultDeviceCachePercent
OPTIMAL_ADAPTER_SIZE_DEFAULT = 8
MAX_ADAPTER_SIZE_DEFAULT = 64


# The numpy dtype an engine's adapters are written in (``model.lora_weights.npy``) and the Triton data
# type its repository declares for ``lora_weights``, by the engine's dtype. TensorRT-LLM takes LoRA
# weights only in the engine's dtype (loraUtils.cpp, ``loraValidateRequestTensors``; a prefetched one
# is copied into cache pages of that dtype), and NVIDIA's ``inflight_batcher_llm_client.py --lora-path``
# sends the files' own dtype. numpy has no bfloat16 (numpyUtils.cpp), so a bfloat16 engine's
# adapters are float16, which only the CPU reference target serves (widened; :data:`BFLOAT16_REFUSAL`).
ADAPTER_NUMPY_DTYPE = {"float32": "float32", "float16": "float16", "bfloat16": "float16"}
_TRITON_TYPES = {"float32": "FP32", "float16": "FP16"}


def lora_weights_data_type(engine_dtype: str) -> str:
    """The ``lora_weights`` data type a repository declares for an engine of ``engine_dtype``."""
    return _TRITON_TYPES[ADAPTER_NUMPY_DTYPE[engine_dtype]]


BFLOAT16_REFUSAL = (
    "TensorRT-LLM 1.2.1 cannot serve adapters to a bfloat16 engine: lora_prefetch_dir reads numpy files, which "
    "have no bfloat16 (numpyUtils.cpp), and a float16 adapter there is silently not applied "
    "(tensorrtllm_backend#791); set model.dtype: float16 for the base and its fine-tunes, or serving.lora: merged"
)


def speculative_refusal(method: str, target: str) -> str | None:
    """Why a shared LoRA engine of ``target`` cannot use ``method``, or None (it can, or plain decoding).

    The engine flow (TensorRT-LLM 1.2.1) combines the LoRA plugin with no speculative mode; the PyTorch
    backend applies the adapters to the target while it speculates with one shared draft
    (:attr:`pipeline.targets.base.TargetDefinition.lora_speculative_methods`).

    >>> speculative_refusal("none", "tensorrt") is None
    True
    >>> speculative_refusal("eagle", "tensorrt").startswith("EAGLE")
    True
    >>> speculative_refusal("ngram", "pytorch") is None
    True
    """
    what = methods.definition(method).lora_refusal
    if what is None or method in targets.definition(target).lora_speculative_methods:
        return None
    elsewhere = [t.name for t in targets.definitions() if method in t.lora_speculative_methods]
    on = f"target: {' or '.join(elsewhere)} (adapted target, one shared draft), " if elsewhere else ""
    return (
        f"{what}; TensorRT-LLM 1.2.1's engine flow has no test, example or document combining the LoRA "
        "plugin with speculative decoding (NVIDIA/TensorRT-LLM#12617: NGram + LoRA crashed until PR #12661, "
        f"after 1.2); serve this fine-tune with {on}serving.lora: merged, or set speculative.method: none"
    )


def module_dims(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA module of a Llama decoder layer (TensorRT-LLM's
    ``LoraModule::createLoraModules``, cpp/tensorrt_llm/runtime/loraModule.cpp).

    >>> module_dims(576, 9, 3, 64, 1536)["attn_k"]
    (576, 192)
    """
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "attn_qkv": (hidden, q + 2 * kv),
        "attn_q": (hidden, q),
        "attn_k": (hidden, kv),
        "attn_v": (hidden, kv),
        "attn_dense": (q, hidden),
        "mlp_h_to_4h": (hidden, intermediate),
        "mlp_4h_to_h": (intermediate, hidden),
        "mlp_gate": (hidden, intermediate),
    }
