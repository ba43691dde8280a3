"""EAGLE-3 on the shared LoRA engine of the PyTorch-backend target: one drafter (made by ModelOpt for
the base, random weights) drafts for every fine-tune while each request's adapter is applied to the
target, so each answer equals its PEFT-merged model's greedy output (tests/lora/fleet_fixtures.py)
with the base and two fine-tunes in flight together."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.llm_api.standin_runtime import load_standin
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.runtime.request import GenerationRequest
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan
from tests.conftest import embedded_cache_dir
from tests.lora.fleet_fixtures import MIN_MARGIN, PROMPTS, TOKENS, peft_merged_answers
from tests.runtime.eagle3_fixtures import make_modelopt_drafter

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]
REPO = Path(__file__).resolve().parents[2]
NAMES = ("base", "json", "code")


def test_one_eagle3_drafter_speculates_for_every_fine_tune(smollm2_dir, tmp_path, write_spec):
    drafter = make_modelopt_drafter(smollm2_dir, tmp_path / "drafter").folder
    spec = write_spec(
        "name: fleet\nmodel: {builtin: smollm2-135m-instruct, dtype: float32}\ntarget: pytorch\n"
        f"heads: {{eagle3: {{path: {drafter}}}}}\n"
        "variants:\n  - name: base\n"
        + "".join(
            f"  - name: {n}\n    model: {{adapter: {REPO / 'adapters' / f'smollm2-{n}'}}}\n"
            "    serving: {lora: shared}\n"
            for n in NAMES[1:]
        )
    )
    plan = make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", embedded_cache_dir()))
    base = plan.variants[0]
    assert base.speculative.method == "eagle3" and base.build.lora is not None  # a LoRA engine that speculates
    assert all(o.exit_code == 0 for o in execute_plan(plan, only={"base"}, say=lambda _: None))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    runtime = load_standin(base, scratch, say=lambda _: None)
    try:
        tokenizer = runtime.tokenizer
        jobs = [(name, prompt) for name in NAMES for prompt in PROMPTS]
        futures = {
            job: runtime.submit(
                job[0],
                GenerationRequest(
                    str(i), tuple(tokenizer.encode(job[1])), TOKENS, end_id=tokenizer.eos_token_id,
                    exclude_input_in_output=True,
                ),
            )
            for i, job in enumerate(jobs)
        }  # fmt: skip
        answers = {job: future.result(timeout=600) for job, future in futures.items()}
    finally:
        runtime.stop()
    assert runtime.method == "eagle3"
    expected = peft_merged_answers(NAMES, PROMPTS, TOKENS)
    for job, output in answers.items():
        tokens, margin = expected[job]
        assert output.error is None and margin > MIN_MARGIN, (job, output.error, margin)
        # transformers keeps the end id it stopped at; the runtime's output carries none
        assert output.tokens == (tokens[:-1] if tokens[-1:] == [runtime.tokenizer.eos_token_id] else tokens), job
    assert sum(o.metrics.total_draft_tokens for o in answers.values()) > 0  # every request drafted
