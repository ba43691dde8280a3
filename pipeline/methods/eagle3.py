"""EAGLE-3 (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", arXiv 2503.01840): a drafter that fuses the target's low, middle and high hidden
states (``fc`` over the captured layers) and drafts tokens with one decoder layer, trained with the
drafter fed its own outputs.

TensorRT-LLM's PyTorch backend runs it as ``Eagle3DecodingConfig`` (``decoding_type: Eagle3``, the
drafter folder as ``speculative_model``; tensorrt_llm/llmapi/llm_args.py), the only EAGLE it runs
("EAGLE (v1/v2) draft checkpoints are incompatible"); the engine flow does not. The drafter folder is
the Hugging Face format ModelOpt, SpecForge and NVIDIA publish, read by
:mod:`pipeline.methods.eagle3_reader`. specdeploy deploys it as a linear chain of ``max_draft_len``
drafts, or (``use_dynamic_tree``) as TensorRT-LLM's dynamic tree: ``max_draft_len`` levels, each level
the top-k children (k: ``dynamic_tree_max_topK``) of the k best nodes by cumulative draft
log-probability, of which the best ``max_total_draft_tokens`` nodes are verified (EAGLE-2's rule,
:class:`pipeline.runtime.spec_decode.eagle.trees.DynamicTree`). That is the rule of TensorRT-LLM's own
dynamic tree (NVIDIA/TensorRT-LLM ``tensorrt_llm/_torch/speculative/eagle3_dynamic_tree.py``,
``Eagle3OneModelDynamicTreeWorker``, at commit 470bb72055d5d397c60be4dda1e8f490e7002440: per-node
top-k over the draft vocabulary, a global top-k of the level's k*k candidates by cumulative score,
then one global top-``max_total_draft_tokens`` over every drafted node). Two edge cases differ: where
scores tie exactly, TensorRT-LLM may pick a node without its parent and its tree-building kernel then
drops it, where ours keeps parents first and fills the slot with the next node; and ours drafts no
deeper than a request may still emit. Greedy output is the target's either way. The reference backend's loop is
:class:`pipeline.runtime.spec_decode.eagle3.Eagle3Decoding`, which rehearsal measures and the CPU
stand-in serves.
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


def tree_problem(max_draft_len: int, top_k: int | None, max_total_draft_tokens: int | None) -> str | None:
    """None if a dynamic tree of ``max_draft_len`` levels, ``top_k`` and ``max_total_draft_tokens`` is one
    TensorRT-LLM accepts (Eagle3DecodingConfig: topK > 0 is required; max_total_draft_tokens lies in
    [max_draft_len, topK x max_draft_len]), else why not.

        >>> tree_problem(3, 4, None), tree_problem(3, 4, 13)
        (None, 'max_total_draft_tokens 13 is more than dynamic_tree_max_top_k 4 x max_draft_len 3 = 12')
    """
    if not top_k or top_k < 1:
        return "use_dynamic_tree needs dynamic_tree_max_top_k (TensorRT-LLM requires topK > 0)"
    if max_total_draft_tokens is not None and max_total_draft_tokens < max_draft_len:
        return (
            f"max_total_draft_tokens {max_total_draft_tokens} is less than max_draft_len {max_draft_len} "
            "(the tree's depth needs a node per level)"
        )
    if max_total_draft_tokens is not None and max_total_draft_tokens > top_k * max_draft_len:
        return (
            f"max_total_draft_tokens {max_total_draft_tokens} is more than dynamic_tree_max_top_k {top_k} x "
            f"max_draft_len {max_draft_len} = {top_k * max_draft_len}"
        )
    return None


@dataclass(frozen=True)
class Eagle3Config:
    """TensorRT-LLM's Eagle3DecodingConfig as specdeploy sets it: a chain of ``max_draft_len`` drafts, or
    (``use_dynamic_tree``) a dynamic tree ``max_draft_len`` deep of ``max_total_draft_tokens`` nodes."""

    max_draft_len: int  # the chain's length, the tree's depth
    capture_layers: tuple[int, ...]  # the target layers whose hidden states the drafter fuses
    use_dynamic_tree: bool = False
    dynamic_tree_max_top_k: int | None = None  # k: children per expanded node, nodes expanded per level
    max_total_draft_tokens: int | None = None  # the tree's nodes; None: k x max_draft_len
    draft_vocab_size: int | None = None  # the drafter's lm_head rows (its d2t vocabulary); None: the target's

    @property
    def total_draft_tokens(self) -> int:
        """Draft tokens the target verifies per step: the tree's nodes, or the chain's length."""
        if not self.use_dynamic_tree:
            return self.max_draft_len
        return self.max_total_draft_tokens or (self.dynamic_tree_max_top_k or 1) * self.max_draft_len

    def describe(self) -> str:
        """One line for the plan: ``eagle3: K=3, capture 1,15,28``, or with a dynamic tree
        ``eagle3: K=3, dynamic tree (top-4, 10 nodes), capture 1,15,28``."""
        tree = ""
        if self.use_dynamic_tree:
            tree = f", dynamic tree (top-{self.dynamic_tree_max_top_k}, {self.total_draft_tokens} nodes)"
        return f"eagle3: K={self.max_draft_len}{tree}, capture {','.join(map(str, self.capture_layers))}"

    def drafting(self) -> Drafting:
        """A step's drafter passes and verified rows: the chain's, or the dynamic tree's."""
        if self.use_dynamic_tree:
            top_k = self.dynamic_tree_max_top_k or 1
            drafting = Drafting.eagle3_dynamic(
                top_k, self.max_draft_len, self.total_draft_tokens, len(self.capture_layers)
            )
        else:
            drafting = Drafting.eagle3(self.max_draft_len, len(self.capture_layers))
        return dataclasses.replace(drafting, draft_vocab=self.draft_vocab_size or 0)

    def drafter_params(self, arch: ModelGeometry) -> int:
        """The drafter's parameters: ``fc`` over the captured layers, one decoder layer whose q/k/v read
        [embedding; fused hidden] (2 x hidden), its norms, and an lm_head over the vocabulary (ModelOpt
        always exports one; a reduced draft vocabulary makes it smaller)."""
        h = arch.hidden_size
        wider_qkv = h * arch.head_dim * (arch.num_heads + 2 * arch.num_kv_heads)
        fc = len(self.capture_layers) * h * h
        return fc + arch.decoder_layer_params() + wider_qkv + 2 * h + (self.draft_vocab_size or arch.vocab_size) * h

    def engine_heads_params(self, arch: ModelGeometry, tp: int) -> int:
        """The drafter's parameters the server holds, all ranks together: :meth:`drafter_params`."""
        return self.drafter_params(arch)

    def stored_heads_params(self, arch: ModelGeometry) -> int:
        """The drafter's parameters as stored: :meth:`drafter_params`."""
        return self.drafter_params(arch)

    def llm_api_config(self, drafter: PurePosixPath) -> dict[str, object]:
        """The LLM API's ``speculative_config``; ``drafter``: the folder where the deployment mounts it.
        The dynamic tree's keys only when it is on (TensorRT-LLM warns about a topK without it)."""
        config: dict[str, object] = {
            "decoding_type": "Eagle3",
            "max_draft_len": self.max_draft_len,
            "speculative_model": str(drafter),
            "eagle3_layers_to_capture": list(self.capture_layers),
        }
        if self.use_dynamic_tree:
            config["use_dynamic_tree"] = True
            config["dynamic_tree_max_topK"] = self.dynamic_tree_max_top_k
            config["max_total_draft_tokens"] = self.total_draft_tokens
        return config


