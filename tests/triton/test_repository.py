"""The package stage's Triton repository: every config parses with Triton's schema and says what the plan says."""

from __future__ import annotations

import json
import py_compile
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import text_format
from triton_fixtures import TINY_SPEC, fake_engine, make_model_dir, plan_spec, tiny_plan, triton_specs
from tritonclient.grpc import model_config_pb2

from pipeline import methods, trees
from pipeline.errors import InputError, StageError
from pipeline.stages import package
from pipeline.stages.runner import run_stage
from pipeline.triton import pbtxt
from pipeline.triton.backend_params import check_parameters, reference_parameter_keys
from pipeline.triton.backend_reads import load_table
from pipeline.triton.repository import MANIFEST, emit_repository, model_steps, validate_repository

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SPECS = triton_specs()
MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")


def _parse_all(repo: Path) -> dict[str, model_config_pb2.ModelConfig]:
    configs = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        text = path.read_text()
        assert "${" not in text, path
        configs[path.parent.name] = text_format.Parse(text, model_config_pb2.ModelConfig())
    return configs


def _params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def _check_against_plan(variant, repo: Path, engine: Path) -> None:
    configs = _parse_all(repo)
    ensemble_name = variant.serving.model_name
    assert set(configs) == {ensemble_name, *MODELS}
    llm, ensemble = configs["tensorrt_llm"], configs[ensemble_name]
    params = _params(llm)
    reference_only = reference_parameter_keys() if variant.target == "reference" else set()
    assert set(params) - reference_only <= load_table().keys
    assert llm.backend == "tensorrtllm"
    assert llm.max_batch_size == variant.build.max_batch_size == ensemble.max_batch_size
    assert llm.model_transaction_policy.decoupled is variant.serving.decoupled
    assert params["gpt_model_type"] == "inflight_fused_batching"
    # Where the deployment mounts the engines (deploy.mount_path), never the build machine's path.
    assert params["gpt_model_path"] == f"{variant.deploy.mount_path}/engines/{engine.parent.name}/{engine.name}"
    if variant.target == "reference":  # and where the CPU backend finds it relative to the model's folder
        assert (repo / "tensorrt_llm" / params["reference_engine_path"]).resolve() == engine.resolve()
    if "lora_prefetch_dir" in params:  # a LoRA group's adapters: where the deployment mounts them, as the engine
        group = variant.stage("package").inputs["lora"].parent.name  # the group's engine folder
        assert params["lora_prefetch_dir"] == f"{variant.deploy.mount_path}/engines/{group}/lora"
    assert params["max_beam_width"] == "1"
    assert params["decoding_mode"] == methods.definition(variant.method).triton_decoding_mode
    assert params["batch_scheduler_policy"] == variant.serving.batch_scheduler_policy
    assert float(params["kv_cache_free_gpu_mem_fraction"]) == variant.serving.kv_cache_free_gpu_mem_fraction
    ids = [int(i) for i in params["gpu_device_ids"].split(",")]
    assert len(set(ids)) == len(ids) == variant.tp * variant.pp
    look = variant.speculative.lookahead
    lookahead_keys = {"lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"}
    if look is not None:
        assert (
            int(params["lookahead_window_size"]),
            int(params["lookahead_ngram_size"]),
            int(params["lookahead_verification_set_size"]),
        ) == (look.window, look.ngram, look.verification_set)
        assert look.max_draft_len == variant.build.max_draft_len
        assert lookahead_keys <= {t.name for t in ensemble.input}
    else:
        assert not lookahead_keys & set(params)
        assert not lookahead_keys & {t.name for t in ensemble.input}
    assert lookahead_keys <= {t.name for t in llm.input}  # declared for every mode, as NVIDIA's template does
    for method in ("medusa", "eagle"):
        config = getattr(variant.speculative, method)
        if config is not None and config.tree is not None:
            assert trees.parse_triton_choices(params[f"{method}_choices"]) == config.tree
        else:
            assert f"{method}_choices" not in params
    steps = [model for model, _, _ in model_steps(ensemble, repo)]
    assert steps == ["preprocessing", "tensorrt_llm", "postprocessing"]
    for name in ("preprocessing", "postprocessing"):
        assert configs[name].backend == "python"
        assert _params(configs[name])["tokenizer_dir"] == "tokenizer"  # relative: the repo can move
        assert (repo / name / "tokenizer" / "tokenizer.json").is_file()
        assert (repo / name / "1" / "model.py").is_file()
    assert _params(configs["preprocessing"])["max_input_len"] == str(variant.build.max_input_len)
    assert {t.name for t in ensemble.output} >= {
        "text_output",
        "acceptance_rate",
        "total_accepted_draft_tokens",
        "total_draft_tokens",
    }
    validate_repository(repo)


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=[p.stem for p in EXAMPLE_SPECS])
def test_every_example_spec_packages_to_a_valid_repository(spec, tmp_path, tokenizer_dir):
    plan = plan_spec(spec, tmp_path)
    assert plan.variants
    for variant in plan.variants:
        engine = fake_engine(variant, tmp_path / "engines" / variant.name / "engine")
        out = tmp_path / "repos" / variant.name
        emit_repository(variant, out, engine_dir=engine, tokenizer_dir=tokenizer_dir)
        _check_against_plan(variant, out, engine)
        manifest = json.loads((out / MANIFEST).read_text())
        assert manifest["world_size"] == variant.world_size and manifest["method"] == variant.method


