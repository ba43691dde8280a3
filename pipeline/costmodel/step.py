"""What one decoding step is, for the cost model's two step models: the records they share.

One step of ``b`` requests, each feeding ``T`` rows (1 for plain decoding; 1 + draft tokens for a
verification pass) over a context of ``L`` cached tokens, on one tensor-parallel group of ``tp``
GPUs and ``pp`` pipeline stages. A :class:`Deployment` says where and how the target runs (its
shape, the device, weight and KV dtypes, tp/pp, ``L``, the runtime's constants), a
:class:`~pipeline.methods.drafting.Drafting` what a method adds per step (each method's rows and
own work are listed there), and a :class:`StepCost` holds the seconds of a step by part.

Two models price a step, each documented in its module: :mod:`pipeline.costmodel.step_gpu`, a
roofline of the target plus each method's work on a GPU (from datasheet figures and the runtime's
constants), and :mod:`pipeline.costmodel.step_cpu`, the CPU reference backend's device (weights
streamed, then GEMMs as the host's probe measured them). :mod:`pipeline.costmodel.pricing` picks one
by the deployment's device.

Byte and FLOP counts come from ``ModelGeometry`` (pipeline/geometry.py; the presets in pipeline/spec/presets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.costmodel import hardware
from pipeline.costmodel.hardware import GpuPerf
from pipeline.costmodel.profile import RuntimeProfile
from pipeline.geometry import ModelGeometry
from pipeline.methods.drafting import Drafting

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


# What each per-draft-row constant prices, as a step's parts name it.
ROW_PARTS: dict[str, str] = {
    "tree_row_s": "tree mask and acceptance",
    "lookahead_row_s": "lookahead mask and n-gram pool",
}


@dataclass
class StepCost:
    """Seconds per part of one step; ``total_s`` is their sum."""

    parts: dict[str, float] = field(default_factory=dict)

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds

    @property
    def total_s(self) -> float:
        return sum(self.parts.values())

    def add_draft_rows(self, drafting: Drafting, k: RuntimeProfile, batch: int) -> None:
        """The runtime's work per draft row the method names (tree mask and acceptance, Lookahead's
        pool), when the profile charges any: the same in both step models."""
        per_row = getattr(k, drafting.row_term) if drafting.row_term else 0.0
        if per_row:
            self.add(ROW_PARTS[drafting.row_term], per_row * batch * (drafting.rows - 1))


def attention_flops(d: Deployment, batch: int, rows: int, layers: int) -> float:
    """The attention FLOPs of ``layers`` layers per GPU: ``4 x b x T x L x heads_per_gpu x head_dim x layers``."""
    arch = d.arch
    return 4 * batch * rows * d.context_len * (arch.num_heads / d.tp) * arch.head_dim * layers
