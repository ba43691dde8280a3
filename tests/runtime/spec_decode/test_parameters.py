"""The tensorrt_llm model's parameters, each method's read by its own runtime module."""

from __future__ import annotations

import doctest

import pytest

from pipeline.errors import InputError
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.ngram import NGramConfig
from pipeline.runtime.spec_decode import parameters
from pipeline.runtime.spec_decode.parameters import TritonParameters
from pipeline.runtime.triton.io import parse_parameters


def config(**values: str) -> dict:
    return {"parameters": {k: {"string_value": v} for k, v in {"gpt_model_path": "/e", **values}.items()}}


def test_docstring_example():
    assert doctest.testmod(parameters).failed == 0


def test_empty_and_template_values_are_unset():
    read = TritonParameters.of(config(decoding_mode="${decoding_mode}", medusa_choices="  "))
    assert read.get("decoding_mode") is None and read.tree("medusa_choices") is None


def test_each_method_reads_its_own_keys():
    params = parse_parameters(
        config(
            decoding_mode="lookahead",
            lookahead_window_size="4",
            lookahead_ngram_size="3",
            lookahead_verification_set_size="4",
            eagle_choices="{0}, {0, 0}, {1}",
            reference_ngram_is_keep_all="false",  # one pool key set: the others keep TensorRT-LLM's defaults
        )
    )
    settings = params.method
    assert settings.decoding_mode == "lookahead"
    assert settings.lookahead == LookaheadConfig(4, 3, 4)
    assert settings.eagle_choices == ((0,), (0, 0), (1,)) and settings.medusa_choices is None
    assert settings.ngram == NGramConfig(0, 2, keep_all=False)  # K 0: the engine's


def test_a_value_that_does_not_parse_warns_or_is_refused():
    params = parse_parameters(config(reference_eagle_dynamic_tree_max_top_k="many"))
    assert params.method.eagle_dynamic_tree_max_top_k is None
    assert params.warnings == ("parameter reference_eagle_dynamic_tree_max_top_k='many' is not an integer; using None",)
    with pytest.raises(InputError, match="parameter medusa_choices"):
        parse_parameters(config(medusa_choices="{0, x}"))
    with pytest.raises(InputError, match="lookahead_verification_set_size are not all set"):
        parse_parameters(config(decoding_mode="lookahead", lookahead_window_size="4"))
