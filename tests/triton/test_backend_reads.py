"""The tensorrt_llm parameters against what NVIDIA's C++ backend reads (pipeline/triton/backend_reads.json).

The table is extracted from the backend's sources by scripts/extract_backend_reads.py; the extractor
is tested here on small literal C++ cases (each with the verdict NVIDIA's code would reach), and
every repository specdeploy writes for a shipped spec, reviewed with ``build --dry-run --repository``
as a release pipeline would, is held to the table: every key read, every required key present for the
conditions that apply, every value parsing as the backend parses it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from triton_fixtures import triton_specs
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.triton.backend_params import reference_parameter_keys
from pipeline.triton.backend_reads import Read, load_table, parameter_problems, value_problem

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted((REPO / "specs").glob("*.yaml"))
EXTRACTOR = REPO / "scripts" / "extract_backend_reads.py"

# -- the extractor, on literal C++ -------------------------------------------------------------------

INSTANCE = """
executor::BatchingType ModelInstanceState::getBatchingTypeFromParams()
{
    auto kind = model_state_->GetParameter<std::string>("gpt_model_type");  // outside any try: required
    if (kind == "V1") { return kStatic; }
    else if (kind == "inflight_fused_batching") { return kInflight; }
    throw std::runtime_error("Invalid gpt_model_type");
}

executor::ExecutorConfig ModelInstanceState::getExecutorConfigFromParams()
{
    int32_t beams = 1;
    try
    {
        beams = model_state_->GetParameter<int32_t>("max_beam_width");  /* forgiven: a default */
    }
    catch (std::exception const& e)
    {
        TLLM_LOG_WARNING("max_beam_width is not specified, will use default value of 1");
    }
    std::string fieldName = "lora_prefetch_dir";
    try
    {
        dir = model_state_->GetParameter<std::string>(fieldName);
    }
    catch (std::exception const& e)
    {
    }
    if (decodingMode && decodingMode->isLookahead())
    {
        try
        {
            w = model_state_->GetParameter<uint32_t>("lookahead_window_size");
        }
        catch (std::exception const& e)
        {
            TLLM_THROW("Decoding mode is set to lookahead but lookahead parameters are not specified.");
        }
    }
    return config;
}

ModelInstanceState::ModelInstanceState(ModelState* model_state)
    : model_state_(model_state)
{
    auto dir = model_state_->GetParameter<std::string>("tokenizer_dir");
    if (dir.empty() || dir == "${tokenizer_dir}") { return; }
}

TRITONSERVER_Error* ModelInstanceState::Create(ModelState* model_state, ModelInstanceState** state)
{
    try
    {
        *state = new ModelInstanceState(model_state);
    }
    catch (std::exception const& ex)
    {
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, ex.what());
    }
    return nullptr;
}
"""

STATE = """
void ModelState::LoadParameters()
{
    try
    {
        auto ids = GetParameter<std::string>("gpu_device_ids");
    }
    catch (std::exception const& e)
    {
        TLLM_LOG_WARNING("gpu_device_ids is not specified, will be automatically set");
    }
}

