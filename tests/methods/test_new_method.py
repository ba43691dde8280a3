"""A new speculative method is one definition and one runtime class: proved with a method the test alone defines.

``repeat``: a drafter that proposes the last token repeated K times, verified as a chain by the target
(so greedy output is plain decoding's). It is one :class:`~pipeline.methods.base.MethodDefinition`
(:data:`DEFINITION`) and one :class:`~pipeline.runtime.spec_decode.base.DecodingMethod`
(:class:`RepeatDecoding`), inserted with monkeypatch into the definitions table
(``pipeline.methods.DEFINITIONS``) and the runtime registry (``pipeline.runtime.spec_decode.registry.RUNTIMES``);
no module of ``pipeline/`` names it. With only that:

* a spec with ``speculative.method: repeat`` on the reference target validates and plans, and
  ``plan --json`` names it with its config;
* the reference runtime builds it from an engine (``make_method``) and decodes with it losslessly;
* rehearsal lists it as a candidate (the plan's added method: its config's drafting and K), loads its
  loop, records it and reads the record back; a runtime that lists its own candidates is measured at each,
  also under ``method: best`` where the plan resolved another method (its list is then asked with no
  config: its default settings); a method without a list competes only where the spec names it;
* the cost model prices it, from its Drafting and from a served repository's recorded settings
  (``costmodel.served.drafting`` through the definition's ``served_drafting``);
* it shares NGram's build mode (``draft_tokens_external``), and an engine records its build mode, not its
  method: its definition says ``selected_by_settings``, the package stage writes its config's own
  parameter (``triton_parameters``), and that parameter selects it (``served_method``) for the runtime
  and the cost model, defined ahead of NGram or after it; without it the engine serves NGram; where it
  cannot run (a plain engine), or beside another method's settings, it is refused.

In the tree, the two pieces are a module of pipeline/methods/ (its DEFINITION listed in DEFINITIONS) and a
module of pipeline/runtime/spec_decode/ whose ``@register(name)`` adds its loop (``load_runtimes`` imports
every module there). What still needs an edit outside the two pieces: a method with heads of its own on the
engine target. The converter reads each heads format itself, since TensorRT-LLM's checkpoint has a layout
per kind of heads, so its options come from Medusa's and EAGLE's configs (checkpoint/heads.py
``heads_options``, for the convert stage and preflight); the engine config check asks the config's
``checkpoint_fields()``.

Each method's runtime reads its own Triton parameters (``@register(name, parameters=...)``); a new method
returns its settings under its own name (``MethodSettings.own``, read with ``settings.of(name)``), so it
needs no field of ``MethodSettings``: ``repeat`` reads its K so. Keys only the reference backend reads are
listed on the definition (``reference_parameter_keys``), where the package stage's check finds them.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from pipeline import methods
from pipeline.costmodel import served
from pipeline.costmodel.hardware import gpu_perf
from pipeline.costmodel.predict import predict
from pipeline.costmodel.pricing import method_step, target_step
from pipeline.costmodel.step import Deployment
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.methods.base import MethodDefinition, Problems
from pipeline.methods.drafting import Drafting
from pipeline.runtime.model.engine import Engine, StepInput, StepRows
from pipeline.runtime.spec_decode import registry
from pipeline.runtime.spec_decode.base import Accepted, DecodingMethod, PlainDecoding, Sequence
from pipeline.runtime.spec_decode.factory import MethodSettings, load_runtimes, make_method
from pipeline.runtime.spec_decode.parameters import TritonParameters
from pipeline.runtime.spec_decode.tree_verify import DraftTree, Proposal, verify
from pipeline.runtime.triton.io import parse_parameters
from pipeline.spec import presets
from pipeline.spec.document import VariantSpec
from tests.runtime.drive import decode, requests, totals
from tests.runtime.fixtures import (
    TINY,
    make_hf_model,
    one_torch_thread,  # noqa: F401  (autouse: tiny matmuls on one thread)
    test_prompts,
    write_engine,
)

NAME = "repeat"
K = 3
REPEAT_K = "reference_repeat_k"  # its own tensorrt_llm parameter, read by the CPU reference backend only


@dataclass(frozen=True)
class RepeatConfig:
    """The method's resolved config: K drafts a step."""

    max_draft_len: int

    def describe(self) -> str:
        return f"{NAME}: K={self.max_draft_len}"

    def drafting(self) -> Drafting:
        """A chain of K rows fed to the target, no drafter weights."""
        return Drafting(NAME, 1 + self.max_draft_len)

    def triton_parameters(self) -> dict[str, str]:
        """K as the tensorrt_llm model's parameter: what tells a server of this engine that it runs ``repeat``."""
        return {REPEAT_K: str(self.max_draft_len)}


