"""TensorRT-LLM's LLM API as the PyTorch-backend target deploys it: the ``LLM()`` arguments
(:mod:`.options`) and the files ``trtllm-serve`` and Triton's ``llmapi`` model read (:mod:`.deployment`)."""
