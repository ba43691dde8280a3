"""The time of one decoding step on the CPU device (``hardware.CPU_DEVICE``): the reference backend's.

A CPU is no roofline machine: a pass streams its weights and then pays for its rows' FLOPs, one
after the other. Its step, for the step of a :class:`~pipeline.costmodel.step.Deployment` whose
device is the CPU, is linear in the runtime constants of :mod:`pipeline.costmodel.profile` with CPU
meanings (``specdeploy calibrate --gpu cpu`` fits them on bench runs) and uses the host's GEMMs as
its probe measured them by rows (``GpuPerf.gemms``, :func:`pipeline.costmodel.gemm_probe.probe`: the
engine's own GEMMs on the host, in cache):

* ``host_layer_s`` per decoder layer's worth of weights a pass reads (the target's layers and
  lm_head; a Medusa heads pass; an EAGLE drafter level's fc, layer and lm_head), but for the weights
  the probe already timed from memory (those larger than the host's last-level cache: the lm_head);
* ``row_compute`` times the pass's weight GEMMs over all rows of all requests (one GEMM per weight)
  as the device's probe measured them by rows (a CPU GEMM gets cheaper per row as the rows grow, and
  the step with it), its attention at the qkv GEMM's measured rate; without a probe, seconds per
  TFLOP of them;
* ``request_s`` per request a step (its sequence's attention, sampling and streamed response);
* ``host_step_s`` per step; ``level_s``, ``tree_row_s`` and ``lookahead_row_s`` as on a GPU
  (:mod:`pipeline.costmodel.step_gpu`).

Methods add their passes: Medusa one over its heads' ResBlocks and the lm_head for their rows (the
reference backend's heads share the base lm_head), EAGLE one per drafter level (fc, layer, lm_head).
"""

from __future__ import annotations

from pipeline.costmodel.gemm_probe import Gemms, eagle_level_gemms, gemm_shapes, medusa_gemms, target_gemms
from pipeline.costmodel.step import Deployment, StepCost, attention_flops
from pipeline.methods.drafting import Drafting


def pass_s(d: Deployment, gemms: Gemms, attention: float = 0.0) -> float:
    """One pass: streaming the weights of its ``gemms``, then the GEMMs and ``attention`` FLOPs."""
    return streaming_s(d, gemms) + d.constants().row_compute * _compute_s(d, gemms, attention)


def streaming_s(d: Deployment, gemms: Gemms) -> float:
    """``host_layer_s`` per decoder layer's worth of the weights of ``gemms`` (one weight a call),
    less those the device's probe timed from memory already (gemm_probe: larger than its cache)."""
    shapes, measured = gemm_shapes(d.arch), d.gpu.gemms
    timed_streaming = measured.out_of_cache if measured is not None else frozenset()
    params = sum(calls * shapes[name][0] * shapes[name][1] for name, calls, _ in gemms if name not in timed_streaming)
    return d.constants().host_layer_s * params / d.arch.decoder_layer_params()


def _compute_s(d: Deployment, gemms: Gemms, attention: float) -> float:
    """Seconds of ``gemms`` as the device's probe measured them (``attention`` FLOPs at the qkv GEMM's
    measured rate over the pass's rows), or their FLOPs at its nominal peak."""
    shapes, measured = gemm_shapes(d.arch), d.gpu.gemms
    if measured is None:
        flops = sum(calls * 2 * shapes[name][0] * shapes[name][1] * rows for name, calls, rows in gemms)
        return (flops + attention) / d.gpu.peak_flops("fp32")
    if not gemms:  # a pass that only streams its weights
        return 0.0
    rows = gemms[0][2]
    out, inputs = shapes["qkv"]
    attention_rate = measured.gemm_s("qkv", rows) / (2 * out * inputs * rows)  # seconds per FLOP
    return measured.total_s(gemms) + attention * attention_rate


def target_step(d: Deployment, batch: int, rows: int, logit_rows: int) -> StepCost:
    """The target pass: every request's rows in one GEMM per weight (logits for ``logit_rows``)."""
    arch, cost, k = d.arch, StepCost(), d.constants()
    gemms = target_gemms(arch.num_layers, batch * rows, batch * logit_rows)
    attention = attention_flops(d, batch, rows, arch.num_layers)
    cost.add("weight streaming", streaming_s(d, gemms))
    cost.add("GEMMs and attention", k.row_compute * _compute_s(d, gemms, attention))
    cost.add("step overhead", k.host_step_s)
    if k.request_s:
        cost.add("per-request work", k.request_s * batch)
    return cost


def method_step(d: Deployment, drafting: Drafting, batch: int) -> StepCost:
    """One step of ``drafting``'s method: the target pass, Medusa's ResBlocks and one lm_head pass over
    its heads' rows (the reference backend's heads share the base lm_head), EAGLE's fc + layer +
    lm_head per level."""
    k = d.constants()
    plain = drafting.is_plain
    cost = target_step(d, batch, drafting.rows, 1 if plain else drafting.rows)
    if drafting.medusa_heads:
        cost.add("medusa heads", pass_s(d, medusa_gemms(drafting.medusa_heads, batch)))
    if drafting.eagle_level_rows:
        for rows, logit_rows in drafting.eagle_levels():
            gemms = eagle_level_gemms(batch * rows, batch * logit_rows)
            cost.add("eagle drafter", pass_s(d, gemms, attention_flops(d, batch, rows, 1)) + k.level_s)
    cost.add_draft_rows(drafting, k, batch)
    return cost
