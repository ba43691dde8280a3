"""EAGLE-3 end to end on the PyTorch-backend target, on CPU: a drafter made by ModelOpt for the embedded
SmolLM2 (tests/runtime/eagle3_fixtures.py, random weights: it rarely guesses right, which is no
matter for what is checked here) is read, deployed beside the model, rehearsed by the evaluate stage
(EAGLE-3 beside plain decoding and NGram, each token-identical to plain greedy decoding) and served by
the CPU stand-in for trtllm-serve with the answers plain decoding gives."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.llm_api.deployment import DRAFTER_FOLDER, OPTIONS_FILE
from pipeline.llm_api.standin_runtime import load_standin
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.runtime.request import GenerationRequest
from pipeline.spec.document import load_spec
from tests.conftest import embedded_cache_dir
from tests.runtime.eagle3_fixtures import make_modelopt_drafter

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]


def test_an_eagle3_drafter_is_rehearsed_deployed_and_served(cli, smollm2_dir, tmp_path, write_spec):
    drafter = make_modelopt_drafter(smollm2_dir, tmp_path / "drafter").folder
    spec = write_spec(
        "name: p\nmodel: {builtin: smollm2-135m-instruct, dtype: float32}\ntarget: pytorch\n"
        f"speculative: {{method: best}}\nheads: {{eagle3: {{path: {drafter}}}}}\n"
        "evaluation: {count: 2, max_new_tokens: 8}\n"
    )
    rc, out, err = cli("engine", str(spec))
    assert rc == 0, err + out
    report = json.loads((tmp_path / "engines" / "p" / "evaluation" / "evaluation.json").read_text())
    assert sorted(r["method"] for r in report["candidates"]) == ["eagle3", "ngram", "none"]
    assert all(r["identity"]["identical"] for r in report["candidates"]), report["candidates"]
    checkpoint = tmp_path / "engines" / "p" / "checkpoint"
    assert sorted(p.name for p in (checkpoint / DRAFTER_FOLDER).iterdir()) == ["config.json", "model.safetensors"]
    options = yaml.safe_load((tmp_path / "triton_repo" / "p" / OPTIONS_FILE).read_text())
    if report["choice"]["method"] == "eagle3":
        assert options["speculative_config"]["speculative_model"] == "/models/engines/p/checkpoint/eagle3"

    # The stand-in serves the plan as built: the method the rehearsal chose.
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", embedded_cache_dir())
    plan = make_plan(load_spec(spec), roots)
    (variant,) = plan.variants
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    runtime = load_standin(variant, scratch, say=lambda _: None)
    try:
        prompt = tuple(runtime.tokenizer.encode("def is_prime(n):"))
        answer = runtime.submit("p", GenerationRequest("1", prompt, 12, end_id=runtime.tokenizer.eos_token_id))
        tokens = answer.result(timeout=300).tokens
    finally:
        runtime.stop()
    assert len(tokens) == len(prompt) + 12  # the prompt, then the answer
    assert runtime.method == {"none": "plain"}.get(report["choice"]["method"], report["choice"]["method"])


def test_a_drafter_in_flight_with_plain_decoding_gives_plain_answers(smollm2_dir, tmp_path, write_spec):
    """The stand-in of a plan that decodes with EAGLE-3 answers as plain greedy decoding does."""
    drafter = make_modelopt_drafter(smollm2_dir, tmp_path / "drafter").folder
    spec = write_spec(
        "name: q\nmodel: {builtin: smollm2-135m-instruct, dtype: float32}\ntarget: pytorch\n"
        f"heads: {{eagle3: {{path: {drafter}}}}}\n"
    )
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", embedded_cache_dir())
    from pipeline.stages.execute import execute_plan

    plan = make_plan(load_spec(spec), roots)
    assert plan.variants[0].speculative.method == "eagle3"
    assert all(o.exit_code == 0 for o in execute_plan(plan, say=lambda _: None))
    plain_spec = write_spec(
        "name: r\nmodel: {builtin: smollm2-135m-instruct, dtype: float32}\ntarget: pytorch\n"
        "speculative: {method: none}\n",
        name="plain.yaml",
    )
    plain_plan = make_plan(load_spec(plain_spec), roots)
    assert all(o.exit_code == 0 for o in execute_plan(plain_plan, say=lambda _: None))
    answers = {}
    for plan_, name in ((plan, "q"), (plain_plan, "r")):
        scratch = tmp_path / f"scratch-{name}"
        scratch.mkdir()
        runtime = load_standin(plan_.variants[0], scratch, say=lambda _: None)
        try:
            prompts = ["def is_prime(n):", "Name three colors.", "The capital of France is"]
            futures = [
                runtime.submit(name, GenerationRequest(str(i), tuple(runtime.tokenizer.encode(p)), 16))
                for i, p in enumerate(prompts)
            ]  # all three in flight together
            answers[name] = [f.result(timeout=300).tokens for f in futures]
            assert runtime.method == ("eagle3" if name == "q" else "plain")
        finally:
            runtime.stop()
    assert answers["q"] == answers["r"]
