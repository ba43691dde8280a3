"""bfloat16 engines on the reference backend: bf16 GEMMs (pipeline/runtime/model/gemm.py).

Exactness achieved, and tested here: a GEMM row's result does not depend on the other rows of the
call, so a token's logits are the same whether it is decoded alone or inside a batch of requests;
they track the float32 engine within bf16 round-off; and speculative decoding's greedy output
differs from plain decoding only where plain decoding's top two logits are a near-tie at bf16
resolution (attention still sums in a different order in a tree pass than in single-token steps,
and bf16 rounding of the next GEMM's input can amplify that to a few bf16 steps of a logit;
pipeline/runtime/spec_decode/exactness.py).
"""

from __future__ import annotations

import pytest
import torch

from pipeline.runtime.model.engine import Logits, StepInput
from pipeline.runtime.model.gemm import BF16_ROWS_PER_CALL, Gemm
from pipeline.runtime.spec_decode.base import PlainDecoding
from pipeline.runtime.spec_decode.exactness import divergence
from tests.runtime.drive import METHODS, decode, method_for, requests


def test_bf16_gemm_rows_do_not_depend_on_the_other_rows():
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(320, 96, generator=gen), torch.randn(320, generator=gen)
    x = torch.randn(3 * BF16_ROWS_PER_CALL + 5, 96, generator=gen)
    gemm = Gemm(weight, bias, bf16=True)
    alone = torch.cat([gemm(x[i : i + 1]) for i in range(len(x))])
    for rows in (1, 2, 11, BF16_ROWS_PER_CALL, BF16_ROWS_PER_CALL + 1, len(x)):
        assert torch.equal(gemm(x[:rows]), alone[:rows]), f"{rows} rows at once"
    exact = x @ weight.T + bias
    assert (alone - exact).abs().max() <= 2e-2 * exact.abs().max()  # bf16 inputs and output
    assert torch.equal(Gemm(weight, bias)(x), x @ weight.T.contiguous().T.T + bias)  # float32: plain fp32 math


def test_bf16_engine_tracks_the_float32_engine(spec_engines):
    fp32, bf16 = spec_engines(None), spec_engines(None, dtype="bfloat16")
    assert bf16.bf16 and not fp32.bf16
    prompt = list(range(1, 40))
    rows = [e.forward([StepInput(e.new_cache(64), prompt, Logits.ALL)])[0].logits for e in (fp32, bf16)]
    agree = (rows[0].argmax(-1) == rows[1].argmax(-1)).float().mean()
    assert agree >= 0.9 and (rows[0] - rows[1]).abs().max() < 0.05 * rows[0].abs().max()


def test_bf16_batched_decoding_equals_one_request_at_a_time(spec_engines):
    engine = spec_engines(None, dtype="bfloat16")
    alone = decode(engine, PlainDecoding(), requests(), in_flight=1)
    batched = decode(engine, PlainDecoding(), requests(), in_flight=4)
    assert {r: o.tokens for r, o in batched.items()} == {r: o.tokens for r, o in alone.items()}


@pytest.mark.parametrize("name", list(METHODS))
def test_bf16_speculation_differs_from_plain_only_at_near_ties(spec_engines, name):
    """Exactness achieved on this test set: identical (the tiny model has no near-ties here);
    tests/runtime/test_smollm2_speculative.py checks the near-tie rule on the real model."""
    engine, method = method_for(spec_engines, name, dtype="bfloat16")
    reqs = requests()
    plain = {r: o.tokens for r, o in decode(engine, PlainDecoding(), reqs, in_flight=1).items()}
    for in_flight in (1, 4):
        got = decode(engine, method, reqs, in_flight)
        for request in reqs:
            found = divergence(
                engine, list(request.input_ids), plain[request.request_id], got[request.request_id].tokens
            )
            assert found is None, f"{name}, {in_flight} in flight, request {request.request_id}: {found}"