def test_package_stage_through_the_runner_is_relocatable(tmp_path):
    variant = tiny_plan(tmp_path)
    engine = fake_engine(variant)
    stage = variant.stage("package")
    result = run_stage(stage, lambda out: package.run(variant, stage, out), on_wait=print)
    assert result.status == "ran" and stage.output.is_dir()
    _check_against_plan(variant, stage.output, engine)
    moved = tmp_path / "elsewhere"
    stage.output.rename(moved)
    validate_repository(moved)
    assert (moved / "postprocessing" / "tokenizer" / "tokenizer_config.json").is_file()
    pre = _params(_parse_all(moved)["preprocessing"])
    assert (pre["lookahead_window_size"], pre["lookahead_ngram_size"], pre["lookahead_verification_set_size"]) == (
        "3",
        "2",
        "2",
    )


def test_explicit_gpu_ids_and_non_decoupled_serving(tmp_path):
    make_model_dir(tmp_path / "model")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: t\nmodel: {path: model}\nparallel: {tp: 2}\ntarget: reference\n"
        "serving: {gpu_device_ids: [4, 5], decoupled: false, model_name: chat}\n"
    )
    variant = plan_spec(spec, tmp_path).variants[0]
    engine = fake_engine(variant)
    out = tmp_path / "repo"
    emit_repository(variant, out, engine_dir=engine, tokenizer_dir=variant.model_dir)
    configs = _parse_all(out)
    assert _params(configs["tensorrt_llm"])["gpu_device_ids"] == "4,5"
    assert configs["tensorrt_llm"].model_transaction_policy.decoupled is False
    assert configs["chat"].backend == "python"  # the ensemble's API, run by the BLS code
    assert configs["chat"].model_transaction_policy.decoupled is False
    _check_against_plan(variant, out, engine)


def test_engine_that_differs_from_the_plan_is_refused(tmp_path):
    variant = tiny_plan(tmp_path)
    engine = fake_engine(variant)
    config = json.loads((engine / "config.json").read_text())
    config["build_config"]["max_draft_len"] = 40
    (engine / "config.json").write_text(json.dumps(config))
    with pytest.raises(StageError, match="max_draft_len is 40, the plan says"):
        emit_repository(variant, tmp_path / "repo", engine_dir=engine, tokenizer_dir=variant.model_dir)


def test_missing_engine_and_missing_tokenizer_say_what_to_do(tmp_path):
    variant = tiny_plan(tmp_path)
    with pytest.raises(StageError, match="run the build stage first"):
        emit_repository(variant, tmp_path / "repo", engine_dir=tmp_path / "nothing", tokenizer_dir=variant.model_dir)
    engine = fake_engine(variant)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StageError, match="no tokenizer files"):
        emit_repository(variant, tmp_path / "repo2", engine_dir=engine, tokenizer_dir=tmp_path / "empty")


