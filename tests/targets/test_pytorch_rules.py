"""The PyTorch-backend rules table (pipeline/targets/pytorch_rules.json) and its extractor.

``scripts/extract_llm_api_rules.py`` reads TensorRT-LLM's sources at git refs (parsed with ``ast``,
never imported). Here it runs on small literal sources written to tmp_path, as a plain folder and as
a git repository with release tags, so nothing needs the network or a TensorRT-LLM mirror; the
committed table is checked for its shape when it is there.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
EXTRACTOR = REPO / "scripts" / "extract_llm_api_rules.py"
RULES = REPO / "pipeline" / "targets" / "pytorch_rules.json"
SHA = re.compile(r"^[0-9a-f]{40}$")


@pytest.fixture(scope="module")
def rules_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("extract_llm_api_rules", EXTRACTOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# -- small literal sources: an llm_args.py, a LoRA config, the llmapi model, the matrix, a drafter ---

LLM_ARGS = """
from typing import ClassVar, Literal, Optional, Union
from pydantic import AliasChoices, BaseModel
from pydantic import Field as PydanticField
from ..lora_helper import LoraConfig


def Field(default=..., *, status=None, **kwargs):
    return PydanticField(default, **kwargs)


class StrictBaseModel(BaseModel):
    pass


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = Field(default=None, description="The maximum number of draft tokens.")
    speculative_model: Optional[str] = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir"),
        description="The draft model: a path or "
        "a Hugging Face id.",
    )
    max_concurrency: Optional[int] = Field(default=None, status="prototype")
    _private: int = 0


class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle"] = "Eagle"
    eagle3_one_model: Optional[bool] = True
    eagle3_layers_to_capture: Optional[set] = None
    max_total_draft_tokens: int = Field(..., description="Required here.")


class NGramDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "NGram"
    max_matching_ngram_size: int = 2
    max_draft_len: int = Field(default=4)


class MTPDecodingConfig(DecodingBaseConfig):
    num_nextn_predict_layers: int = 1

    @classmethod
    def from_dict(cls, data):
        return cls(**data)


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Draft_Target"] = Field(default="Draft_Target")


DECODERS = {"Eagle": EagleDecodingConfig, "NGram": NGramDecodingConfig, "MTP": MTPDecodingConfig}

SpeculativeConfig = Optional[Union[EagleDecodingConfig, NGramDecodingConfig, MTPDecodingConfig]]


class KvCacheConfig(StrictBaseModel):
    free_gpu_memory_fraction: Optional[float] = Field(default=0.9, description="Fraction of free memory.")
    enable_block_reuse: bool = True
    dtype: str = "auto"


class BaseLlmArgs(StrictBaseModel):
    model: str = Field(description="The model.")
    tensor_parallel_size: int = Field(default=1, description="Tensor parallelism.")
    max_batch_size: Optional[int] = None
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    speculative_config: SpeculativeConfig = None
    lora_config: Optional[LoraConfig] = None


class TorchLlmArgs(BaseLlmArgs):
    backend: Literal["pytorch"] = "pytorch"
    max_batch_size: int = 2048
"""

LORA_HELPER = """
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class LoraConfig:
    lora_dir: List[str] = field(default_factory=list)
    max_lora_rank: int = 64
    max_loras: Optional[int] = None
    lora_target_modules: List[str] = field(default_factory=list)
"""

MODEL_YAML = """
model: /models/base
backend: "pytorch"
tensor_parallel_size: 1
# pipeline_parallel_size: 1
triton_config:
  max_batch_size: 0
  decoupled: False
"""

MODEL_PY = """
class TritonPythonModel:
    def initialize(self, args):
        self.llm = LLM(**update_llm_args_with_extra_dict({}, args))

    async def execute(self, request):
        # TODO: lora
        return self.llm.generate_async(request.prompt, self.sampling_params, streaming=True)
"""

MATRIX = """
# Feature Combination Matrix

