"""The time of one decoding step: a roofline of the target model plus each method's own work.

One step of ``b`` requests, each feeding ``T`` rows (1 for plain decoding; 1 + draft tokens for a
verification pass) over a context of ``L`` cached tokens, on one tensor-parallel group of ``tp``
GPUs and ``pp`` pipeline stages (sequential for one step: stages add up, so pp does not shorten a
step; it adds a hop per stage boundary). Per GPU:

* weights: ``(decoder_params x w + vocab x hidden x 2) / tp`` bytes are read once per step, w = 2
  for bf16, 1 for FP8 (the lm_head stays bf16: ModelOpt's FP8 recipe leaves ``*lm_head*`` unquantized);
* GEMM FLOPs: ``2 x decoder_params x b x T / tp`` plus ``2 x vocab x hidden x b x R / tp`` for the
  ``R`` rows that need logits (1 for plain decoding, T for a verification pass);
* GEMM time = max(weight bytes / (bandwidth x BANDWIDTH_EFFICIENCY), FLOPs / (peak x
  COMPUTE_EFFICIENCY)), the roofline;
* attention: the KV cache read, ``b x L x layers x 2 x kv_heads_per_gpu x head_dim x kv_bytes``
  (kv_heads_per_gpu = max(kv_heads / tp, 1): heads are replicated when tp > kv_heads), against its
  ``4 x b x T x L x heads_per_gpu x head_dim x layers`` FLOPs, roofline again;
* tensor parallelism: two all-reduces per layer (after attention and after the MLP) of
  ``b x T x hidden x 2`` bytes; a ring all-reduce moves ``2 (tp - 1) / tp`` of them per GPU over the
  link, plus a fixed latency each; pipeline stages add ``pp - 1`` hops of the same activations;
* a fixed per-step overhead (hardware.STEP_OVERHEAD_S), or with a runtime profile
  (:mod:`pipeline.costmodel.profile`) its host work: ``host_step_s + host_layer_s x layers``.

Each method adds its own work (:class:`Drafting` says what it is):

* Medusa: K heads, each a ResBlock (hidden x hidden) and its own lm_head (vocab x hidden, bf16:
  FP8 heads are not supported, TensorRT-LLM#2115), over one row per request (the last accepted
  token's hidden state); rows fed = 1 + tree nodes.
* EAGLE-1 / EAGLE-2: per tree level, one drafter pass (fc 2 hidden x hidden + one decoder layer) and
  one lm_head pass over the nodes expanded at that level (level 0, over the accepted tokens, takes
  the logits of the last one only), each its own roofline, its own KV read (one layer), tp
  all-reduces and a pass overhead; rows fed = 1 + tree nodes.
* Lookahead (W, N, G): no weights; rows fed = (W + G)(N - 1) = 1 + max_draft_len.

With a runtime profile, the costs the roofline leaves out are their own parts: the draft rows' GEMM
work its max() lets ride free below the ridge point (``row_compute`` x their FLOPs / peak, rows
beyond the first, up to where the step is compute-bound anyway), the
tree-attention mask and acceptance work of Medusa and EAGLE (``tree_row_s`` per draft row), EAGLE's
per-level drafter launches (``level_s + host_layer_s`` per level), Lookahead's custom-mask rows and
n-gram pool work (``lookahead_row_s`` per draft row), the runtime's host work per step and per layer.

The CPU device (``hardware.CPU_DEVICE``, the reference backend) is no roofline machine: a pass
streams its weights and then pays for its rows' FLOPs, one after the other. Its step, linear in the
same constants with CPU meanings (``specdeploy calibrate --gpu cpu`` fits them on bench runs):

* ``host_layer_s`` per decoder layer's worth of weights a pass reads (the target's layers and
  lm_head; a Medusa heads pass; an EAGLE drafter level's fc, layer and lm_head), but for the weights
  the probe already timed from memory (those larger than the host's last-level cache: the lm_head);
* ``row_compute`` times the pass's weight GEMMs over all rows of all requests (one GEMM per weight)
  as the device's probe measured them by rows (``GpuPerf.gemms``, gemm_probe.probe: the engine's own
  GEMMs on the host, in cache; a CPU GEMM gets cheaper per row as the rows grow, and the step with
  it), its attention at the qkv GEMM's measured rate; without a probe, seconds per TFLOP of them;
* ``request_s`` per request a step (its sequence's attention, sampling and streamed response);
* ``host_step_s`` per step; ``level_s``, ``tree_row_s`` and ``lookahead_row_s`` as on a GPU.

Byte and FLOP counts come from ``ModelGeometry`` (pipeline/geometry.py; the presets in pipeline/presets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline import trees
from pipeline.costmodel import hardware
from pipeline.costmodel.gemm_probe import Gemms, eagle_level_gemms, gemm_shapes, medusa_gemms, target_gemms
from pipeline.costmodel.hardware import GpuPerf
from pipeline.costmodel.profile import RuntimeProfile
from pipeline.geometry import ModelGeometry
from pipeline.speculative import LookaheadConfig

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
            "trtllm",
            hardware.BANDWIDTH_EFFICIENCY,
            hardware.COMPUTE_EFFICIENCY,
            0.0,
            self.step_overhead_s,
            0.0,
            hardware.PASS_OVERHEAD_S,
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


def roofline_s(
    gpu: GpuPerf, bytes_read: float, flops: float, dtype: str, profile: RuntimeProfile | None = None
) -> float:
    """max(memory time, compute time) at the attainable fractions of the peaks (the profile's, or
    hardware's assumptions)."""
    bandwidth = profile.bandwidth_efficiency if profile else hardware.BANDWIDTH_EFFICIENCY
    peak = profile.compute_efficiency if profile else hardware.COMPUTE_EFFICIENCY
    memory = bytes_read / (gpu.memory_gbps * 1e9 * bandwidth)
    compute = flops / (gpu.peak_flops(dtype) * peak)
    return max(memory, compute)


def allreduce_s(gpu: GpuPerf, tp: int, payload_bytes: float) -> float:
    """One ring all-reduce of ``payload_bytes`` over ``tp`` GPUs (0 for tp = 1)."""
    if tp == 1:
        return 0.0
    return gpu.allreduce_latency_s + 2 * (tp - 1) / tp * payload_bytes / (gpu.link_gbps * 1e9)


def _kv_heads_per_gpu(arch: ModelGeometry, tp: int) -> float:
    return max(arch.num_kv_heads / tp, 1.0)


def attention_s(d: Deployment, batch: int, rows: int, layers: int) -> float:
    """KV-cache read vs attention FLOPs of ``layers`` layers."""
    arch = d.arch
    kv_bytes = (
        batch * d.context_len * layers * 2 * _kv_heads_per_gpu(arch, d.tp) * arch.head_dim * DTYPE_BYTES[d.kv_dtype]
    )
    flops = 4 * batch * rows * d.context_len * (arch.num_heads / d.tp) * arch.head_dim * layers
    return roofline_s(d.gpu, kv_bytes, flops, "bfloat16", d.constants())


def cpu_pass_s(d: Deployment, gemms: Gemms, attention_flops: float = 0.0) -> float:
    """One pass of the CPU device: streaming the weights of its ``gemms``, then the GEMMs and attention."""
    return cpu_streaming_s(d, gemms) + d.constants().row_compute * _cpu_compute_s(d, gemms, attention_flops)


def cpu_streaming_s(d: Deployment, gemms: Gemms) -> float:
    """``host_layer_s`` per decoder layer's worth of the weights of ``gemms`` (one weight a call),
    less those the device's probe timed from memory already (gemm_probe: larger than its cache)."""
    shapes, measured = gemm_shapes(d.arch), d.gpu.gemms
    timed_streaming = measured.out_of_cache if measured is not None else frozenset()
    params = sum(calls * shapes[name][0] * shapes[name][1] for name, calls, _ in gemms if name not in timed_streaming)
    return d.constants().host_layer_s * params / d.arch.decoder_layer_params()


def _cpu_compute_s(d: Deployment, gemms: Gemms, attention_flops: float) -> float:
    """Seconds of ``gemms`` as the device's probe measured them (attention at the qkv GEMM's measured
    rate over the pass's rows), or their FLOPs at its nominal peak."""
    shapes, measured = gemm_shapes(d.arch), d.gpu.gemms
    if measured is None:
        flops = sum(calls * 2 * shapes[name][0] * shapes[name][1] * rows for name, calls, rows in gemms)
        return (flops + attention_flops) / d.gpu.peak_flops("fp32")
    if not gemms:  # a pass that only streams its weights
        return 0.0
    rows = gemms[0][2]
    out, inputs = shapes["qkv"]
    attention_rate = measured.gemm_s("qkv", rows) / (2 * out * inputs * rows)  # seconds per FLOP
    return measured.total_s(gemms) + attention_flops * attention_rate


def _attention_flops(d: Deployment, batch: int, rows: int, layers: int) -> float:
    arch = d.arch
    return 4 * batch * rows * d.context_len * (arch.num_heads / d.tp) * arch.head_dim * layers


def cpu_target_step(d: Deployment, batch: int, rows: int, logit_rows: int) -> StepCost:
    """The CPU device's target pass (see the module docstring): every request's rows in one GEMM."""
    arch, cost, k = d.arch, StepCost(), d.constants()
    gemms = target_gemms(arch.num_layers, batch * rows, batch * logit_rows)
    attention = _attention_flops(d, batch, rows, arch.num_layers)
    cost.add("weight streaming", cpu_streaming_s(d, gemms))
    cost.add("GEMMs and attention", k.row_compute * _cpu_compute_s(d, gemms, attention))
    cost.add("step overhead", k.host_step_s)
    if k.request_s:
        cost.add("per-request work", k.request_s * batch)
    return cost


def cpu_method_step(d: Deployment, drafting: Drafting, batch: int) -> StepCost:
    """The CPU device's method step: Medusa's ResBlocks and one lm_head pass over its heads' rows (the
    reference backend's heads share the base lm_head), EAGLE's fc + layer + lm_head per level."""
    k = d.constants()
    plain = drafting.method == "none"
    cost = cpu_target_step(d, batch, drafting.rows, 1 if plain else drafting.rows)
    drafts = batch * (drafting.rows - 1)
    if drafting.method == "medusa":
        cost.add("medusa heads", cpu_pass_s(d, medusa_gemms(drafting.medusa_heads, batch)))
    elif drafting.method == "eagle":
        for rows, logit_rows in drafting.eagle_levels():
            gemms = eagle_level_gemms(batch * rows, batch * logit_rows)
            cost.add("eagle drafter", cpu_pass_s(d, gemms, _attention_flops(d, batch, rows, 1)) + k.level_s)
    if drafting.method in ("medusa", "eagle") and k.tree_row_s:
        cost.add("tree mask and acceptance", k.tree_row_s * drafts)
    if drafting.method == "lookahead" and k.lookahead_row_s:
        cost.add("lookahead mask and n-gram pool", k.lookahead_row_s * drafts)
    return cost


def target_step(d: Deployment, batch: int, rows: int, logit_rows: int | None = None) -> StepCost:
    """The target model's forward over ``rows`` new tokens per request (logits for ``logit_rows``)."""
    arch, gpu, cost = d.arch, d.gpu, StepCost()
    logit_rows = rows if logit_rows is None else logit_rows
    if gpu.kind == "cpu":
        return cpu_target_step(d, batch, rows, logit_rows)
    decoder = arch.num_layers * arch.decoder_layer_params()
    lm_head = arch.vocab_size * arch.hidden_size
    weight_bytes = (decoder * DTYPE_BYTES[d.dtype] + lm_head * ACTIVATION_BYTES) / d.tp
    flops = 2 * (decoder * batch * rows + lm_head * batch * logit_rows) / d.tp
    k = d.constants()
    roofline = roofline_s(gpu, weight_bytes, flops, d.dtype, k)
    cost.add("weights and GEMMs", roofline)
    memory_bound = roofline_s(gpu, weight_bytes, 0.0, d.dtype, k) >= roofline
    if k.row_compute and rows > 1 and memory_bound:
        # below the ridge the draft rows add their FLOPs at peak x row_compute to the weight read; above
        # it the step is compute-bound and the roofline's compute time already holds them (the branch
        # depends on the roofline alone, so a step stays linear in the constants)
        extra = 2 * (decoder * batch * (rows - 1) + lm_head * batch * max(logit_rows - 1, 0)) / d.tp
        cost.add("draft rows' GEMMs", k.row_compute * extra / gpu.peak_flops(d.dtype))
    cost.add("attention (KV read)", attention_s(d, batch, rows, arch.num_layers))
    activations = batch * rows * arch.hidden_size * ACTIVATION_BYTES
    comm = 2 * arch.num_layers * allreduce_s(gpu, d.tp, activations)
    if d.pp > 1:
        comm += (d.pp - 1) * (gpu.allreduce_latency_s + activations / (gpu.link_gbps * 1e9))
    if comm:
        cost.add("tp/pp communication", comm)
    cost.add("step overhead", k.host_step_s)
    if k.host_layer_s:
        cost.add("layer launches", k.host_layer_s * arch.num_layers)
    return cost


def medusa_heads_s(d: Deployment, batch: int, heads: int) -> float:
    arch = d.arch
    params = heads * (arch.hidden_size * arch.hidden_size + arch.vocab_size * arch.hidden_size)
    return roofline_s(d.gpu, params * ACTIVATION_BYTES / d.tp, 2 * params * batch / d.tp, "bfloat16", d.constants())


def eagle_level_s(d: Deployment, batch: int, rows: int, logit_rows: int) -> float:
    """One EAGLE drafter level: fc + one decoder layer over ``rows`` per request, then the lm_head
    over ``logit_rows`` per request."""
    arch = d.arch
    layer = arch.decoder_layer_params() + 2 * arch.hidden_size * arch.hidden_size
    lm_head = arch.vocab_size * arch.hidden_size
    k = d.constants()
    drafter = roofline_s(d.gpu, layer * DTYPE_BYTES[d.dtype] / d.tp, 2 * layer * batch * rows / d.tp, d.dtype, k)
    head_flops = 2 * lm_head * batch * logit_rows / d.tp
    head = roofline_s(d.gpu, lm_head * ACTIVATION_BYTES / d.tp, head_flops, "bfloat16", k)
    comm = 2 * allreduce_s(d.gpu, d.tp, batch * rows * arch.hidden_size * ACTIVATION_BYTES)
    return drafter + head + attention_s(d, batch, rows, 1) + comm


def method_step(d: Deployment, drafting: Drafting, batch: int) -> StepCost:
    """One step of ``drafting``'s method: the verification pass plus the method's own work."""
    if d.gpu.kind == "cpu":
        return cpu_method_step(d, drafting, batch)
    plain = drafting.method == "none"
    cost = target_step(d, batch, drafting.rows, logit_rows=1 if plain else drafting.rows)
    k = d.constants()
    drafts = batch * (drafting.rows - 1)
    if drafting.method == "medusa":
        cost.add("medusa heads", medusa_heads_s(d, batch, drafting.medusa_heads))
    elif drafting.method == "eagle":
        for rows, logit_rows in drafting.eagle_levels():
            cost.add("eagle drafter", eagle_level_s(d, batch, rows, logit_rows))
        cost.add("eagle level launches", len(drafting.eagle_level_rows) * (k.level_s + k.host_layer_s))
    if drafting.method in ("medusa", "eagle") and k.tree_row_s:
        cost.add("tree mask and acceptance", k.tree_row_s * drafts)
    if drafting.method == "lookahead" and k.lookahead_row_s:
        cost.add("lookahead mask and n-gram pool", k.lookahead_row_s * drafts)
    return cost