def test_ensemble_name_cannot_shadow_a_model(tmp_path):
    variant = tiny_plan(
        tmp_path, "name: t\nmodel: {path: model}\nserving: {model_name: preprocessing}\ntarget: reference\n"
    )
    with pytest.raises(InputError, match="collides"):
        emit_repository(variant, tmp_path / "repo", engine_dir=fake_engine(variant), tokenizer_dir=variant.model_dir)


def test_unknown_backend_parameter_and_placeholders_are_refused(tmp_path):
    with pytest.raises(StageError, match="lookahead_window"):
        check_parameters({"decoding_mode": "lookahead", "lookahead_window": "4"})
    config = model_config_pb2.ModelConfig(name="x", backend="python")
    pbtxt.set_parameters(config, {"tokenizer_dir": "${tokenizer_dir}"})
    with pytest.raises(StageError, match="placeholder"):
        pbtxt.write(config, tmp_path / "x" / "config.pbtxt")
    with pytest.raises(StageError, match="config.pbtxt"):
        pbtxt.parse("max_batch_size: ${triton_max_batch_size}", "config.pbtxt")


@pytest.mark.parametrize(
    ("ensemble", "wired", "broken"),
    [
        ("python", '\\"input_ids\\":', '\\"input_idz\\":'),  # in the JSON of specdeploy_steps
        ("triton", 'key: "input_ids"', 'key: "input_idz"'),  # an input_map entry
    ],
)
def test_broken_ensemble_wiring_is_caught(tmp_path, ensemble, wired, broken):
    variant = tiny_plan(tmp_path)
    variant = replace(variant, serving=variant.serving.model_copy(update={"ensemble": ensemble}))
    out = tmp_path / "repo"
    emit_repository(variant, out, engine_dir=fake_engine(variant), tokenizer_dir=variant.model_dir)
    path = out / "ensemble" / "config.pbtxt"
    assert wired in path.read_text()
    path.write_text(path.read_text().replace(wired, broken))
    with pytest.raises(StageError, match="tensorrt_llm has no input 'input_idz'"):
        validate_repository(out)


def test_python_models_compile():
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        py_compile.compile(str(REPO / "pipeline" / "triton" / "models" / f"{name}.py"), doraise=True)


def test_repository_packaged_before_the_bls_model_is_stale_not_broken(tmp_path):
    """The package stage's fingerprint does not cover specdeploy's code: an older repository has no
    tensorrt_llm_bls. It still validates, and `serve` warns to re-package (stale_models)."""
    import shutil

    from pipeline.triton.repository import stale_models

    variant = tiny_plan(tmp_path)
    out = tmp_path / "repo"
    emit_repository(variant, out, engine_dir=fake_engine(variant), tokenizer_dir=variant.model_dir)
    assert stale_models(out) == []
    shutil.rmtree(out / "tensorrt_llm_bls")
    validate_repository(out)
    assert stale_models(out) == ["tensorrt_llm_bls"]


def test_an_ngram_variant_carries_its_pool_settings_to_the_reference_backend(tmp_path):
    from pipeline.runtime.triton.io import parse_parameters

    text = TINY_SPEC.replace(
        "  method: lookahead\n",
        "  method: ngram\n  ngram: {max_draft_len: 3, max_matching_ngram_size: 3, is_public_pool: false}\n",
    )
    variant = tiny_plan(tmp_path, text)
    engine = fake_engine(variant)
    stage = variant.stage("package")
    run_stage(stage, lambda out: package.run(variant, stage, out), on_wait=print)
    _check_against_plan(variant, stage.output, engine)
    params = _params(_parse_all(stage.output)["tensorrt_llm"])
    config = {"parameters": {key: {"string_value": value} for key, value in params.items()}}
    settings = parse_parameters(config, stage.output / "tensorrt_llm").method
    # K is the engine's (0 here: read at load); the pool's settings are the spec's
    assert settings.ngram is not None
    assert (settings.ngram.max_matching_ngram_size, settings.ngram.public_pool) == (3, False)
