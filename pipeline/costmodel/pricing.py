"""One decoding step priced by the step model of its deployment's device.

A GPU's step is the roofline of :mod:`pipeline.costmodel.step_gpu`; the CPU device's (the reference
backend, ``GpuPerf.kind == "cpu"``) is :mod:`pipeline.costmodel.step_cpu`'s. What a step is (the
deployment, the method's drafting, the cost by part): :mod:`pipeline.costmodel.step`.
"""

from __future__ import annotations

from pipeline.costmodel import step_cpu, step_gpu
from pipeline.costmodel.step import Deployment, StepCost
from pipeline.methods.drafting import Drafting


def target_step(d: Deployment, batch: int, rows: int, logit_rows: int | None = None) -> StepCost:
    """The target model's forward over ``rows`` new tokens per request (logits for ``logit_rows``,
    default all of them)."""
    logit_rows = rows if logit_rows is None else logit_rows
    if d.gpu.kind == "cpu":
        return step_cpu.target_step(d, batch, rows, logit_rows)
    return step_gpu.target_step(d, batch, rows, logit_rows)


def method_step(d: Deployment, drafting: Drafting, batch: int) -> StepCost:
    """One step of ``drafting``'s method: the verification pass plus the method's own work."""
    if d.gpu.kind == "cpu":
        return step_cpu.method_step(d, drafting, batch)
    return step_gpu.method_step(d, drafting, batch)
