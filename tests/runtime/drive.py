"""Driving the runtime in tests: collecting responses, decoding through the scheduler with a method.

``decode(engine, method, requests, in_flight)`` runs requests through the real scheduler and
returns the finished outputs by request id; ``method_for(spec_engines, name)`` is one of the four
speculative methods (:data:`METHODS`) on the session's fitted test engines (conftest.py).
"""

from __future__ import annotations

import dataclasses
import functools

from pipeline.runtime.model.engine import Engine
from pipeline.runtime.request import GenerationRequest, StepOutput
from pipeline.runtime.serving.metrics import SpecDecodingStats
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.base import DecodingMethod, PlainDecoding
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
from tests.runtime.fixtures import LOOKAHEAD, NGRAM, TREE, test_prompts


class Collector:
    """Sinks per request id; ``final`` is the finished output."""

    def __init__(self) -> None:
        self.outputs: dict[str, list[StepOutput]] = {}

    def sink(self, request_id: str):
        self.outputs[request_id] = []
        return self.outputs[request_id].append

    def final(self, request_id: str) -> StepOutput:
        outs = self.outputs[request_id]
        assert outs and outs[-1].finished and all(not o.finished for o in outs[:-1])
        return outs[-1]

    def tokens(self, request_id: str) -> list[int]:
        return [t for o in self.outputs[request_id] for t in o.tokens]


SPEC_PROMPTS = test_prompts(96)  # the speculative engines' vocabulary is 96
NEW_TOKENS = 24
METHODS = {
    "medusa": ("medusa", MethodSettings("medusa", medusa_choices=TREE)),
    "eagle": ("eagle", MethodSettings("eagle", eagle_choices=TREE)),
    "eagle2": ("eagle", MethodSettings("eagle", eagle_dynamic_tree=True, eagle_dynamic_tree_max_top_k=3)),
    "lookahead": ("lookahead", MethodSettings("lookahead", lookahead=LOOKAHEAD)),
    "ngram": ("ngram", MethodSettings(ngram=NGRAM)),
}


def method_for(
    spec_engines, name: str, tp: int = 1, fp8: bool = False, dtype: str = "float32"
) -> tuple[Engine, DecodingMethod]:
    kind, settings = METHODS[name]
    engine = spec_engines(kind, tp, fp8, dtype)
    method, warnings = make_method(engine, settings)
    assert warnings == []
    return engine, method


def decode(
    engine: Engine, method: DecodingMethod, requests: list[GenerationRequest], in_flight: int
) -> dict[str, StepOutput]:
    """Finished outputs by request id; ``in_flight`` requests at a time (the rest queue)."""
    limits = dataclasses.replace(engine.config.limits, max_batch_size=in_flight)
    sched, out = Scheduler(engine, method, limits=limits), {}
    for r in requests:
        sched.submit(r, lambda o: out.__setitem__(o.request_id, o) if o.finished else None)
    sched.run_until_idle()
    return out


def requests(prompts=SPEC_PROMPTS, n: int = NEW_TOKENS, **kw) -> list[GenerationRequest]:
    return [GenerationRequest(str(i), tuple(p), n, exclude_input_in_output=True, **kw) for i, p in enumerate(prompts)]


def totals(outputs: dict[str, StepOutput]) -> SpecDecodingStats:
    total = SpecDecodingStats()
    for out in outputs.values():
        total.merge(out.metrics.spec)
    return total


@functools.cache
def plain_tokens(engine: Engine) -> dict[str, list[int]]:
    """Plain greedy decoding of :data:`SPEC_PROMPTS` on this engine, one request at a time (kept per engine)."""
    outputs = decode(engine, PlainDecoding(), requests(), in_flight=1)
    return {rid: out.tokens for rid, out in outputs.items()}
