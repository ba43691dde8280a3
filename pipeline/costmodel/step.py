"""What one decoding step is, for the cost model's two step models: the records they share.

One step of ``b`` requests, each feeding ``T`` rows (1 for plain decoding; 1 + draft tokens for a
verification pass) over a context of ``L`` cached tokens, on one tensor-parallel group of ``tp``
GPUs and ``pp`` pipeline stages. A :class:`Deployment` says where and how the target runs (its
shape, the device, weight and KV dtypes, tp/pp, ``L``, the runtime's constants), a :class:`Drafting`
what a method adds per step, and a :class:`StepCost` holds the seconds of a step by part.

Each method's rows and own work (:class:`Drafting`):

* plain decoding: one row per request, logits for it;
* Medusa: K heads, each a ResBlock (hidden x hidden) and its own lm_head, over one row per request (the
  last accepted token's hidden state); rows fed = 1 + tree nodes;
* EAGLE-1 / EAGLE-2: per tree level, one drafter pass (fc 2 hidden x hidden + one decoder layer) and
  one lm_head pass over the nodes expanded at that level (level 0, over the accepted tokens, takes
  the logits of the last one only); rows fed = 1 + tree nodes;
* Lookahead (W, N, G): no weights; rows fed = (W + G)(N - 1) = 1 + max_draft_len.

Two models price a step, each documented in its module: :mod:`pipeline.costmodel.step_gpu`, a
roofline of the target plus each method's work on a GPU (from datasheet figures and the runtime's
constants), and :mod:`pipeline.costmodel.step_cpu`, the CPU reference backend's device (weights
streamed, then GEMMs as the host's probe measured them). :mod:`pipeline.costmodel.pricing` picks one
by the deployment's device.

Byte and FLOP counts come from ``ModelGeometry`` (pipeline/geometry.py; the presets in pipeline/presets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline import trees
from pipeline.costmodel import hardware
from pipeline.costmodel.hardware import GpuPerf
from pipeline.costmodel.profile import RuntimeProfile
from pipeline.geometry import ModelGeometry
from pipeline.methods.lookahead import LookaheadConfig

Dtype = Literal["bfloat16", "fp8"]
DTYPE_BYTES = {"bfloat16": 2, "fp8": 1}
ACTIVATION_BYTES = 2  # activations and all-reduce payloads stay bf16


@dataclass(frozen=True)
class Deployment:
    """Where and how the target runs: the shape, the GPU, weight and KV dtypes, tp/pp, context."""

    arch: ModelGeometry
    gpu: GpuPerf
    dtype: Dtype = "bfloat16"
    kv_dtype: Dtype = "bfloat16"
    tp: int = 1
    pp: int = 1
    context_len: int = 1024  # cached tokens per request the attention reads
    step_overhead_s: float = hardware.STEP_OVERHEAD_S
    profile: RuntimeProfile | None = None  # None: hardware's assumptions (TensorRT-LLM's, unfitted)

    def constants(self) -> RuntimeProfile:
        """The runtime constants this deployment is priced with (read at call time, so the
        hardware module's assumptions can be changed in one place)."""
        if self.profile is not None:
            return self.profile
        return RuntimeProfile(
            runtime="trtllm",
            bandwidth_efficiency=hardware.BANDWIDTH_EFFICIENCY,
            compute_efficiency=hardware.COMPUTE_EFFICIENCY,
            row_compute=0.0,
            host_step_s=self.step_overhead_s,
            host_layer_s=0.0,
            level_s=hardware.PASS_OVERHEAD_S,
        )


@dataclass(frozen=True)
class Drafting:
    """A method's per-step work besides the verification pass, per request."""

    method: Literal["none", "medusa", "eagle", "lookahead"]
    rows: int  # rows fed to the target per request per step
    medusa_heads: int = 0
    eagle_level_rows: tuple[int, ...] = ()  # drafter rows per request at each tree level

    @classmethod
    def plain(cls) -> Drafting:
        return cls("none", 1)

    @classmethod
    def medusa(cls, tree: trees.Tree, num_heads: int | None = None) -> Drafting:
        return cls("medusa", 1 + len(tree), medusa_heads=num_heads or trees.tree_depth(tree))

    def eagle_levels(self) -> list[tuple[int, int]]:
        """(drafter rows, lm_head rows) per request of each EAGLE drafter pass: level 0 runs over the
        accepted tokens and takes the logits of the last (the root's children), each further level
        over the nodes it expands, with logits for each."""
        return [(rows, 1 if level == 0 else rows) for level, rows in enumerate(self.eagle_level_rows)]

    @classmethod
    def eagle(cls, tree: trees.Tree) -> Drafting:
        """EAGLE-1's static tree: level 0 runs over the accepted tokens (up to depth + 1 rows), level d
        over the tree's non-leaf nodes at depth d."""
        levels = trees.non_leaves_per_level(tree)
        depth = trees.tree_depth(tree)
        return cls("eagle", 1 + len(tree), eagle_level_rows=(depth + 1, *levels[1:]))

    @classmethod
    def eagle_dynamic(cls, top_k: int, num_layers: int, max_draft_len: int) -> Drafting:
        """EAGLE-2: top_k nodes expanded per level after the first; max_draft_len nodes verified."""
        return cls("eagle", 1 + max_draft_len, eagle_level_rows=(num_layers + 1, *([top_k] * (num_layers - 1))))

    @classmethod
    def lookahead(cls, config: LookaheadConfig) -> Drafting:
        return cls("lookahead", 1 + config.max_draft_len)


@dataclass
class StepCost:
    """Seconds per part of one step; ``total_s`` is their sum."""

    parts: dict[str, float] = field(default_factory=dict)

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds

    @property
    def total_s(self) -> float:
        return sum(self.parts.values())


def attention_flops(d: Deployment, batch: int, rows: int, layers: int) -> float:
    """The attention FLOPs of ``layers`` layers per GPU: ``4 x b x T x L x heads_per_gpu x head_dim x layers``."""
    arch = d.arch
    return 4 * batch * rows * d.context_len * (arch.num_heads / d.tp) * arch.head_dim * layers
