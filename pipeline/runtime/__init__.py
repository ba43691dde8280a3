"""The CPU reference backend: the ``tensorrt_llm`` Triton model's contract implemented in PyTorch.

Four layers, each a folder; imports run one way (triton -> serving -> spec_decode -> model):

* ``model/``: the engine folder's config (``config``), its rank files (``weights``), the Llama layer
  math (``layers``), weight GEMMs in the engine's dtype (``gemm``), the per-request KV cache
  (``kv_cache``) and the batched forward over all tp/pp ranks in one process (``engine``);
* ``spec_decode/``: one generation step per request: the ``DecodingMethod`` base and plain
  decoding (``base``), draft-tree verification (``tree_verify``), ``medusa``, ``eagle/`` (drafter,
  tree rules, decoding loop) and ``lookahead``, the method choice (``factory``), and how far a
  bf16 engine's speculative output may be from plain decoding (``exactness``);
* ``serving/``: in-flight batching, limits, stop rules and cancellation (``scheduler``) and the
  speculative-decoding and Prometheus metrics (``metrics``);
* ``triton/``: the Triton Python-backend adapter (``backend``) over the pure request/response
  mapping (``io``).

``request`` (what a client asks for and gets back) and ``sampling`` (TensorRT-LLM's sampling
semantics) are the vocabulary every layer shares; they import nothing else from the runtime.
"""