template <>
std::string ModelState::GetParameter<std::string>(std::string const& name)
{
    throw std::runtime_error("Cannot find parameter with name: " + name);
}
"""


def test_the_extractor_reads_each_verdict_from_the_code(tmp_path):
    (tmp_path / "model_instance_state.cc").write_text(INSTANCE)
    (tmp_path / "model_state.cc").write_text(STATE)
    done = subprocess.run(
        [sys.executable, str(EXTRACTOR), str(tmp_path), "--repository", "o/r", "--commit", "abc", "--path", "src"],
        capture_output=True,
        text=True,
        check=True,
    )
    table = json.loads(done.stdout)
    assert table["source"] == {"repository": "o/r", "commit": "abc", "path": "src", "files": [
        "model_instance_state.cc", "model_state.cc"]}  # fmt: skip
    rows = {row["key"]: row for row in table["reads"]}
    assert set(rows) == {  # the specialisation of GetParameter itself is not a read
        "gpt_model_type",
        "max_beam_width",
        "lora_prefetch_dir",
        "lookahead_window_size",
        "tokenizer_dir",
        "gpu_device_ids",
    }
    # outside any try: required; its values are the literals it is compared with
    assert rows["gpt_model_type"]["required"] and rows["gpt_model_type"]["choices"] == ["V1", "inflight_fused_batching"]
    # inside a try whose catch warns and falls back: optional
    assert not rows["max_beam_width"]["required"] and rows["max_beam_width"]["type"] == "int32_t"
    assert not rows["gpu_device_ids"]["required"] and rows["gpu_device_ids"]["file"] == "model_state.cc"
    # the key named through a variable
    assert rows["lora_prefetch_dir"]["function"] == "ModelInstanceState::getExecutorConfigFromParams"
    # a catch that throws again: required, under the if's condition
    look = rows["lookahead_window_size"]
    assert look["required"] and look["condition"] == "decodingMode && decodingMode->isLookahead()"
    # in the constructor, whose caller's catch returns an error to Triton: still required
    assert rows["tokenizer_dir"]["required"] and rows["tokenizer_dir"]["placeholder"]
    assert rows["tokenizer_dir"]["line"] == INSTANCE.count("\n", 0, INSTANCE.index('("tokenizer_dir")')) + 1


# -- the table and its checks ------------------------------------------------------------------------


def test_the_table_names_its_source_and_the_reads_without_a_fallback():
    table = load_table()
    assert table.source["repository"] == "triton-inference-server/tensorrtllm_backend"
    assert len(str(table.source["commit"])) == 40
    always = {read.key for read in table.reads if read.required and read.condition is None}
    assert always == {"gpt_model_type", "tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend"}
    lookahead = {read.key for read in table.required({"decoding_mode": "lookahead"})} - always
    assert lookahead == {"lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"}


def _read(key: str) -> Read:
    return next(read for read in load_table().reads if read.key == key)


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("enable_kv_cache_reuse", "true", True),
        ("enable_kv_cache_reuse", "1", True),
        ("enable_kv_cache_reuse", "yes", False),  # std::runtime_error, then the default: silently off
        ("max_beam_width", "1", True),
        ("max_beam_width", "1.0", False),
        ("kv_cache_free_gpu_mem_fraction", "0.9", True),
        ("kv_cache_free_gpu_mem_fraction", "90%", False),
        ("lookahead_window_size", "-1", False),  # uint32_t
        ("gpu_device_ids", "0,1;2,3", True),  # two instances of two GPUs each
        ("gpu_device_ids", "0 1", False),
        ("medusa_choices", "{0}, {0, 0}, {1}", True),
        ("medusa_choices", "[[0], [0, 0]]", False),
        ("decoding_mode", "eagle", True),
        ("decoding_mode", "EAGLE", False),  # compared case-sensitively: the default mode instead
        ("batch_scheduler_policy", "max_utilization", True),
        ("guided_decoding_backend", "", True),  # empty: not set
        ("guided_decoding_backend", "outlines", False),
    ],
)
def test_values_parse_as_the_backend_parses_them(key, value, ok):
    assert (value_problem(_read(key), value) is None) is ok


def test_problems_name_every_fault_at_once():
    params = {"gpt_model_type": "inflight_fused_batching", "gpt_model_path": "/m/e", "decoding_mode": "lookahead"}
    problems = parameter_problems(params | {"lookahead_window": "4", "max_beam_width": "x"})
    text = "\n".join(problems)
    for key in ("tokenizer_dir", "guided_decoding_backend", "lookahead_window_size", "lookahead_window:"):
        assert key in text
    assert "max_beam_width: 'x' is not an integer" in text
    assert any("model_instance_state.cc:" in problem for problem in problems)  # where the backend reads it


# -- every repository specdeploy writes for a shipped spec -------------------------------------------


@pytest.fixture(scope="module")
def reviewed(module_tmp) -> dict[str, Path]:
    """spec name -> the folder ``build --dry-run --repository`` wrote for it."""
    from pipeline.cli import main

    root = module_tmp("review")
    out = {}
    for spec in SPECS:
        folder = root / spec.stem
        roots = ["--engines-dir", str(root / "engines"), "--triton-repo", str(root / "triton_repo")]
        assert main([*roots, "build", str(spec), "--dry-run", "--repository", str(folder)]) == 0, spec.name
        out[spec.stem] = folder
    return out


def _configs(folder: Path) -> dict[Path, mc.ModelConfig]:
    return {
        path: text_format.Parse(path.read_text(), mc.ModelConfig()) for path in sorted(folder.glob("*/*/config.pbtxt"))
    }


@pytest.mark.parametrize("spec", [spec.stem for spec in triton_specs()])
def test_every_tensorrt_llm_model_carries_what_the_backend_requires(reviewed, spec):
    configs = _configs(reviewed[spec])
    llms = {path: config for path, config in configs.items() if config.backend == "tensorrtllm"}
    assert llms, spec
    for path, config in llms.items():
        params = {key: value.string_value for key, value in config.parameters.items()}
        gpu = not any(key.startswith("reference_") for key in params)
        # a GPU target's repository has nothing but the backend's keys; the CPU one may add its own
        assert parameter_problems(params, frozenset() if gpu else reference_parameter_keys()) == [], path
        assert params["tokenizer_dir"] == params["guided_decoding_backend"] == ""  # not set: no guided decoding


# NVIDIA's Python models read these from model_config['parameters'] without a fallback (a KeyError in
# initialize if absent): preprocessing/1/model.py @ beb339f52cd272074176448006a3184f7d18f20b and
# 01259b1557671a5742aa61fa993d342b9c90dbba, postprocessing/1/model.py @ 2e2327b93c0a9aa9abbf4c4672f734b03c1e441f
# (NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/); tensorrt_llm_bls reads every
# key with a default. specdeploy ships its own model.py, but a repository NVIDIA's would load too.
PYTHON_REQUIRED = {"preprocessing": {"tokenizer_dir", "multimodal_model_path"}, "postprocessing": {"tokenizer_dir"}}


@pytest.mark.parametrize("spec", ["llama70b-eagle", "llama8b-lora-fleet", "smollm2-lora-fleet"])
def test_pre_and_postprocessing_carry_what_nvidias_models_require(reviewed, spec):
    for path, config in _configs(reviewed[spec]).items():
        kind = next((k for k in PYTHON_REQUIRED if path.parent.name.endswith(k)), None)
        if kind is not None:
            assert PYTHON_REQUIRED[kind] <= set(config.parameters), path
            assert config.parameters["tokenizer_dir"].string_value == "tokenizer"  # relative to the model's folder


def test_the_review_of_a_pytorch_spec_holds_trtllm_serve_s_files(reviewed):
    folder = reviewed["llama8b-lora-fleet-pytorch"] / "base"
    assert sorted(p.name for p in folder.iterdir()) == ["extra_llm_api_options.yaml", "serve.json"]
    serve = json.loads((folder / "serve.json").read_text())
    assert serve["argv"][:2] == ["trtllm-serve", "/models/engines/base/checkpoint"]


def test_the_review_is_the_package_stages_output(reviewed):
    """What the review writes for the GPU target is what the GPU host's package stage will write,
    engine paths where the deployment mounts them, never this host's."""
    folder = reviewed["llama8b-lora-fleet"]
    summary = json.loads((folder / "specdeploy-review.json").read_text())
    assert {repo["name"] for repo in summary["repositories"]} >= {"base", "code-review"}
    (base,) = [c for p, c in _configs(folder).items() if p.parts[-3:-1] == ("base", "tensorrt_llm")]
    params = {key: value.string_value for key, value in base.parameters.items()}
    assert params["gpt_model_path"] == "/models/engines/base/engine"
    assert params["lora_prefetch_dir"] == "/models/engines/base/lora"
    for path in folder.rglob("*"):
        if path.is_file():
            assert str(folder.parent) not in path.read_text(errors="replace"), path


def test_review_refuses_a_folder_it_did_not_write(cli, tmp_path):
    spec = str(REPO / "specs" / "llama70b-medusa.yaml")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    rc, _, err = cli("build", spec, "--dry-run", "--repository", str(mine))
    assert rc == 4 and "specdeploy did not write" in err and (mine / "notes.txt").read_text() == "keep me"
    review = tmp_path / "review"
    assert cli("build", spec, "--dry-run", "--repository", str(review))[0] == 0
    assert cli("build", spec, "--dry-run", "--repository", str(review))[0] == 0  # an earlier review: replaced
    rc, _, err = cli("build", spec, "--repository", str(review))
    assert rc == 2 and "needs --dry-run" in err


def test_the_shipped_table_is_what_the_extractor_writes():
    """The checked-in table is the extractor's own output format (one read a line), unedited."""
    text = (REPO / "pipeline" / "triton" / "backend_reads.json").read_text()
    table = json.loads(text)
    rows = ",\n".join("  " + json.dumps(row) for row in table["reads"])
    assert text == f'{{\n "source": {json.dumps(table["source"])},\n "reads": [\n{rows}\n ]\n}}\n'