def _resolve(variant: VariantSpec, arch: ModelGeometry, heads_dir: Path | None, problems: Problems) -> RepeatConfig:
    return RepeatConfig(K)


def _measured(build: dict[str, Any], built: RepeatConfig | None) -> RepeatConfig | None:
    return built


DEFINITION = MethodDefinition(
    name=NAME,
    title="Repeat-last",
    targets=("reference",),
    heads=None,
    resolve=_resolve,
    measured=_measured,
    build_mode="draft_tokens_external",  # drafts fed from outside the engine, as NGram's
    triton_decoding_mode="top_k_top_p",
    checkpoint_architecture="LlamaForCausalLM",
    drafts_tree=False,
    auto_reason=None,  # never chosen by method: auto
    maintenance=1,
    prior_acceptance=1.2,
    cost_terms=(),
    lora_refusal="Repeat-last",
    served_drafting=lambda settings: Drafting(NAME, 1 + settings["max_draft_len"]),
    reference_parameter_keys=(REPEAT_K,),
    selected_by_settings=True,  # built with NGram's mode: its own parameter selects it
)


class RepeatDecoding(DecodingMethod):
    """Drafts the last token K times; the target verifies the chain and keeps the longest agreeing prefix."""

    name = NAME

    def __init__(self, engine: Engine, k: int):
        self.max_draft_len = self.draft_positions = k

    def generation_input(self, seq: Sequence) -> StepInput:
        room = len(seq.request.input_ids) + seq.request.max_new_tokens - 1 - len(seq.tokens)
        drafts = [seq.tokens[-1]] * min(room, self.max_draft_len)
        proposal = Proposal.of_tree(seq.cache, seq.tokens[-1], DraftTree.chain(drafts))
        seq.state[self.name] = proposal
        return proposal.input

    def accept(self, seq: Sequence, rows: StepRows, after_prefill: bool) -> Accepted:
        if after_prefill:
            return Accepted([seq.sample(rows.logits[-1])])
        proposal = seq.state.pop(self.name)
        assert isinstance(proposal, Proposal)
        verdict = verify(proposal, rows, seq.cache, seq.sample)
        return Accepted(verdict.tokens, len(proposal.tree), verdict.accepted_drafts)


def _build(engine: Engine, settings: MethodSettings, warnings: list[str]) -> DecodingMethod:
    k = settings.of(NAME) or engine.config.limits.max_draft_len or K  # the server's K, else the engine's
    return RepeatDecoding(engine, k)


def _parameters(read: TritonParameters) -> dict[str, Any]:
    """Its own server-side setting, under its own name: no field of MethodSettings names it."""
    return {NAME: read.integer(REPEAT_K, None)}


