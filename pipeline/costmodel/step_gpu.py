"""The time of one decoding step on a GPU: a roofline of the target model plus each method's own work.

From the GPU type's datasheet figures (:mod:`pipeline.costmodel.hardware`: memory bandwidth, dense
tensor-core peaks, interconnect) and the runtime's constants (:mod:`pipeline.costmodel.profile`), for
the step of a :class:`~pipeline.costmodel.step.Deployment` (``b`` requests of ``T`` rows over ``L``
cached tokens, tp x pp GPUs). Pipeline stages run one after the other for one step: they add up, so
pp does not shorten a step; it adds a hop per stage boundary. Per GPU:

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
* a fixed per-step overhead (hardware.STEP_OVERHEAD_S), or with a runtime profile its host work:
  ``host_step_s + host_layer_s x layers``.

Each method's own work (what it is: :class:`~pipeline.methods.drafting.Drafting`):

* Medusa: its K heads' ResBlocks and lm_heads in one roofline (the heads stay bf16: FP8 heads are not
  supported, TensorRT-LLM#2115);
* EAGLE-1 / EAGLE-2: per tree level, the drafter pass and the lm_head pass each their own roofline,
  with their own KV read (one layer), tp all-reduces and a pass overhead;
* Lookahead: no weights, only its rows in the verification pass.

With a runtime profile, the costs the roofline leaves out are their own parts: the draft rows' GEMM
work its max() lets ride free below the ridge point (``row_compute`` x their FLOPs / peak, rows
beyond the first, up to where the step is compute-bound anyway), the
tree-attention mask and acceptance work of Medusa and EAGLE (``tree_row_s`` per draft row), EAGLE's
per-level drafter launches (``level_s + host_layer_s`` per level), Lookahead's custom-mask rows and
n-gram pool work (``lookahead_row_s`` per draft row), the runtime's host work per step and per layer.
"""

from __future__ import annotations

from pipeline.costmodel import hardware
from pipeline.costmodel.hardware import GpuPerf
from pipeline.costmodel.profile import RuntimeProfile
from pipeline.costmodel.step import ACTIVATION_BYTES, DTYPE_BYTES, Deployment, StepCost, attention_flops
from pipeline.geometry import ModelGeometry
from pipeline.methods.drafting import Drafting


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
    flops = attention_flops(d, batch, rows, layers)
    return roofline_s(d.gpu, kv_bytes, flops, "bfloat16", d.constants())


def target_step(d: Deployment, batch: int, rows: int, logit_rows: int) -> StepCost:
    """The target model's forward over ``rows`` new tokens per request (logits for ``logit_rows``)."""
    arch, gpu, cost = d.arch, d.gpu, StepCost()
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


def eagle_level_s(d: Deployment, batch: int, rows: int, logit_rows: int, layer: int, vocab: int | None = None) -> float:
    """One EAGLE drafter level: its ``layer`` weights (fc and decoder layer:
    :meth:`pipeline.methods.drafting.Drafting.eagle_level_params`) over ``rows`` per request, then the
    lm_head over ``logit_rows`` per request (``vocab`` rows: a reduced draft vocabulary, else the target's)."""
    arch = d.arch
    lm_head = (vocab or arch.vocab_size) * arch.hidden_size
    k = d.constants()
    drafter = roofline_s(d.gpu, layer * DTYPE_BYTES[d.dtype] / d.tp, 2 * layer * batch * rows / d.tp, d.dtype, k)
    head_flops = 2 * lm_head * batch * logit_rows / d.tp
    head = roofline_s(d.gpu, lm_head * ACTIVATION_BYTES / d.tp, head_flops, "bfloat16", k)
    comm = 2 * allreduce_s(d.gpu, d.tp, batch * rows * arch.hidden_size * ACTIVATION_BYTES)
    return drafter + head + attention_s(d, batch, rows, 1) + comm


def method_step(d: Deployment, drafting: Drafting, batch: int) -> StepCost:
    """One step of ``drafting``'s method: the verification pass plus the method's own work."""
    plain = drafting.is_plain
    cost = target_step(d, batch, drafting.rows, logit_rows=1 if plain else drafting.rows)
    k = d.constants()
    if drafting.medusa_heads:
        cost.add("medusa heads", medusa_heads_s(d, batch, drafting.medusa_heads))
    if drafting.eagle_level_rows:
        for level, (rows, logit_rows) in enumerate(drafting.eagle_levels()):
            layer = drafting.eagle_level_params(d.arch, level)
            cost.add("eagle drafter", eagle_level_s(d, batch, rows, logit_rows, layer, drafting.draft_vocab))
        cost.add("eagle level launches", len(drafting.eagle_level_rows) * (k.level_s + k.host_layer_s))
    cost.add_draft_rows(drafting, k, batch)
    return cost
