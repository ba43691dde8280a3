"""The task graph of a plan (no Ray): order, shared work, what each task asks of a node, the
shared-storage probe."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.errors import InputError
from pipeline.fleet import storage
from pipeline.fleet.graph import GIB, PREPARE, build_graph
from pipeline.fleet.ray_runner import FleetResult, fits, infeasible_message
from pipeline.fleet.task import BLOCKED, FAILED, RAN, UNAVAILABLE, TaskReport
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, Plan
from pipeline.spec.document import load_spec

FLEET = """\
name: fleet
model: {builtin: smollm2-135m-instruct, dtype: float32}
speculative: {method: lookahead}
target: tensorrt
gpu: {type: l40s, count: 4}
variants:
  - name: a
  - name: b
    parallel: {tp: 3}
  - name: c
    parallel: {tp: 3}
    build: {workers: 1}
  - name: d
    target: reference
"""


@pytest.fixture
def plan(write_spec, tmp_path) -> Plan:
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache")
    return make_plan(load_spec(write_spec(FLEET)), roots)


def test_stages_of_a_variant_in_order_variants_independent_the_model_prepared_once(plan):
    graph = build_graph(plan)
    assert graph.columns == (PREPARE, "convert", "build", "package")
    prepare = {graph.cells[(v, PREPARE)] for v in "abcd"}
    assert len(prepare) == 1 and graph.tasks[prepare.pop()].owners == ("a", "b", "c", "d")
    for variant in "abcd":
        chain = graph.chain(variant)
        assert [t.kind for t in chain] == [PREPARE, "convert", "build", "package"]
        assert all(later.deps == (earlier.key,) for earlier, later in zip(chain, chain[1:]))
    assert len(graph.tasks) == 1 + 4 * 3
    assert build_graph(plan, only={"b"}).variants == ("b",)


def test_a_stage_only_a_later_variant_has_gets_its_column_in_plan_order(write_spec, tmp_path):
    text = FLEET.replace("    target: reference\n", "    target: reference\n    evaluation: {count: 2}\n")
    roots = OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache")
    graph = build_graph(make_plan(load_spec(write_spec(text)), roots))
    assert graph.columns == (PREPARE, "convert", "evaluate", "build", "package")
    assert [t.kind for t in graph.chain("d")] == [PREPARE, "convert", "evaluate", "build", "package"]


def test_each_task_asks_for_what_the_plan_computes(plan):
    graph = build_graph(plan)
    for variant in plan.variants:
        for stage in variant.stages:
            request = graph.tasks[str(stage.output)].request
            assert request.num_gpus == stage.resources.gpus
            assert request.memory_bytes == int(stage.resources.host_memory_gib * GIB)
            assert request.placement_strategy == ("STRICT_PACK" if stage.resources.gpus else None)
    builds = {v.name: graph.tasks[str(v.stage("build").output)].request for v in plan.variants}
    assert {name: r.num_gpus for name, r in builds.items()} == {"a": 1, "b": 3, "c": 1, "d": 0}
    assert builds["b"].bundle() == {"CPU": 1.0, "GPU": 3.0, "memory": float(builds["b"].memory_bytes)}
    c = next(v for v in plan.variants if v.name == "c")
    assert c.build.workers == 1 and c.stage("build").resources.host_memory_gib < builds["b"].memory_bytes / GIB


def test_build_workers_above_the_world_size_is_a_plan_error(write_spec, tmp_path):
    spec = write_spec("name: w\nmodel: {preset: llama-3.1-8b}\nparallel: {tp: 2}\nbuild: {workers: 3}\n")
    with pytest.raises(InputError, match=r"build.workers: 3 is more than the 2 rank\(s\)"):
        make_plan(load_spec(spec), OutputRoots(tmp_path / "e", tmp_path / "t", tmp_path / "c"))


def test_two_variants_writing_one_folder_differently_and_relative_paths_are_refused(plan):
    a, b = plan.variants[0], plan.variants[1]
    clash = dataclasses.replace(b, stages=(dataclasses.replace(b.stages[0], output=a.stages[0].output), *b.stages[1:]))
    with pytest.raises(InputError, match="both write .* with different settings"):
        build_graph(dataclasses.replace(plan, variants=(a, clash)))
    shared = dataclasses.replace(b, stages=(dataclasses.replace(a.stages[0]), *b.stages[1:]), name="b2")
    graph = build_graph(dataclasses.replace(plan, variants=(a, shared)))
    assert graph.tasks[str(a.stages[0].output)].owners == ("a", "b2")  # the same work: once
    relative = dataclasses.replace(
        a, stages=(dataclasses.replace(a.stages[0], output=a.stages[0].output.relative_to(a.stages[0].output.anchor)),)
    )
    with pytest.raises(InputError, match="is relative; Ray workers run in another folder"):
        build_graph(dataclasses.replace(plan, variants=(relative,)))


def test_a_request_no_node_can_hold_says_what_it_needs_and_what_the_nodes_have(plan):
    task = build_graph(plan).tasks[str(plan.variants[1].stage("build").output)]
    node = {"NodeManagerAddress": "10.0.0.7", "Resources": {"CPU": 8.0, "GPU": 2.0, "memory": 64 * GIB}}
    assert not fits(task.request, node["Resources"])
    assert fits(task.request, {"CPU": 1, "GPU": 3, "memory": task.request.memory_bytes})
    message = infeasible_message(task, [node])
    assert "needs 1 CPU, 3 GPU" in message and "10.0.0.7: 8 CPU, 2 GPU, 64.0 GiB RAM" in message


def test_exit_code_is_the_failed_stages_then_3_for_stages_that_cannot_run(plan):
    graph = build_graph(plan, only={"a", "b"})
    a, b = graph.chain("a"), graph.chain("b")

    def result(b_state: str, code: int) -> FleetResult:
        reports = {t.key: TaskReport(t.key, RAN) for t in a + b}
        reports[b[2].key] = TaskReport(b[2].key, b_state, code, "why")
        reports[b[3].key] = TaskReport(b[3].key, BLOCKED)
        return FleetResult(graph, reports)

    assert result(UNAVAILABLE, 3).exit_code == 3
    assert result(FAILED, 2).exit_code == 2 and result(FAILED, 2).stopped("b").message == "why"
    assert result(FAILED, 2).stopped("a") is None


def test_the_storage_probe_names_what_a_node_cannot_see(tmp_path):
    seen, unseen = tmp_path / "engines", tmp_path / "elsewhere"
    tokens = storage.write_tokens([seen])
    assert storage.probe(tokens, [str(seen)]) == []
    other = {str(unseen / next(iter(tokens)).rsplit("/", 1)[1]): "x"} | {path: "another content" for path in tokens}
    problems = storage.probe(other, [str(tmp_path / "model")])
    assert problems == [
        f"cannot see {unseen} (the file the driver wrote there is missing)",
        f"sees another {seen} than the driver (different content)",
        f"has no {tmp_path / 'model'} (an input the driver has)",
    ]
    error = storage.storage_error({"10.0.0.7": problems, "10.0.0.8": []})
    assert str(error).splitlines()[0] == f"node 10.0.0.7 {problems[0]}"
    assert "shared storage" in str(error) and storage.storage_error({"n": []}) is None
    storage.remove_tokens(tokens)
    assert not list(seen.iterdir())


def test_engine_ray_given_the_spec_as_its_address_says_so(cli, write_spec):
    spec = write_spec("name: x\nmodel: {preset: llama-3.1-8b}\n")
    rc, out, err = cli("engine", "--ray", str(spec))
    assert rc == 2 and f"--ray took {spec} as the Ray cluster's address" in err
