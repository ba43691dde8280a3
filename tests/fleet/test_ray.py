"""`specdeploy engine --ray` on a real local Ray cluster with four logical GPUs (one per module).

Reference-target variants build for real; tensorrt-target variants run the stand-in
trtllm-build of tests/standins.py (fake_tensorrt_llm), and each build task is checked
for the GPU count and the placement group its plan asks for. A worker killed in the middle of a
stage is retried by Ray and the outputs equal a clean run's, byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import ray

from pipeline.errors import StageError
from pipeline.fleet.graph import build_graph
from pipeline.fleet.ray_runner import project_runtime_env, run_fleet
from pipeline.fleet.task import BLOCKED, FAILED, RAN, SKIPPED, UNAVAILABLE
from pipeline.io.hashing import content_files, sha256_file
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from pipeline.stages.execute import STAGE_BODIES
from tests.conftest import embedded_cache_dir
from tests.quantize.conftest import build_tiny_llama
from tests.standins import fake_tensorrt_llm

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

LIMITS = "build: {max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}\n"


@pytest.fixture(scope="module")
def cluster(module_tmp):
    """One local cluster for the module: 2 CPUs, 4 logical GPUs; the stand-in trtllm-build and
    its `tensorrt_llm` package on the workers' PATH and PYTHONPATH."""
    bin_dir, site = fake_tensorrt_llm(module_tmp("standin"))
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p),
    }
    ray.init(
        num_cpus=2,
        num_gpus=4,
        include_dashboard=False,
        logging_level="ERROR",
        runtime_env=project_runtime_env() | {"env_vars": env},
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny(module_tmp) -> Path:
    return build_tiny_llama(module_tmp("tiny") / "model")


def plan_of(tmp_path: Path, text: str):
    spec = tmp_path / "fleet.yaml"
    spec.write_text(text)
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", embedded_cache_dir().resolve())
    return make_plan(load_spec(spec), roots), roots


def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every content file (bookkeeping dot files aside: their fingerprints hold mtimes)."""
    return {str(f): sha256_file(f) for root in roots for f in content_files(root)}


def test_fleet_builds_side_by_side_with_the_gpus_and_placement_the_plan_asks_for(cluster, tiny, tmp_path, smollm2_dir):
    plan, roots = plan_of(
        tmp_path,
        f"""\
name: fleet
model: {{builtin: smollm2-135m-instruct, dtype: float32}}
speculative: {{method: lookahead}}
{LIMITS}target: reference
variants:
  - name: ref-tp1
  - name: ref-tp3
    parallel: {{tp: 3}}
  - name: trt-tp2
    model: {{builtin: null, path: {tiny}}}
    target: tensorrt
    parallel: {{tp: 2}}
  - name: trt-tp2-one-worker
    model: {{builtin: null, path: {tiny}}}
    target: tensorrt
    parallel: {{tp: 2}}
    build: {{workers: 1}}
  - name: trt-tp3-pp2
    target: tensorrt
    parallel: {{tp: 3, pp: 2}}
""",
    )
    graph = build_graph(plan)
    result = run_fleet(graph, roots=(roots.engines, roots.triton_repo, roots.cache))
    states = {variant: result.stage_states(variant) for variant in graph.variants}
    # smollm2_dir prepared the embedded model already: its task finds it and skips.
    assert states["ref-tp1"] == {"prepare": SKIPPED, "convert": RAN, "build": RAN, "package": RAN}
    for name in ("ref-tp3", "trt-tp2", "trt-tp2-one-worker"):
        assert {s for column, s in states[name].items() if column != "prepare"} == {RAN}, (name, states[name])
    # The variants on the embedded model share one task that prepares it.
    assert len({graph.cells[(v, "prepare")] for v in ("ref-tp1", "ref-tp3", "trt-tp3-pp2")}) == 1

    # Reference variants: the real engine config and Triton repository, rank files linked.
    engine = json.loads((roots.engines / "ref-tp3" / "engine" / "config.json").read_text())
    assert engine["pretrained_config"]["mapping"]["tp_size"] == 3
    assert sorted(p.name for p in (roots.engines / "ref-tp3" / "engine").glob("rank*")) == [
        f"rank{r}.safetensors" for r in range(3)
    ]
    assert (roots.triton_repo / "ref-tp1" / "tensorrt_llm" / "config.pbtxt").is_file()

    # Build tasks: the plan's GPU count, in a STRICT_PACK placement group holding exactly that.
    for name, gpus in (("trt-tp2", 2), ("trt-tp2-one-worker", 1)):
        variant = next(v for v in plan.variants if v.name == name)
        assert variant.stage("build").resources.gpus == gpus
        report = result.reports[str(variant.stage("build").output)]
        assert len(report.gpu_ids) == gpus and len(set(report.gpu_ids)) == gpus
        assert report.placement_group == report.extra["placement_group"]
        assert report.extra["strategy"] == "STRICT_PACK"
        assert f"'GPU': {float(gpus)}" in report.extra["bundle"]
        call = json.loads((variant.stage("build").output / "fake-call.json").read_text())
        assert call["argv"][call["argv"].index("--workers") + 1] == str(gpus)
    # CPU stages run outside placement groups and get no GPU.
    convert = result.reports[str(plan.variants[2].stage("convert").output)]
    assert convert.gpu_ids == () and convert.placement_group is None

    # 6 GPUs on one node: no node has them, so the variant stops there (exit 3) and says why.
    assert states["trt-tp3-pp2"]["convert"] == RAN
    assert states["trt-tp3-pp2"]["build"] == UNAVAILABLE and states["trt-tp3-pp2"]["package"] == BLOCKED
    stop = result.stopped("trt-tp3-pp2")
    assert "needs 1 CPU, 6 GPU" in stop.message and "4 GPU" in stop.message and stop.exit_code == 3
    assert result.exit_code == 3


def test_a_worker_killed_mid_stage_is_retried_and_the_outputs_equal_a_clean_run(cluster, tiny, tmp_path):
    plan, roots = plan_of(
        tmp_path,
        f"""\
name: retry
model: {{path: {tiny}, dtype: float32}}
{LIMITS}target: reference
parallel: {{tp: 2}}
variants:
  - name: retried
  - name: broken
  - name: lost
""",
    )
    clean = run_fleet(build_graph(plan, only={"retried"}), roots=(roots.engines, roots.triton_repo))
    assert clean.exit_code == 0
    expected = snapshot(roots.engines, roots.triton_repo)
    assert len(expected) > 10
    shutil.rmtree(roots.engines)
    shutil.rmtree(roots.triton_repo)

    marker = tmp_path / "killed-once"
    real_convert, real_package = STAGE_BODIES["convert"], STAGE_BODIES["package"]

    def convert(variant, stage, out):
        if variant.name == "retried" and not marker.exists():  # the first attempt dies half-way
            marker.write_text(str(os.getpid()))
            (out / "rank0.safetensors").write_bytes(b"half a file")
            os._exit(1)
        if variant.name == "lost":  # every attempt dies
            os._exit(1)
        real_convert(variant, stage, out)

    def package(variant, stage, out):
        if variant.name == "broken":
            raise StageError("the package stage of variant broken fails on purpose")
        real_package(variant, stage, out)

    bodies = STAGE_BODIES | {"convert": convert, "package": package}
    result = run_fleet(build_graph(plan), bodies=bodies, max_retries=1, roots=(roots.engines, roots.triton_repo))
    assert marker.exists()
    report = result.reports[str(plan.variants[0].stage("convert").output)]
    assert report.state == RAN and report.attempt_pid != int(marker.read_text())
    assert result.stage_states("retried") == {"convert": RAN, "build": RAN, "package": RAN}
    assert snapshot(roots.engines / "retried", roots.triton_repo / "retried") == expected
    assert not [p for p in (roots.engines / "retried").iterdir() if ".tmp-" in p.name]
    # The failing variant stops with its stage's exit code once the other one has finished.
    assert result.stage_states("broken")["package"] == FAILED
    assert "fails on purpose" in result.stopped("broken").message
    lost = result.stopped("lost")
    assert lost.state == FAILED and lost.exit_code == 1 and "worker was lost 2 time(s)" in lost.message
    assert result.stage_states("lost") == {"convert": FAILED, "build": BLOCKED, "package": BLOCKED}
    assert result.exit_code == 1


def test_engine_ray_cli_writes_a_manifest_and_reruns_as_a_no_op(cluster, cli, tiny, tmp_path):
    spec = tmp_path / "one.yaml"
    spec.write_text(f"name: one\nmodel: {{path: {tiny}, dtype: float32}}\n{LIMITS}target: reference\n")
    rc, out, err = cli("engine", str(spec), "--ray")
    assert rc == 0, err
    assert "summary" in out and "done: 1 of 1 variant(s) complete" in out
    manifest = tmp_path / "engines" / "one" / "manifest.json"
    data = json.loads(manifest.read_text())
    assert data["variants"]["one"]["outputs"]["build"]["state"] == RAN
    rc, out, err = cli("engine", str(spec), "--ray")
    assert rc == 0, err
    assert json.loads(manifest.read_text())["variants"]["one"]["outputs"]["convert"]["state"] == SKIPPED
    assert cli("verify", str(manifest))[0] == 0


def test_release_gates_and_method_best_on_ray(cluster, cli, tiny, tmp_path):
    # As without --ray: a failed gate stops only its variant (exit 6, one line naming it and the gate, after
    # the others); a method: best variant is evaluated first and then built as the method it chose.
    (tmp_path / "prompts.jsonl").write_text('{"input_ids": [5, 9, 14, 3]}\n{"input_ids": [7, 2, 11]}\n')
    evaluation = "evaluation: {prompts: prompts.jsonl, count: 2, max_new_tokens: 4, batch_sizes: [1]}"
    spec = tmp_path / "gates.yaml"
    spec.write_text(
        f"name: gates\nmodel: {{path: {tiny}, dtype: float32}}\n{LIMITS}target: reference\nvariants:\n"
        "  - name: built\n"
        f"  - name: gated\n    {evaluation}\n    release: {{min_acceptance_length: 50, on_fail: fail}}\n"
        f"  - name: chosen\n    speculative: {{method: best}}\n    {evaluation}\n"
        "    release: {min_acceptance_length: 50, on_fail: fallback}\n"
    )
    rc, out, err = cli("engine", str(spec), "--ray", "--junit-xml", str(tmp_path / "ray.xml"))
    assert rc == 6, out + err
    # The CI checks of the same run: the gated variant's failed gate, and its stages not run after it.
    from junitparser import Failure, JUnitXml, Skipped

    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(tmp_path / "ray.xml")) for c in suite}
    (failure,) = cases[("gates.gated.release", "release gate min_acceptance_length")].result
    assert isinstance(failure, Failure) and failure.message.startswith("min_acceptance_length 50.0: measured")
    assert isinstance(cases[("gates.gated.stages", "build")].result[0], Skipped)
    assert cases[("gates.built.stages", "build")].is_passed and cases[("gates.built.stages", "build")].time > 0
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: gated: release gate failed: lookahead(")
    assert "misses release gate min_acceptance_length 50.0: measured" in lines[0]
    variants = json.loads((tmp_path / "engines" / "gates" / "manifest.json").read_text())["variants"]
    states = {name: {s: o["state"] for s, o in v["outputs"].items()} for name, v in variants.items()}
    assert states["built"] == {"convert": RAN, "build": RAN, "package": RAN}
    assert states["gated"] == {"convert": RAN, "evaluate": "gate failed", "build": BLOCKED, "package": BLOCKED}
    assert variants["gated"]["evaluation"]["release_failed"] in lines[0]
    assert not (tmp_path / "engines" / "gated" / "engine").exists()
    # method: best with a gate no candidate passes falls back to plain decoding, and a plain engine is built.
    assert states["chosen"] == {"evaluate": RAN, "convert": RAN, "build": RAN, "package": RAN}
    assert "[chosen] method best: building none: best: measured choice plain: " in out
    assert variants["chosen"]["method"] == "none" and variants["chosen"]["evaluation"]["chosen"] == "plain"
    engine = json.loads((tmp_path / "engines" / "chosen" / "engine" / "config.json").read_text())
    assert engine["build_config"]["speculative_decoding_mode"] == 1  # TensorRT-LLM's SpeculativeDecodingMode.NONE
