"""EAGLE-3 (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", arXiv 2503.01840): a drafter that fuses the target's low, middle and high hidden
states (``fc`` over the captured layers) and drafts tokens with one decoder layer, trained with the
drafter fed its own outputs.

TensorRT-LLM's PyTorch backend runs it as ``Eagle3DecodingConfig`` (``decoding_type: Eagle3``, the
drafter folder as ``speculative_model``; tensorrt_llm/llmapi/llm_args.py), the only EAGLE it runs
("EAGLE (v1/v2) draft checkpoints are incompatible"); the engine flow does not. The drafter folder is
the Hugging Face format ModelOpt, SpecForge and NVIDIA publish, read by
:mod:`pipeline.methods.eagle3_reader`. specdeploy deploys it as a linear chain of ``max_draft_len``
drafts; the reference backend's loop is :class:`pipeline.runtime.spec_decode.eagle3.Eagle3Decoding`,
which rehearsal measures and the CPU stand-in serves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pipeline.geometry import ModelGeometry
from pipeline.methods.base import HeadsNeed, MethodDefinition, Problems, read_heads
from pipeline.methods.drafting import Drafting
from pipeline.methods.eagle3_reader import read_eagle3

if TYPE_CHECKING:
    from pipeline.spec.document import VariantSpec

HEADS = HeadsNeed(
    key="eagle3",
    holds="an EAGLE-3 drafter (config.json and model.safetensors, as ModelOpt exports it)",
    training_target=3.0,
    splits_on_hidden=False,  # the LLM API loads the folder as it is; no convert stage splits it
    trainable=True,  # heads.eagle3.train: ModelOpt trains it (pipeline/heads/eagle3.py)
)


@dataclass(frozen=True)
class Eagle3Config:
    """TensorRT-LLM's Eagle3DecodingConfig as specdeploy sets it: a chain of ``max_draft_len`` drafts."""

    max_draft_len: int
    capture_layers: tuple[int, ...]  # the target layers whose hidden states the drafter fuses

    def describe(self) -> str:
        """One line for the plan: ``eagle3: K=3, capture 1,15,28``."""
        return f"eagle3: K={self.max_draft_len}, capture {','.join(map(str, self.capture_layers))}"

    def drafting(self) -> Drafting:
        return Drafting.eagle3(self.max_draft_len)

    def drafter_params(self, arch: ModelGeometry) -> int:
        """The drafter's parameters: ``fc`` over the captured layers, one decoder layer whose q/k/v read
        [embedding; fused hidden] (2 x hidden), its norms, and an lm_head over the vocabulary (ModelOpt
        always exports one; a reduced draft vocabulary makes it smaller)."""
        h = arch.hidden_size
        wider_qkv = h * arch.head_dim * (arch.num_heads + 2 * arch.num_kv_heads)
        fc = len(self.capture_layers) * h * h
        return fc + arch.decoder_layer_params() + wider_qkv + 2 * h + arch.vocab_size * h

    def llm_api_config(self, drafter: PurePosixPath) -> dict[str, object]:
        """The LLM API's ``speculative_config``; ``drafter``: the folder where the deployment mounts it."""
        return {
            "decoding_type": "Eagle3",
            "max_draft_len": self.max_draft_len,
            "speculative_model": str(drafter),
            "eagle3_layers_to_capture": list(self.capture_layers),
        }


def modelopt_capture_layers(num_layers: int) -> tuple[int, ...]:
    """The layers ModelOpt 0.47 captures by default (``default_eagle_aux_layer_ids``): TensorRT-LLM's
    (1, L//2-1, L-4) for L >= 6, clipped and deduplicated below.

        >>> modelopt_capture_layers(30), modelopt_capture_layers(2)
        ((1, 14, 26), (0, 1))
    """
    return tuple(sorted({1, max(0, num_layers // 2 - 1), max(0, num_layers - 4)}))


def resolve(
    variant: VariantSpec, arch: ModelGeometry, heads_dir: Path | None, problems: Problems
) -> Eagle3Config | None:
    assert heads_dir is not None  # the planner asks for heads.eagle3 first
    heads = variant.heads.eagle3
    if heads is not None and heads.train is not None and heads.train.init == "random":
        # The train-heads stage writes it: ModelOpt's default capture layers (pipeline/heads/eagle3.py).
        return Eagle3Config(variant.speculative.eagle3.max_draft_len, modelopt_capture_layers(arch.num_layers))
    layout = read_heads(HEADS, heads_dir, lambda folder: read_eagle3(folder, arch), problems)
    if layout is None:
        return None
    return Eagle3Config(variant.speculative.eagle3.max_draft_len, tuple(layout.capture_layers))


def measured(build: dict[str, Any], built: Eagle3Config | None) -> Eagle3Config | None:
    """The drafter the candidates were built with, at the measured chain length."""
    if built is None or not build.get("eagle3"):
        return None
    return dataclasses.replace(built, max_draft_len=int(build["eagle3"][0]))


DEFINITION = MethodDefinition(
    name="eagle3",
    title="EAGLE-3",
    targets=("pytorch",),
    heads=HEADS,
    resolve=resolve,
    measured=measured,
    # Engine-flow fields: TensorRT-LLM 1.2.1's engine flow does not run EAGLE-3.
    build_mode=None,
    triton_decoding_mode="top_k_top_p",
    checkpoint_architecture="LlamaForCausalLM",
    drafts_tree=False,
    auto_reason="auto: an EAGLE-3 drafter present",
    maintenance=4,  # a drafter like EAGLE's, trained on more data (training-time test)
    # The median of published EAGLE-3 drafters' mean acceptance lengths: AngelSlim's Qwen3 1.7B-32B
    # benchmarks (1.79-2.17), the model cards of lmsys/sglang-EAGLE3-Llama-4-Maverick-17B-128E-Instruct-v1
    # (2.45) and lmsys/Qwen3-235B-A22B-EAGLE3 (3.02-3.54).
    prior_acceptance=2.08,
    cost_terms=("level_s",),
    lora_refusal="EAGLE-3",
    llm_api_decoding_type="Eagle3",
)
