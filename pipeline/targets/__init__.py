"""The deployment targets, each defined once (:class:`~pipeline.targets.base.TargetDefinition`):
``tensorrt.py`` (TensorRT-LLM 1.2 engines on GPUs), ``reference.py`` (the CPU reference backend) and
``pytorch.py`` (TensorRT-LLM's PyTorch backend on GPUs)."""

from __future__ import annotations

from pipeline.errors import InputError
from pipeline.targets import pytorch, reference, tensorrt
from pipeline.targets.base import TargetDefinition

DEFINITIONS: tuple[TargetDefinition, ...] = (tensorrt.DEFINITION, reference.DEFINITION, pytorch.DEFINITION)


def definitions() -> tuple[TargetDefinition, ...]:
    return DEFINITIONS


def definition(name: str) -> TargetDefinition:
    """The definition of target ``name``; InputError naming the known targets when there is none."""
    for found in definitions():
        if found.name == name:
            return found
    raise InputError(f"unknown target {name!r} (known: {', '.join(d.name for d in definitions())})")


def on_gpus(name: str) -> bool:
    """Whether target ``name`` runs on GPUs."""
    return definition(name).on_gpus
