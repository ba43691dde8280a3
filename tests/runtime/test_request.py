"""Out-of-range sampling inputs are refused per request, as TensorRT-LLM's executor refuses them
(``SamplingConfig::checkTemperature/checkTopK/checkTopP``), instead of being silently clipped."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.runtime.request import SamplingParams
from pipeline.runtime.triton.io import parse_parameters, parse_request


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature=-0.1 is out of range: must be >= 0"),
        ({"temperature": math.nan}, "temperature=nan is out of range"),
        ({"top_k": -1}, "runtime_top_k=-1 is out of range: must be >= 0"),
        ({"top_p": 1.5}, "runtime_top_p=1.5 is out of range: must be in (0, 1]"),
        ({"top_p": -0.2}, "runtime_top_p=-0.2 is out of range"),
        ({"top_p": math.nan}, "runtime_top_p=nan is out of range"),
        ({"top_p": math.inf}, "runtime_top_p=inf is out of range"),
    ],
)
def test_out_of_range_sampling_is_refused(kwargs, message):
    with pytest.raises(InputError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": 0.0},
        {"top_k": 0, "top_p": 0.0},
        {"top_p": 1.0},
        {"top_k": 5000},
        {"temperature": 7.5, "top_k": 40, "top_p": 0.9},
    ],
)
def test_in_range_sampling_is_accepted(kwargs):
    SamplingParams(**kwargs)


def _inputs(**values):
    arrays = {"input_ids": np.array([[1, 2, 3]], dtype=np.int32), "request_output_len": np.array([[4]], dtype=np.int32)}
    arrays |= {
        name: np.array([[value]], dtype=np.float32 if isinstance(value, float) else np.int32)
        for name, value in values.items()
    }
    return arrays.get


@pytest.fixture
def params(tmp_path):
    return parse_parameters(
        {"parameters": {"gpt_model_path": {"string_value": str(tmp_path)}, "decoupled_mode": {"string_value": "true"}}}
    )


@pytest.mark.parametrize(
    "values, name",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"runtime_top_k": -3}, "runtime_top_k"),
        ({"runtime_top_p": 1.01}, "runtime_top_p"),
    ],
)
def test_a_request_with_bad_sampling_is_one_request_error(params, values, name):
    with pytest.raises(InputError, match=f"^{name}=.* is out of range"):
        parse_request(_inputs(**values), "r1", params)
    assert parse_request(_inputs(temperature=0.5, runtime_top_p=0.9), "r2", params).sampling.top_p == pytest.approx(0.9)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"beam_width": 0}, "beam_width=0 is out of range: must be >= 1"),
        ({"num_return_sequences": -2}, "num_return_sequences=-2 is out of range"),
        ({"min_tokens": -1}, "min_tokens=-1 is out of range: must be >= 0"),
        ({"repetition_penalty": 0.0}, "repetition_penalty=0 is out of range: must be > 0"),
        ({"repetition_penalty": math.nan}, "repetition_penalty=nan is out of range"),
        ({"len_penalty": -1.0}, "len_penalty=-1 is out of range"),
    ],
)
def test_other_executor_ranges_are_checked_per_request(params, values, message):
    with pytest.raises(InputError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_request(_inputs(**values), "r1", params)