@pytest.fixture(params=["first", "last"])
def with_repeat(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``repeat`` in the definitions table, ahead of NGram (whose build mode it shares) and after it: the
    order decides nothing; and in the runtime registry."""
    load_runtimes()
    table = (DEFINITION, *methods.DEFINITIONS) if request.param == "first" else (*methods.DEFINITIONS, DEFINITION)
    monkeypatch.setattr(methods, "DEFINITIONS", table)
    monkeypatch.setitem(registry.RUNTIMES, NAME, registry.Runtime(NAME, _build, parameters=_parameters))


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """A tiny random Llama built for external draft tokens (K = 4)."""
    root = tmp_path_factory.mktemp("repeat")
    hf = make_hf_model(root / "hf", seed=3)
    return Engine.load(write_engine(hf, root / "engine", "ngram"))


@pytest.mark.usefixtures("with_repeat")
def test_the_definition_is_found_by_name() -> None:
    assert methods.definition(NAME) is DEFINITION
    assert NAME in methods.names() and methods.is_speculative(NAME)
    assert DEFINITION.engine_mode == methods.definition("ngram").engine_mode


SPEC = """
name: repeat-test
model:
  builtin: smollm2-135m-instruct
  dtype: float32
speculative:
  method: {method}
build:
  max_batch_size: 8
  max_input_len: 1024
  max_seq_len: 2048
  max_num_tokens: 2048
target: reference
"""


def _plan_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> dict[str, Any]:
    from pipeline.commands.plan import plan_with_commands
    from pipeline.plan.preflight import checked_plan
    from pipeline.plan.types import OutputRoots
    from pipeline.spec.document import load_spec

    (tmp_path / "spec.yaml").write_text(SPEC.format(method=method))
    monkeypatch.chdir(tmp_path)
    roots = OutputRoots(Path("engines"), Path("triton_repo"), Path(".cache"))
    plan = checked_plan(load_spec(tmp_path / "spec.yaml"), roots)
    return json.loads(json.dumps(plan_with_commands(plan)))


@pytest.mark.usefixtures("with_repeat")
def test_a_spec_naming_it_validates_and_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (variant,) = _plan_json(tmp_path, monkeypatch, NAME)["variants"]
    assert variant["speculative"]["method"] == NAME
    assert variant["speculative"][NAME] == {"max_draft_len": K}
    assert variant["speculative"]["max_draft_len"] == K
    assert variant["build"]["max_draft_len"] == K
    build = next(stage for stage in variant["stages"] if stage["name"] == "build")
    assert "draft_tokens_external" in json.dumps(build)  # trtllm-build's --speculative_decoding_mode


def test_an_unknown_method_is_refused_at_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match=r"speculative\.method.*must be one of .*'ngram'.*got 'repeat'"):
        _plan_json(tmp_path, monkeypatch, NAME)  # without the definition: not a method


@pytest.mark.usefixtures("with_repeat")
def test_the_reference_runtime_decodes_it_losslessly(engine: Engine) -> None:
    method, warnings = make_method(engine, MethodSettings(own={NAME: K}))
    assert isinstance(method, RepeatDecoding) and warnings == []
    prompts = test_prompts(TINY["vocab_size"])
    plain = decode(engine, PlainDecoding(), requests(prompts), in_flight=1)
    spec = decode(engine, method, requests(prompts), in_flight=4)
    assert {r: o.tokens for r, o in spec.items()} == {r: o.tokens for r, o in plain.items()}
    stats = totals(spec)
    assert stats.draft_tokens > 0  # drafts were verified, not skipped


@pytest.mark.usefixtures("with_repeat")
def test_its_runtime_reads_its_own_server_setting(engine: Engine) -> None:
    model = {"parameters": {"gpt_model_path": {"string_value": "/e"}, "reference_repeat_k": {"string_value": "2"}}}
    settings = parse_parameters(model).method
    assert settings.of(NAME) == 2 and settings.of("ngram") is None
    method, _ = make_method(engine, settings)
    assert isinstance(method, RepeatDecoding) and method.max_draft_len == 2  # the server's K, not the engine's 4
    unset = parse_parameters({"parameters": {"gpt_model_path": {"string_value": "/e"}}}).method
    assert unset.of(NAME) is None


@pytest.mark.usefixtures("with_repeat")
def test_its_own_parameter_tells_it_from_ngram_whose_build_mode_it_shares(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.plan.preflight import checked_plan
    from pipeline.plan.types import OutputRoots
    from pipeline.runtime.spec_decode.ngram import NGramDecoding
    from pipeline.spec.document import load_spec
    from pipeline.triton.backend_params import tensorrt_llm_parameters

    (tmp_path / "spec.yaml").write_text(SPEC.format(method=NAME))
    monkeypatch.chdir(tmp_path)
    roots = OutputRoots(Path("engines"), Path("triton_repo"), Path(".cache"))
    (variant,) = checked_plan(load_spec(tmp_path / "spec.yaml"), roots).variants
    params = tensorrt_llm_parameters(variant, Path("engines/e"), Path("triton_repo/repeat-test"))
    assert params[REPEAT_K] == str(K)  # the package stage writes its config's own parameter
    as_served = {"parameters": {key: {"string_value": value} for key, value in params.items()}}
    method, _ = make_method(engine, parse_parameters(as_served).method)
    assert isinstance(method, RepeatDecoding) and method.max_draft_len == K
    # the same engine without that parameter is NGram's, wherever repeat is defined
    method, _ = make_method(engine, MethodSettings())
    assert isinstance(method, NGramDecoding)


@pytest.mark.usefixtures("with_repeat")
def test_parameters_that_select_it_where_it_cannot_run_are_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    from pipeline.methods.eagle3 import Eagle3Config

    plain_engine = Engine.load(
        write_engine(make_hf_model(tmp_path_factory.mktemp("plain") / "hf"), tmp_path_factory.mktemp("e") / "e")
    )
    with pytest.raises(
        InputError,
        match=r"config\.json: the engine is built for none; Repeat-last runs on an engine built for draft_tokens",
    ):
        make_method(plain_engine, MethodSettings(own={NAME: 2}))
    both = MethodSettings(own={NAME: 2}, eagle3=Eagle3Config(3, (1, 2, 3)), eagle3_drafter=Path("/d"))
    with pytest.raises(InputError, match=r"select eagle3 and repeat at once"):
        make_method(plain_engine, both)


@pytest.mark.usefixtures("with_repeat")
def test_a_mode_without_a_runtime_names_what_each_mode_serves(engine: Engine) -> None:
    redrafter = replace(engine.config.limits, speculative_decoding_mode=16)  # explicit_draft_tokens
    view = copy.copy(engine)
    view.config = replace(engine.config, limits=redrafter)
    with pytest.raises(InputError, match="explicit_draft_tokens is not supported by the reference backend") as error:
        make_method(view)
    served = re.search(r"\(([^)]*)\)$", str(error.value))
    assert served is not None
    listed = served.group(1).split(", ")
    assert "ngram" in listed and NAME not in listed and "eagle3" not in listed  # those two need their settings


@pytest.mark.usefixtures("with_repeat")
def test_the_cost_model_reads_it_from_a_served_repository(engine: Engine, tmp_path: Path) -> None:
    """``describe`` names the method the repository's parameters select, not only the engine's build mode."""

    def repository(folder: Path, params: dict[str, str]) -> Path:
        (folder / "tensorrt_llm").mkdir(parents=True)
        (folder / "tensorrt_llm" / "config.pbtxt").write_text(
            "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items())
        )
        return folder

    engine_dir = str(engine.config.folder)
    assert served.describe(repository(tmp_path / "a", {"gpt_model_path": engine_dir, REPEAT_K: "2"}))["method"] == NAME
    assert served.describe(repository(tmp_path / "b", {"gpt_model_path": engine_dir}))["method"] == "ngram"


@pytest.mark.usefixtures("with_repeat")
def test_rehearsal_lists_it_as_a_candidate(engine: Engine) -> None:
    from pipeline.evaluation.apply import candidate_build, config_of
    from pipeline.evaluation.candidates import Measuring, candidates, load
    from pipeline.plan.speculative import SpeculativeConfig

    planned = SpeculativeConfig.of(NAME, "method: repeat set in the spec", RepeatConfig(K))
    listed = candidates(engine, Measuring(planned.configs(), eagle_top_k=4))
    (mine,) = [c for c in listed if c.method == NAME]
    assert mine.drafting == RepeatConfig(K).drafting() and mine.describe == f"{NAME}: K={K}"
    loaded = load(engine, mine)
    assert isinstance(loaded.method, RepeatDecoding) and loaded.method.max_draft_len == K
    assert planned.config == RepeatConfig(K) and planned.max_draft_len == K
    chosen = config_of(candidate_build(mine), planned, "best: measured")
    assert chosen is not None and chosen.method == NAME and chosen.config == RepeatConfig(K)


@pytest.mark.usefixtures("with_repeat")
def test_its_runtime_may_list_the_settings_rehearsal_measures(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.evaluation.candidates import Candidate, Measuring, candidates, load

    def chains(engine: Engine, config: RepeatConfig | None, measuring: Measuring) -> list[Candidate]:
        """The plan's K and a chain of one: ``@register(NAME, candidates=chains)`` in a runtime module. Without a
        config of its own (method: best resolved another method's), the chain of one: it competes all the same."""
        ks = (config.max_draft_len, 1) if config else (1,)
        drafting = {k: RepeatConfig(k).drafting() for k in ks}
        return [Candidate(f"{NAME}(k {k})", NAME, MethodSettings(), drafting[k], max_draft_len=k) for k in ks]

    monkeypatch.setitem(registry.RUNTIMES, NAME, registry.Runtime(NAME, _build, candidates=chains))
    listed = candidates(engine, Measuring({NAME: RepeatConfig(K)}, eagle_top_k=4))
    assert [c.name for c in listed if c.method == NAME] == [f"{NAME}(k {K})", f"{NAME}(k 1)"]
    loaded = load(engine, listed[-1])  # an engine view built with max_draft_len 1
    assert isinstance(loaded.method, RepeatDecoding) and loaded.method.max_draft_len == 1
    under_best = candidates(engine, Measuring({}, eagle_top_k=4))
    assert [c.name for c in under_best if c.method == NAME] == [f"{NAME}(k 1)"]  # the plan resolved no repeat config


@pytest.mark.usefixtures("with_repeat")
def test_the_cost_model_prices_it() -> None:
    d = Deployment(presets.preset("llama-3.1-8b"), gpu_perf("h100-sxm-80gb"), context_len=512)
    drafting = RepeatConfig(K).drafting()
    for batch in (8, 256):  # priced as any chain of K drafts without weights; the rows cost once compute-bound
        assert method_step(d, drafting, batch) == method_step(d, Drafting("ngram", 1 + K), batch)
    assert method_step(d, drafting, 256).total_s > target_step(d, 256, 1, logit_rows=1).total_s
    (prediction,) = predict(d, drafting, 1.5, [8])
    assert prediction.batch == 8
    recorded = {"method": NAME, "settings": {"max_draft_len": K}}
    assert served.drafting(recorded) == drafting
