"""Many LoRA fine-tunes on one engine: TensorRT-LLM 1.2.1's rules, the adapter conversion, LoRA groups."""
