"""The method definitions (pipeline/methods/): one per method, and every other place that names the
methods agrees with them."""

from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from pipeline import methods
from pipeline.errors import InputError
from pipeline.evaluation.choose import preference
from pipeline.lora.rules import speculative_refusal
from pipeline.plan.speculative import engine_mode_method
from pipeline.spec.document import SpeculativeSpec
from pipeline.spec.json_schema import spec_json_schema


def test_names_are_unique_and_plain_is_none():
    assert len(set(methods.names())) == len(methods.names())
    assert methods.PLAIN == "none" and not methods.is_speculative("none")
    assert [d.name for d in methods.with_heads()] == ["eagle3", "eagle", "medusa"]


def test_the_schema_lists_exactly_the_defined_methods():
    # the spec's speculative.method takes any name (the planner refuses an unknown one at that key); its
    # schema lists every definition, plus the two ways of choosing one
    method = spec_json_schema(methods.names())["$defs"]["SpeculativeSpec"]["properties"]["method"]
    assert set(method["enum"]) == {*methods.names(), "auto", "best"}
    assert SpeculativeSpec.model_fields["method"].annotation is str


@pytest.mark.parametrize(
    ("command", "option", "expected"), [("predict", "--method", "all"), ("train-heads", "--method", "heads")]
)
def test_cli_choices_are_the_defined_methods(command, option, expected):
    from pipeline.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    choices = set(next(a for a in sub._actions if option in a.option_strings).choices)
    trainable = [d.name for d in methods.with_heads() if d.heads is not None and d.heads.trainable]
    wanted = methods.names() if expected == "all" else trainable
    assert choices == set(wanted)


def test_unknown_method_is_one_line_naming_the_known_ones():
    with pytest.raises(
        InputError, match=r"unknown speculative method 'sa' \(known: eagle3, eagle, medusa, lookahead, ngram, none\)"
    ):
        methods.definition("sa")


def test_identity_round_trips_through_the_engine_mode():
    # the build mode in an engine's config.json names the method it was built for
    for d in methods.definitions():  # EAGLE-3 has no engine-flow build: its engine mode is NONE's
        assert engine_mode_method(d.engine_mode) == (d.name if d.build_mode or not d.speculative else "none")


def test_a_new_method_is_one_definition(monkeypatch):
    """A method registered in the test is known to every layer that asks the definitions."""
    sa = dataclasses.replace(
        methods.definition("lookahead"),
        name="sa",
        title="SA",
        build_mode="explicit_draft_tokens",
        triton_decoding_mode="sa",
        maintenance=1,
        prior_acceptance=1.4,
        lora_refusal="SA",
        auto_reason=None,
    )
    monkeypatch.setattr(methods, "DEFINITIONS", (*methods.DEFINITIONS, sa))
    assert methods.definition("sa") is sa
    assert engine_mode_method(sa.engine_mode) == "sa"  # the engine's mode names it
    assert preference(None)[:4] == ("none", "lookahead", "ngram", "sa")  # best's tie-break by upkeep
    assert speculative_refusal("sa", "tensorrt").startswith("SA;")  # the shared LoRA engine's refusal


def test_the_spec_targets_are_the_defined_targets():
    from pipeline import targets
    from pipeline.spec.document import VariantSpec

    assert set(typing.get_args(VariantSpec.model_fields["target"].annotation)) == {
        d.name for d in targets.definitions()
    }
    # every method runs on defined targets only
    assert {t for d in methods.definitions() for t in d.targets} <= {d.name for d in targets.definitions()}


def test_the_cost_model_prices_a_method_by_its_drafting_alone(monkeypatch):
    """A method the cost model has never heard of is priced from what its step feeds: its rows and
    the per-row constant it names."""
    from pipeline.costmodel.hardware import gpu_perf
    from pipeline.costmodel.pricing import method_step
    from pipeline.costmodel.step import Deployment
    from pipeline.methods.drafting import Drafting
    from pipeline.spec import presets

    deployment = Deployment(presets.preset("llama-3.1-8b"), gpu_perf("h100-sxm-80gb"))
    charged = dataclasses.replace(deployment, profile=dataclasses.replace(deployment.constants(), lookahead_row_s=1e-5))
    plain = method_step(charged, Drafting.plain(), batch=64)
    ngram = method_step(charged, Drafting("ngram", rows=16, row_term="lookahead_row_s"), batch=64)
    assert ngram.parts["lookahead mask and n-gram pool"] == pytest.approx(
        1e-5 * 64 * 15
    )  # the per-row constant it names
    assert ngram.parts["weights and GEMMs"] > plain.parts["weights and GEMMs"]  # 16 rows a request, not 1


def test_methods_that_share_a_build_mode_are_told_apart_by_their_settings():
    """An engine records its build mode, not its method: each mode names one method (``engine_mode_method``),
    and every other method built with it is ``selected_by_settings``: served only where the parameters
    select it (``served_method``: a ``claims`` hook, as EAGLE-3's, which the PyTorch backend builds with no
    mode, as plain decoding; or its own parameter, as ``repeat``'s in tests/methods/test_new_method.py)."""
    from pipeline.runtime.spec_decode import registry
    from pipeline.runtime.spec_decode.factory import load_runtimes

    load_runtimes()
    for mode in {d.build_mode for d in methods.definitions()}:
        sharing = [d for d in methods.definitions() if d.build_mode == mode]
        (named,) = [d.name for d in sharing if not d.selected_by_settings]
        assert engine_mode_method(sharing[0].engine_mode) == named, mode
        for d in sharing:  # a shipped method selected by settings says how: its runtime's claims
            assert not d.selected_by_settings or registry.RUNTIMES[d.name].claims is not None, d.name
