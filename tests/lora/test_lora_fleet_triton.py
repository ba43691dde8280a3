"""specs/smollm2-lora-fleet.yaml through a real tritonserver: the base and all eight shipped fine-tunes on
ONE engine built with the LoRA plugin, each fine-tune queried by its own model name.

Correct answers come from outside the pipeline: each adapter merged into the base by PEFT
(``merge_and_unload``) and decoded greedily by transformers on the ids the server's preprocessing
makes (``tokenizer.encode``, special tokens as the tokenizer adds them: none for SmolLM2), stopping at
the one end id it sends (``eos_token_id``). The end id may be the first token: json answers "Name
three colors." with ``<|im_end|>`` at once (logit 21.24 against 18.95 for "\n"), an empty text on
both sides, since TensorRT-LLM's min_tokens default 1 bans nothing. Float32 throughout: the served
logits are within about 1e-4 of transformers', far below every greedy step's top-1/top-2 margin
(asserted), so the tokens are identical.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.client import GenerationRequest, TritonClient
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, Plan
from pipeline.spec.document import load_spec
from pipeline.stages.execute import execute_plan, execute_spec_repository
from pipeline.triton.launch_cpu import reference_backend_available
from tests.conftest import embedded_cache_dir
from tests.lora.fleet_fixtures import FINE_TUNES, MIN_MARGIN, PROMPTS, TOKENS, peft_merged_answers
from tests.lora.test_lora_triton import tokenizer_of

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.smollm2,
    pytest.mark.skipif(not reference_backend_available(), reason="the reference backend is not in this checkout"),
]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan(module_tmp) -> Plan:
    root = module_tmp("lora-fleet")
    spec = load_spec(REPO / "specs" / "smollm2-lora-fleet.yaml")
    plan = make_plan(spec, OutputRoots(root / "engines", root / "triton_repo", embedded_cache_dir()))
    outcomes = execute_plan(plan, say=lambda _: None)
    assert all(o.stopped_at is None and o.exit_code == 0 for o in outcomes), outcomes
    assert execute_spec_repository(plan, {v.name for v in plan.variants}, say=lambda _: None) is not None
    return plan


@pytest.fixture(scope="module")
def expected() -> dict[tuple[str, str], tuple[list[int], float]]:
    return peft_merged_answers(("base", *FINE_TUNES), PROMPTS, TOKENS)


@pytest.fixture(scope="module")
def server(plan, module_tmp):
    from tests.triton.triton_fixtures import serve_repository

    assert plan.repository is not None
    running = serve_repository(
        plan.repository.output,
        module_tmp("logs") / "server.log",
        models=("base", *FINE_TUNES, "base-tensorrt_llm"),
        ready_timeout=300,
    )
    try:
        yield running
    finally:
        running.stop()


def ask(url: str, model: str, prompt: str) -> str:
    with TritonClient(url, model) as client:
        return client.generate(GenerationRequest(prompt, max_tokens=TOKENS), timeout=300).text


def test_each_fine_tune_by_name_equals_its_peft_merged_model_on_one_engine(plan, expected, server):
    tokenizer = tokenizer_of(plan)
    jobs = [(name, prompt) for name in ("base", *FINE_TUNES) for prompt in PROMPTS]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {job: pool.submit(ask, server.grpc_url, *job) for job in jobs}
        answers = {job: future.result() for job, future in futures.items()}
    for (name, prompt), text in answers.items():
        tokens, margin = expected[name, prompt]
        assert margin > MIN_MARGIN, (name, prompt, margin)  # no near-tie that float rounding could flip
        want = tokenizer.decode(tokens, skip_special_tokens=True)
        assert text.strip() == want.strip(), (name, prompt)
    assert expected["json", PROMPTS[0]][0] == [tokenizer.eos_token_id]  # the end id as the first token
    changed = {name for name in FINE_TUNES for p in PROMPTS if expected[name, p][0] != expected["base", p][0]}
    assert len(changed) >= len(FINE_TUNES) // 2, changed  # the adapters do change the text
    (group,) = plan.lora_groups
    assert sorted(m.variant for m in group.members) == sorted(FINE_TUNES)
    assert len({v.stage("build").output for v in plan.variants}) == 1  # one engine
    served = sorted(p.name for p in plan.repository.output.iterdir() if p.name.endswith("-tensorrt_llm"))
    assert served == ["base-tensorrt_llm"]  # one tensorrt_llm model serves the nine names
