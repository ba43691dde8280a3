"""The PyTorch-backend target (``target: pytorch``): which methods it runs, its LoRA engine that
speculates, its stages (no convert, no engine build), and what its deployment files carry, each key
held to TensorRT-LLM's own classes as recorded in pipeline/targets/pytorch_sources.json."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest
import yaml
from safetensors.torch import load_file

from pipeline.checkpoint.hf_reader import open_hf_checkpoint
from pipeline.llm_api.deployment import LLMAPI_MODEL_YAML, OPTIONS_FILE, SERVE_FILE, launch_argv
from pipeline.llm_api.options import llm_api_options
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from tests.methods.eagle3_fixtures import config, write

REPO = Path(__file__).resolve().parents[1]
SOURCES = json.loads((REPO / "pipeline" / "targets" / "pytorch_sources.json").read_text())
PRESET_8B = "name: p\nmodel: {preset: llama-3.1-8b}\ntarget: pytorch\n"


@pytest.fixture
def roots(tmp_path) -> OutputRoots:
    return OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache")


def shipped_plan(name: str, roots: OutputRoots):
    return make_plan(load_spec(REPO / "specs" / f"{name}.yaml"), roots)


# -- methods per target --------------------------------------------------------------------------------


def test_auto_chooses_ngram_on_the_pytorch_backend(plan_of):
    (variant,) = plan_of(PRESET_8B).variants
    assert variant.speculative.method == "ngram"
    assert [s.name for s in variant.stages] == ["checkpoint", "package"]  # no convert, no engine build


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        # heads the PyTorch backend cannot load: its own drafter kind is named, and the zero-touch method
        ("medusa", "Medusa runs on target tensorrt or reference only, not pytorch; that target drafts with EAGLE-3"),
        ("eagle", "Eagle runs on target tensorrt or reference only, not pytorch; that target drafts with EAGLE-3"),
        # a zero-touch method: the target's zero-touch method is the nearest
        ("lookahead", "use method: ngram there (no extra weights, the nearest to Lookahead)"),
    ],
)
def test_engine_flow_methods_are_refused_with_the_nearest_equivalent(problems_of, method, expected):
    message = problems_of(PRESET_8B + f"speculative: {{method: {method}}}\n")
    assert expected in message
    assert "use method: ngram" in message


def test_no_speculation_under_pipeline_parallelism(problems_of):
    message = problems_of(PRESET_8B + "parallel: {pp: 2}\n")
    assert "ngram with pp 2" in message and "feature-combination-matrix" in message


def test_pipeline_parallelism_without_speculation_plans(plan_of):
    (variant,) = plan_of(PRESET_8B + "parallel: {pp: 2}\nspeculative: {method: none}\n").variants
    assert variant.pp == 2


# -- the LoRA fleet: the shared engine speculates --------------------------------------------------------


def test_the_lora_fleet_speculates_on_its_shared_engine_and_beats_the_engine_flow(roots):
    pytorch = shipped_plan("llama8b-lora-fleet-pytorch", roots)
    engine = shipped_plan("llama8b-lora-fleet", roots)
    (decision,) = pytorch.lora_decisions
    (engine_decision,) = engine.lora_decisions
    assert decision.decision is not None and engine_decision.decision is not None
    shared = [c for c in decision.choices if c.choice == "shared"]
    assert len(shared) >= 20  # 24 merged copies do not fit on 2 x L40S
    assert all(c.speedup > 1.2 for c in shared)  # NGram on the LoRA engine, not plain decoding
    assert decision.decision.fleet_speedup > engine_decision.decision.fleet_speedup
    base = next(v for v in pytorch.variants if v.name == "base")
    assert base.speculative.method == "ngram" and base.build.lora is not None


# -- the deployment files, held to TensorRT-LLM's classes -----------------------------------------------


def fields(record: dict) -> set[str]:
    return set(record["fields"])


def check_options(options: dict) -> None:
    """Every key is an argument of the LLM API (TorchLlmArgs, KvCacheConfig, NGramDecodingConfig, LoraConfig)."""
    assert set(options) <= set(SOURCES["llm_args"]) - {"_class"}, set(options) - set(SOURCES["llm_args"])
    assert set(options["kv_cache_config"]) <= fields(SOURCES["kv_cache_config"])
    spec = options.get("speculative_config")
    if spec is not None:
        classes = SOURCES["speculative_config"]["classes"]
        own = classes[spec["decoding_type"]]  # the class the decoding_type selects (NGram, Eagle3)
        assert spec["decoding_type"] == own["fields"]["decoding_type"]["default"]
        assert set(spec) <= fields(own) | fields(classes["base"]), set(spec) - fields(own) - fields(classes["base"])
        assert spec["max_draft_len"] > 0  # NGram's validator; EAGLE-3 drafts at least one token
        if spec["decoding_type"] == "NGram":
            assert spec["max_matching_ngram_size"] > 0  # PositiveInt
        else:  # Eagle3: speculative_model is required
            assert spec["speculative_model"] and all(isinstance(i, int) for i in spec["eagle3_layers_to_capture"])
            tree = {"use_dynamic_tree", "dynamic_tree_max_topK", "max_total_draft_tokens"}
            if spec.get("use_dynamic_tree"):  # topK > 0 required; max_total in [K, topK x K]
                assert spec["dynamic_tree_max_topK"] > 0
                assert spec["max_draft_len"] <= spec["max_total_draft_tokens"]
                assert spec["max_total_draft_tokens"] <= spec["dynamic_tree_max_topK"] * spec["max_draft_len"]
            else:  # a linear chain: none of the tree's keys (a topK without the tree is warned about)
                assert not tree & set(spec)
    lora = options.get("lora_config")
    if lora is not None:
        assert set(lora) <= fields(SOURCES["lora_config"])
        assert set(lora["lora_target_modules"]) <= {
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_dense",
            "mlp_h_to_4h",
            "mlp_4h_to_h",
            "mlp_gate",
        }


def serve_options() -> set[str]:
    names = set()
    for option in SOURCES["trtllm_serve"]["options"]:
        names |= {name.strip() for name in option.split("/")}
    return names


def test_every_emitted_llm_api_argument_is_one_tensorrt_llm_reads(roots):
    for name in ("llama8b-lora-fleet-pytorch", "smollm2-lora-fleet-pytorch"):
        plan = shipped_plan(name, roots)
        for variant in plan.variants:
            package = variant.stage("package")
            root = PurePosixPath("/models/engines/base")
            check_options(llm_api_options(variant, package, root / "lora", root / "checkpoint" / "eagle3"))
            argv = launch_argv(variant)
            assert argv[0] == "trtllm-serve" and argv[1].endswith("/checkpoint")
            flags = {a for a in argv if a.startswith("--")}
            assert flags <= serve_options(), flags - serve_options()
            backend = argv[argv.index("--backend") + 1]
            assert backend in SOURCES["trtllm_serve"]["options"]["--backend"]["choices"]


def test_the_smollm2_fleet_builds_its_gpu_deployment_on_cpu(cli, smollm2_dir, tmp_path):
    rc, out, err = cli("engine", str(REPO / "specs" / "smollm2-lora-fleet-pytorch.yaml"))
    assert rc == 0, err + out
    checkpoint = tmp_path / "engines" / "base" / "checkpoint"
    opened = open_hf_checkpoint(checkpoint)  # the model the LLM API loads, whole
    opened.close()
    assert opened.spec.num_layers == 30
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (checkpoint / name).is_file()
    serve = json.loads((tmp_path / "triton_repo" / "base" / SERVE_FILE).read_text())
    tunes = serve["fine_tunes"]
    assert sorted(tunes) == ["bullets", "code", "heading", "json", "numbered", "tldr", "xml", "yaml"]
    for name, request in tunes.items():
        folder = tmp_path / "engines" / "base" / "lora" / str(request["lora_int_id"])
        assert request["lora_path"] == f"/models/engines/base/lora/{request['lora_int_id']}"
        copied = load_file(str(folder / "adapter_model.safetensors"))
        original = load_file(str(REPO / "adapters" / f"smollm2-{name}" / "adapter_model.safetensors"))
        assert copied.keys() == original.keys() and all((copied[k] == original[k]).all() for k in copied)
    options = yaml.safe_load((tmp_path / "triton_repo" / "base" / OPTIONS_FILE).read_text())
    check_options(options)
    assert options["speculative_config"]["decoding_type"] == "NGram" and "lora_config" in options
    # Triton's llmapi model passes no lora_request: a LoRA group's deployment does not offer it
    assert not (tmp_path / "triton_repo" / "base" / LLMAPI_MODEL_YAML).exists()
    deployment = (tmp_path / "engines" / "smollm2-lora-fleet-pytorch" / "deploy" / "deployment.yaml").read_text()
    documents = list(yaml.safe_load_all(deployment))
    assert len(documents) == 1  # one trtllm-serve for the base and its eight fine-tunes
    container = documents[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["trtllm-serve", "/models/engines/base/checkpoint"]
    assert container["args"][container["args"].index("--host") + 1] == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_rehearsal_on_the_pytorch_backend_measures_what_it_runs(cli, smollm2_dir, tmp_path, write_spec):
    # The evaluate stage converts the deployed checkpoint for the reference backend and measures the
    # methods this target runs (plain and NGram), never Lookahead, which it cannot run.
    spec = write_spec(
        "name: p\nmodel: {builtin: smollm2-135m-instruct, dtype: float32}\ntarget: pytorch\n"
        "speculative: {method: best}\nevaluation: {count: 2, max_new_tokens: 8}\n"
    )
    rc, out, err = cli("engine", str(spec))
    assert rc == 0, err + out
    report = json.loads((tmp_path / "engines" / "p" / "evaluation" / "evaluation.json").read_text())
    assert sorted(r["method"] for r in report["candidates"]) == ["ngram", "none"]
    assert all(r["identity"]["identical"] for r in report["candidates"]), report["candidates"]
    options = yaml.safe_load((tmp_path / "triton_repo" / "p" / OPTIONS_FILE).read_text())
    chosen = report["choice"]["method"]
    assert ("speculative_config" in options) == (chosen == "ngram")


# -- EAGLE-3 ------------------------------------------------------------------------------------------


def eagle3_spec(hf_config_dir, tmp_path, target: str = "pytorch", method: str = "auto", eagle3: str = "{}") -> str:
    drafter = write(tmp_path / "drafter", config())  # ModelOpt's export for this tiny base, capture layers 0, 1
    model = hf_config_dir()
    return (
        f"name: p\nmodel: {{path: {model}}}\ntarget: {target}\nspeculative: {{method: {method}, eagle3: {eagle3}}}\n"
        f"heads: {{eagle3: {{path: {drafter}}}}}\n"
    )


def test_an_eagle3_drafter_is_auto_s_choice_and_deployed_beside_the_model(plan_of, hf_config_dir, tmp_path):
    (variant,) = plan_of(eagle3_spec(hf_config_dir, tmp_path)).variants
    assert variant.speculative.method == "eagle3" and variant.speculative.eagle3.capture_layers == (0, 1)
    checkpoint = variant.stage("checkpoint")
    assert checkpoint.inputs["drafter"] == tmp_path / "drafter"
    root = PurePosixPath("/models/engines/p")
    options = llm_api_options(variant, variant.stage("package"), root / "lora", root / "checkpoint" / "eagle3")
    check_options(options)
    assert options["speculative_config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 3,
        "speculative_model": "/models/engines/p/checkpoint/eagle3",
        "eagle3_layers_to_capture": [0, 1],  # TensorRT-LLM reads them from here, not from the drafter
    }
    assert variant.memory.heads_gib > 0
    # the KV cache has room for a step's 3 draft tokens past max_seq_len, as NGram's K
    assert options["max_seq_len"] == variant.build.max_seq_len + 3


def test_an_eagle3_dynamic_tree_is_emitted_and_priced_as_a_tree(plan_of, hf_config_dir, tmp_path):
    tree = "{use_dynamic_tree: true, dynamic_tree_max_top_k: 4, max_draft_len: 3}"
    text = eagle3_spec(hf_config_dir, tmp_path, eagle3=tree)
    (variant,) = plan_of(text).variants
    eagle3 = variant.speculative.eagle3
    assert (eagle3.dynamic_tree_max_top_k, eagle3.total_draft_tokens) == (4, 12)  # the default: top-k x K
    assert eagle3.describe() == "eagle3: K=3, dynamic tree (top-4, 12 nodes), capture 0,1"
    root = PurePosixPath("/models/engines/p")
    options = llm_api_options(variant, variant.stage("package"), root / "lora", root / "checkpoint" / "eagle3")
    check_options(options)
    assert options["speculative_config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 3,
        "speculative_model": "/models/engines/p/checkpoint/eagle3",
        "eagle3_layers_to_capture": [0, 1],
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 4,  # TensorRT-LLM's spelling
        "max_total_draft_tokens": 12,
    }
    drafting = variant.speculative.drafting()
    assert drafting.rows == 13 and drafting.eagle_level_rows == (4, 4, 4) and drafting.row_term == "tree_row_s"
    assert options["max_seq_len"] == variant.build.max_seq_len + 12  # room for every node a step verifies
    (variant,) = plan_of(text.replace("max_draft_len: 3", "max_total_draft_tokens: 5")).variants
    assert variant.speculative.drafting().rows == 6
    options = llm_api_options(variant, variant.stage("package"), root / "lora", root / "checkpoint" / "eagle3")
    check_options(options)
    assert options["speculative_config"]["max_total_draft_tokens"] == 5


@pytest.mark.parametrize(
    ("eagle3", "expected"),
    [
        # at the edge: each setting's own range
        ("{dynamic_tree_max_top_k: 0}", "speculative.eagle3.dynamic_tree_max_top_k: must be >= 1"),
        ("{max_total_draft_tokens: 0}", "speculative.eagle3.max_total_draft_tokens: must be >= 1"),
        ("{use_dynamic_tree: 1}", "speculative.eagle3.use_dynamic_tree"),
        # at plan time: TensorRT-LLM's rules for the combination
        ("{use_dynamic_tree: true}", "speculative.eagle3.dynamic_tree_max_top_k: use_dynamic_tree needs"),
        (
            "{use_dynamic_tree: true, dynamic_tree_max_top_k: 2, max_total_draft_tokens: 7}",
            "speculative.eagle3.max_total_draft_tokens: max_total_draft_tokens 7 is more than "
            "dynamic_tree_max_top_k 2 x max_draft_len 3 = 6",
        ),
        (
            "{use_dynamic_tree: true, dynamic_tree_max_top_k: 2, max_total_draft_tokens: 2}",
            "max_total_draft_tokens 2 is less than max_draft_len 3",
        ),
        ("{max_total_draft_tokens: 5}", "5 with a linear chain, which verifies max_draft_len 3 tokens"),
    ],
)
def test_an_illegal_eagle3_tree_is_one_located_error(problems_of, hf_config_dir, tmp_path, eagle3, expected):
    message = problems_of(eagle3_spec(hf_config_dir, tmp_path, method="eagle3", eagle3=eagle3))
    assert expected in message and ".yaml:4:" in message  # the spec line of speculative
    assert "\n" not in message.strip()


def test_an_eagle3_drafter_on_the_engine_flow_is_refused_with_what_it_drafts_with(problems_of, hf_config_dir, tmp_path):
    message = problems_of(eagle3_spec(hf_config_dir, tmp_path, target="tensorrt", method="eagle3"))
    assert "EAGLE-3 runs on target pytorch only, not tensorrt; that target drafts with Eagle (heads.eagle)" in message
    assert "or use method: lookahead there" in message


def test_a_broken_eagle3_drafter_is_one_located_error(problems_of, hf_config_dir, tmp_path):
    text = eagle3_spec(hf_config_dir, tmp_path)
    (tmp_path / "drafter" / "config.json").write_text(json.dumps(config(hidden_size=128)))
    message = problems_of(text)
    assert "heads.eagle3.path" in message and "hidden_size" in message and "\n" not in message.strip()


def test_a_trained_eagle3_drafter_is_planned_before_the_checkpoint(plan_of, hf_config_dir):
    model = hf_config_dir()
    (variant,) = plan_of(
        f"name: p\nmodel: {{path: {model}}}\ntarget: pytorch\nspeculative: {{method: auto}}\n"
        "heads: {eagle3: {train: {init: random, tokens: 2000, epochs: 1}}}\n"
    ).variants
    assert [s.name for s in variant.stages] == ["train-heads", "checkpoint", "package"]
    train = variant.stage("train-heads")
    assert train.params["method"] == "eagle3" and train.inputs["model"] == model
    assert variant.stage("checkpoint").inputs["drafter"] == train.output  # the trained drafter is deployed
    assert variant.speculative.eagle3.capture_layers == (0, 1)  # ModelOpt's default for 2 layers


def test_eagle3_init_base_needs_the_drafter_path(problems_of, hf_config_dir):
    message = problems_of(
        f"name: p\nmodel: {{path: {hf_config_dir()}}}\ntarget: pytorch\nheads: {{eagle3: {{train: {{}}}}}}\n"
    )
    assert "give 'path'" in message and "init: random" in message