| Feature | Overlap Scheduler | Pipeline Parallelism | Speculative Decoding |
| --- | --- | --- | --- |
| Overlap Scheduler | --- | | |
| Pipeline Parallelism | Yes | --- | |
| Speculative Decoding | Yes | No | --- |
| **LoRA** | Yes | Yes | Untested |
"""

SPECULATIVE = """
@register_auto_model("Eagle3LlamaForCausalLM")
class Eagle3ForCausalLM:
    def __init__(self, model_config):
        config = model_config.pretrained_config
        self.draft_vocab_size = getattr(config, "draft_vocab_size", config.vocab_size)
        ensure_target_hidden_size(config)
        if hasattr(config, "eagle_config"):
            self.norm_first = config.eagle_config.get("norm_before_fc", False)
        self.layers = model_config.spec_config.num_capture_layers


class MTPHead:
    def forward(self, config):
        return config.num_nextn_predict_layers


def ensure_target_hidden_size(config):
    return config.target_hidden_size
"""

FILES = {
    "tensorrt_llm/llmapi/llm_args.py": LLM_ARGS,
    "tensorrt_llm/lora_helper.py": LORA_HELPER,
    "triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml": MODEL_YAML,
    "triton_backend/all_models/llmapi/tensorrt_llm/1/model.py": MODEL_PY,
    "docs/source/features/feature-combination-matrix.md": MATRIX,
    "tensorrt_llm/_torch/models/modeling_speculative.py": SPECULATIVE,
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for path, source in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(source))
    return root


def by_name(fields: list[dict]) -> dict[str, dict]:
    return {f["name"]: f for f in fields}


# -- the parsing functions, on the literal sources ----------------------------------------------------


def test_a_field_with_a_default_and_a_description(rules_script):
    module = rules_script.parse_module(textwrap.dedent(LLM_ARGS), "tensorrt_llm/llmapi/llm_args.py")
    base = by_name(module.classes["DecodingBaseConfig"].fields)
    assert base["max_draft_len"] == {
        "name": "max_draft_len",
        "annotation": "Optional[int]",
        "defined_in": "DecodingBaseConfig",
        "line": base["max_draft_len"]["line"],
        "description": "The maximum number of draft tokens.",
        "required": False,
        "default": None,
    }
    assert base["speculative_model"]["aliases"] == ["speculative_model", "speculative_model_dir"]
    assert base["speculative_model"]["description"] == "The draft model: a path or a Hugging Face id."
    assert base["max_concurrency"]["status"] == "prototype"
    assert "_private" not in base
    eagle = by_name(module.classes["EagleDecodingConfig"].fields)
    assert eagle["max_total_draft_tokens"]["required"] is True
    assert "default" not in eagle["max_total_draft_tokens"]


def test_a_subclass_inherits_the_base_config_fields_and_overrides_its_defaults(rules_script):
    module = rules_script.parse_module(textwrap.dedent(LLM_ARGS), "tensorrt_llm/llmapi/llm_args.py")
    ngram = by_name(rules_script.all_fields(module, "NGramDecodingConfig"))
    assert ngram["max_draft_len"]["defined_in"] == "NGramDecodingConfig"
    assert ngram["max_draft_len"]["default"] == 4
    assert ngram["speculative_model"]["defined_in"] == "DecodingBaseConfig"
    assert ngram["max_matching_ngram_size"]["default"] == 2
    assert "decoding_type" not in ngram  # a ClassVar is no field


def test_decoding_types_from_literals_classvars_fields_and_dispatch_tables(rules_script):
    module = rules_script.parse_module(textwrap.dedent(LLM_ARGS), "tensorrt_llm/llmapi/llm_args.py")
    spec = rules_script.speculative_configs(module)
    types = {name: entry["decoding_type"] for name, entry in spec["all_decoding_types"].items()}
    assert types == {
        "EagleDecodingConfig": "Eagle",
        "NGramDecodingConfig": "NGram",
        "MTPDecodingConfig": "MTP",
        "DraftTargetDecodingConfig": "Draft_Target",
    }
    assert spec["all_decoding_types"]["MTPDecodingConfig"]["source"] == "dispatch table"
    # No "Eagle3" class at this ref: EAGLE-3 goes through the Eagle class.
    assert spec["roles"]["eagle3"] is None
    assert spec["roles"]["eagle3_effective"] == "EagleDecodingConfig"
    eagle = spec["classes"]["EagleDecodingConfig"]
    assert set(eagle["roles"]) == {"eagle", "eagle3_effective"}
    assert "max_draft_len" in by_name(eagle["fields"])
    assert by_name(eagle["fields"])["eagle3_layers_to_capture"]["default"] is None
    assert by_name(spec["base"]["fields"]).keys() == {"max_draft_len", "speculative_model", "max_concurrency"}


def test_the_llm_arguments_kv_cache_and_lora_config_through_the_imports(rules_script, tmp_path):
    tree = rules_script.DirTree(write_tree(tmp_path, FILES), "0" * 40)
    module = rules_script.parse_module(tree.read(rules_script.LLM_ARGS), rules_script.LLM_ARGS)
    args = rules_script.llm_args(module)
    assert args["class"] == "TorchLlmArgs" and args["lineage"] == ["TorchLlmArgs", "BaseLlmArgs", "StrictBaseModel"]
    assert args["fields"]["max_batch_size"]["default"] == 2048
    assert args["fields"]["model"]["required"] is True
    assert args["fields"]["kv_cache_config"]["default_factory"] == "KvCacheConfig"
    assert args["speculative_config_classes"] == ["EagleDecodingConfig", "NGramDecodingConfig", "MTPDecodingConfig"]
    assert "enable_lora" in args["missing"]
    kv = rules_script.kv_cache_config(tree, module)
    assert by_name(kv["fields"])["free_gpu_memory_fraction"]["default"] == 0.9
    lora = rules_script.lora_config(tree, module)
    assert (lora["class"], lora["file"], lora["dataclass"]) == ("LoraConfig", "tensorrt_llm/lora_helper.py", True)
    assert by_name(lora["fields"])["lora_dir"]["default_factory"] == "list"
    assert by_name(lora["fields"])["max_lora_rank"]["default"] == 64


def test_the_llmapi_model_matrix_and_drafter_reads(rules_script, tmp_path):
    tree = rules_script.DirTree(write_tree(tmp_path, FILES), "0" * 40)
    model = rules_script.llmapi_model(tree)
    assert list(model["keys"]) == ["model", "backend", "tensor_parallel_size", "triton_config"]
    assert model["keys"]["triton_config"] == {"keys": {"max_batch_size": 0, "decoupled": False}}
    assert [k["key"] for k in model["commented_keys"]] == ["pipeline_parallel_size"]
    assert model["passes_lora_request"] is False and model["builds_llm_from_yaml"] is True
    assert model["generate_async_calls"][0]["keywords"] == ["streaming"]

    matrix = rules_script.feature_matrix(tree)
    pairs = {(p["pair"], p["value"]) for p in matrix["pairs"]}
    assert pairs == {("lora x speculative", "Untested"), ("pipeline_parallel x speculative", "No")}

    drafter = rules_script.eagle3_drafter(tree)
    assert drafter["architectures"][0]["name"] == "Eagle3LlamaForCausalLM"
    assert drafter["eagle_config_keys"] == ["norm_before_fc"]
    assert {"draft_vocab_size", "eagle_config", "vocab_size"} <= set(drafter["drafter_config_keys_in_eagle_classes"])
    assert "num_nextn_predict_layers" not in drafter["drafter_config_keys_in_eagle_classes"]
    assert "target_hidden_size" in drafter["drafter_config_keys_in_eagle_classes"]  # a helper the class calls
    assert drafter["speculative_config_keys_in_eagle_classes"] == ["num_capture_layers"]
    read = next(r for r in drafter["reads"] if r["key"] == "draft_vocab_size")
    assert read["kinds"] == ["getattr"] and read["lines"] == [6]  # line 1 is the blank after """


