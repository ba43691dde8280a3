"""specdeploy: build and deploy TensorRT-LLM 1.2 engines with speculative decoding."""

__version__ = "0.1.0"
