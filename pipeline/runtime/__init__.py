"""The CPU reference backend: the ``tensorrt_llm`` Triton model's contract implemented in PyTorch.

Modules (each small; read top-down):
* ``config``: the engine folder's config.json -> typed limits and model shape;
* ``kv_cache``: per-request contiguous KV cache (grow by doubling, keep/truncate for drafts);
* ``engine``: all tp/pp ranks in one process, one batched forward over several requests, layer
  math from ``pipeline.checkpoint.reference_forward``;
* ``gemm``: weight matmuls in the engine's dtype (float32, or bf16 through oneDNN);
* ``request`` / ``sampling``: what a client asks for, TensorRT-LLM sampling semantics;
* ``decoding``: the per-request step plug-in and the method choice; ``medusa``, ``eagle``
  (EAGLE-1 and EAGLE-2) and ``lookahead`` on top of ``tree_verify``;
* ``exactness``: how far a bf16 engine's speculative output may be from plain decoding (near-ties);
* ``scheduler``: in-flight batching, limits, stop rules, cancellation, per-request metrics;
* ``triton_io`` / ``triton_backend`` / ``metrics``: the Triton Python-backend adapter;
* ``bench_batching``: tokens/s at concurrency 1 vs 8 (``python -m pipeline.runtime.bench_batching``).
"""

from pipeline.runtime.config import EngineConfig, load_engine_config
from pipeline.runtime.decoding import Accepted, DecodingMethod, PlainDecoding, Sequence, make_method
from pipeline.runtime.engine import Engine, Logits, StepInput, StepRows
from pipeline.runtime.kv_cache import KVCache
from pipeline.runtime.request import FinishReason, GenerationRequest, RequestMetrics, SamplingParams, StepOutput
from pipeline.runtime.scheduler import Scheduler, StepStats

__all__ = ["Accepted", "DecodingMethod", "Engine", "EngineConfig", "FinishReason", "GenerationRequest", "KVCache",
           "Logits", "PlainDecoding", "RequestMetrics", "SamplingParams", "Scheduler", "Sequence", "StepInput",
           "StepOutput", "StepRows", "StepStats", "load_engine_config", "make_method"]
