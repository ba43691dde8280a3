"""The speculative-decoding methods, each defined once (:class:`~pipeline.methods.base.MethodDefinition`).

One module per method: ``eagle3.py`` (EAGLE-3), ``eagle.py`` (EAGLE-1/2), ``medusa.py``, ``lookahead.py``,
``ngram.py`` and ``plain.py`` (plain decoding, the baseline). Each holds the method's definition and its
plan-time rules; the reference runtime's loop for it lives in ``pipeline/runtime/spec_decode/``. Every other module asks
:func:`definition` (``definition(name).heads``, ``.build_mode``, ``.drafts_tree``, ...) rather than
comparing method names, so a new method is one more module here, one more entry in
:data:`DEFINITIONS`, and its runtime class (a module of ``pipeline/runtime/spec_decode/`` that registers
its loop under the method's name, :mod:`pipeline.runtime.spec_decode.registry`). What the generic modules
ask of a method is a hook of its definition (``served_settings``, ``served_drafting``, ``recorded``,
``heads.warm_start_problem``) or of its resolved config (``describe()``, ``drafting()``,
``llm_api_config()``, ``engine_heads_params()``, ``checkpoint_fields()``);
``tests/methods/test_new_method.py`` adds one in a test.
"""

from __future__ import annotations

from pipeline.errors import InputError
from pipeline.methods import eagle, eagle3, lookahead, medusa, ngram, plain
from pipeline.methods.base import MethodDefinition

# Every method, in the order method: auto tries them (the first whose heads are present and that has
# an auto_reason is chosen): the drafters with the highest acceptance first.
DEFINITIONS: tuple[MethodDefinition, ...] = (
    eagle3.DEFINITION,
    eagle.DEFINITION,
    medusa.DEFINITION,
    lookahead.DEFINITION,
    ngram.DEFINITION,
    plain.DEFINITION,
)

PLAIN = plain.DEFINITION.name  # plain decoding's method name ("none")


def definitions() -> tuple[MethodDefinition, ...]:
    """Every method's definition, in method: auto's order."""
    return DEFINITIONS


def names() -> tuple[str, ...]:
    """Every method's name, in method: auto's order."""
    return tuple(d.name for d in definitions())


def definition(name: str) -> MethodDefinition:
    """The definition of method ``name``; InputError naming the known methods when there is none."""
    for found in definitions():
        if found.name == name:
            return found
    raise InputError(f"unknown speculative method {name!r} (known: {', '.join(names())})")


def is_speculative(name: str) -> bool:
    """Whether method ``name`` drafts tokens (False for plain decoding)."""
    return definition(name).speculative


def with_heads() -> tuple[MethodDefinition, ...]:
    """The methods that draft with heads or a drafter of their own (``heads.<key>`` in a spec)."""
    return tuple(d for d in definitions() if d.heads is not None)


def target_refusal(method: MethodDefinition, target: str) -> str:
    """Why ``method`` cannot run on ``target``, with the nearest that can: for heads, the kind of drafter
    that target loads; for a method without extra weights, the target's own (and those in any case).

    TensorRT-LLM's PyTorch backend drafts with EAGLE-3 only ("EAGLE (v1/v2) draft checkpoints are
    incompatible", docs/source/features/speculative-decoding.md), and has no Medusa or Lookahead; the
    engine flow loads no EAGLE-3 drafter, and its Triton backend cannot draft NGram for itself."""
    zero_touch = " or ".join(d.name for d in definitions() if target in d.targets and d.speculative and not d.heads)
    drafters = [d for d in definitions() if target in d.targets and d.heads is not None]
    if method.heads is not None and drafters:
        kinds = ", ".join(f"{d.title} (heads.{d.heads.key})" for d in drafters if d.heads is not None)
        nearest = f"that target drafts with {kinds}; or use method: {zero_touch} there (no extra weights)"
    else:
        nearest = f"use method: {zero_touch} there (no extra weights, the nearest to {method.title})"
    where = " or ".join(method.targets)
    return f"{method.title} runs on target {where} only, not {target}; {nearest}, or target: {method.targets[0]}"