def modelopt_capture_layers(num_layers: int) -> tuple[int, ...]:
    """The layers ModelOpt 0.47 captures by default (``default_eagle_aux_layer_ids``): TensorRT-LLM's
    (1, L//2-1, L-4) for L >= 6, clipped and deduplicated below.

        >>> modelopt_capture_layers(30), modelopt_capture_layers(2)
        ((1, 14, 26), (0, 1))
    """
    return tuple(sorted({1, max(0, num_layers // 2 - 1), max(0, num_layers - 4)}))


def _drafting(
    variant: VariantSpec, capture_layers: tuple[int, ...], problems: Problems, draft_vocab: int | None = None
) -> Eagle3Config | None:
    """The spec's chain or dynamic tree (TensorRT-LLM's rules, reported at the spec line) for a drafter of
    these layers and this draft vocabulary (None: unknown until it is trained, priced at the target's)."""
    settings = variant.speculative.eagle3
    where = ("speculative", "eagle3")
    if not settings.use_dynamic_tree:
        if settings.max_total_draft_tokens not in (None, settings.max_draft_len):
            problems.error(
                (*where, "max_total_draft_tokens"),
                f"{settings.max_total_draft_tokens} with a linear chain, which verifies max_draft_len "
                f"{settings.max_draft_len} tokens; set use_dynamic_tree: true or remove it",
            )
            return None
        if settings.dynamic_tree_max_top_k is not None:
            problems.note("speculative.eagle3.dynamic_tree_max_top_k is ignored without use_dynamic_tree")
        return Eagle3Config(settings.max_draft_len, capture_layers, draft_vocab_size=draft_vocab)
    problem = tree_problem(settings.max_draft_len, settings.dynamic_tree_max_top_k, settings.max_total_draft_tokens)
    if problem is not None:
        key = "max_total_draft_tokens" if settings.dynamic_tree_max_top_k else "dynamic_tree_max_top_k"
        problems.error((*where, key), problem)
        return None
    top_k = settings.dynamic_tree_max_top_k
    assert top_k is not None  # tree_problem requires it
    total = settings.max_total_draft_tokens or top_k * settings.max_draft_len
    return Eagle3Config(settings.max_draft_len, capture_layers, True, top_k, total, draft_vocab)


def resolve(
    variant: VariantSpec, arch: ModelGeometry, heads_dir: Path | None, problems: Problems
) -> Eagle3Config | None:
    assert heads_dir is not None  # the planner asks for heads.eagle3 first
    heads = variant.heads.eagle3
    if heads is not None and heads.train is not None and heads.train.init == "random":
        # The train-heads stage writes it: ModelOpt's default capture layers (pipeline/heads/eagle3.py).
        return _drafting(variant, modelopt_capture_layers(arch.num_layers), problems)
    layout = read_heads(HEADS, heads_dir, lambda folder: read_eagle3(folder, arch), problems)
    if layout is None:
        return None
    return _drafting(variant, tuple(layout.capture_layers), problems, layout.draft_vocab_size)


def measured(build: dict[str, Any], built: Eagle3Config | None) -> Eagle3Config | None:
    """The drafter the candidates were built with, drafting what was measured: ``[K]``, a chain of K;
    ``[K, k, nodes]``, a dynamic tree K deep (pipeline.evaluation.apply.candidate_build)."""
    if built is None or not build.get("eagle3"):
        return None
    k, *tree = (int(v) for v in build["eagle3"])
    if not tree:
        return dataclasses.replace(
            built, max_draft_len=k, use_dynamic_tree=False, dynamic_tree_max_top_k=None, max_total_draft_tokens=None
        )
    if len(tree) != 2 or tree_problem(k, tree[0], tree[1]) is not None:
        return None
    return dataclasses.replace(
        built, max_draft_len=k, use_dynamic_tree=True, dynamic_tree_max_top_k=tree[0], max_total_draft_tokens=tree[1]
    )


def recorded(candidate: Any) -> dict[str, Any]:
    """``[K]`` for a chain, ``[K, top-k, nodes]`` for a dynamic tree (read back by :func:`measured`)."""
    config = candidate.settings.eagle3
    if not config:
        return {"eagle3": None}
    if not config.use_dynamic_tree:
        return {"eagle3": [config.max_draft_len]}
    return {"eagle3": [config.max_draft_len, config.dynamic_tree_max_top_k, config.total_draft_tokens]}


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
    cost_terms=("level_s", "tree_row_s"),  # tree_row_s: the dynamic tree's rows
    lora_refusal="EAGLE-3",
    llm_api_decoding_type="Eagle3",
    recorded=recorded,
    recorded_keys=("eagle3",),
    selected_by_settings=True,  # the PyTorch backend builds its engine with no mode: its settings select it
)