def test_absent_files_are_recorded_as_absent(rules_script, tmp_path):
    result = rules_script.extract(rules_script.DirTree(tmp_path, "0" * 40), "empty")
    assert result["speculative_configs"] is None and result["llm_args"] is None
    assert result["llmapi_model_yaml"]["present"] is False
    assert result["feature_matrix"]["present"] is False and result["eagle3_drafter"]["present"] is False
    assert set(result["files"].values()) == {None}


def test_newest_version_tag(rules_script):
    tags = ["v1.2.1", "v1.3.0rc9", "v1.3.0rc10", "v1.2.0", "nightly", "v1.3.0rc10.post1"]
    assert rules_script.newest_version_tag(tags) == "v1.3.0rc10.post1"
    assert rules_script.newest_version_tag(["v1.3.0rc2", "v1.3.0"]) == "v1.3.0"
    assert rules_script.newest_version_tag(["main"]) is None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_two_tags_of_a_git_repository_and_their_differences(rules_script, tmp_path):
    source = write_tree(tmp_path / "trtllm", FILES)

    def git(*args: str) -> str:
        command = ["git", "-C", str(source), "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    git("tag", "v1.2.1")
    later = LLM_ARGS.replace(
        "    eagle3_one_model: Optional[bool] = True\n",
        "    eagle3_one_model: Optional[bool] = True\n    use_dynamic_tree: bool = False\n",
    )
    (source / "tensorrt_llm/llmapi/llm_args.py").write_text(textwrap.dedent(later))
    (source / "triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml").unlink()
    git("commit", "-q", "-a", "-m", "two")
    git("tag", "-a", "v1.3.0rc10", "-m", "annotated")
    git("tag", "v1.3.0rc9", "HEAD~1")

    out = tmp_path / "rules.json"
    assert rules_script.main([str(source), "--ref", "v1.2.1", "--ref", "newest", "-o", str(out)]) == 0
    rules = json.loads(out.read_text())
    first, second = rules["refs"]
    assert (first["ref"], second["ref"]) == ("v1.2.1", "v1.3.0rc10")
    assert first["commit"] == git("rev-parse", "v1.2.1") and second["commit"] == git("rev-parse", "HEAD")
    assert first["files"]["tensorrt_llm/llmapi/llm_args.py"] == git(
        "rev-parse", "v1.2.1:tensorrt_llm/llmapi/llm_args.py"
    )
    assert second["files"]["triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml"] is None
    assert "newest of 3" in second["selected"]
    assert any(
        "EagleDecodingConfig: field added: use_dynamic_tree: bool (default=false)" in d for d in rules["differences"]
    )
    assert any("llmapi_model_yaml.present: True -> False" in d for d in rules["differences"])
    assert all(d.startswith("v1.2.1 -> v1.3.0rc10: ") for d in rules["differences"])


# -- the committed table ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rules() -> dict:
    if not RULES.is_file():
        pytest.skip(f"{RULES.relative_to(REPO)} is not generated yet (scripts/extract_llm_api_rules.py writes it)")
    return json.loads(RULES.read_text())


def test_the_table_names_both_refs_with_their_commits(rules):
    refs = rules["refs"]
    assert len(refs) == 2 and refs[0]["ref"] == "v1.2.1" and refs[1]["ref"] != "v1.2.1"
    for ref in refs:
        assert SHA.match(ref["commit"]), ref["commit"]
        assert all(sha is None or SHA.match(sha) for sha in ref["files"].values())
        assert ref["files"]["tensorrt_llm/llmapi/llm_args.py"]
    assert isinstance(rules["differences"], list)


def test_the_table_holds_the_eagle3_and_ngram_configs(rules):
    for ref in rules["refs"]:
        spec = ref["speculative_configs"]
        eagle3, ngram = spec["roles"]["eagle3_effective"], spec["roles"]["ngram"]
        assert spec["classes"][eagle3]["decoding_type"] in ("Eagle3", "Eagle")
        assert spec["classes"][ngram]["decoding_type"] == "NGram"
        for name in (eagle3, ngram):
            assert "max_draft_len" in by_name(spec["classes"][name]["fields"])
