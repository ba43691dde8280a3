"""Planning LoRA groups: serving.lora shared/merged/auto, the group's rank, modules, task ids and cache,
and the refusals (speculative modes TensorRT-LLM 1.2.1 does not combine with LoRA, adapters the
LoRA plugin cannot apply)."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import InputError
from pipeline.lora.group import task_id
from pipeline.lora.memory import adapter_bytes
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots
from pipeline.spec.document import load_spec
from tests.lora.helpers import make_adapter
from tests.runtime.fixtures import make_hf_model

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def tiny(module_tmp):
    from transformers import LlamaForCausalLM

    root = module_tmp("lora-plan")
    hf = make_hf_model(root / "hf")
    model = LlamaForCausalLM.from_pretrained(hf).eval()
    make_adapter(model, root / "qv4", 1, r=4, target_modules=["q_proj", "v_proj"])
    make_adapter(model, root / "mlp8", 2, r=8, target_modules=["gate_proj", "up_proj", "down_proj"])
    make_adapter(model, root / "pattern", 3, r=2, rank_pattern={"o_proj": 6}, target_modules=["o_proj", "k_proj"])
    make_adapter(model, root / "dora", 4, r=2, use_dora=True, target_modules=["q_proj"])
    make_adapter(model, root / "embed", 5, r=2, target_modules=["q_proj", "embed_tokens"])
    return root


def plan_of(write_spec, tmp_path, root, variants: str, build: str = ""):
    spec = write_spec(
        f"""
        name: fleet
        model: {{path: {root / "hf"}, dtype: float32}}
        build: {{max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256{build}}}
        target: reference
        variants:
          - name: base
        """
        + variants
    )
    return make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))


SHARED = """
          - name: qv
            model: {adapter: ADAPTERS/qv4}
            serving: {lora: shared}
          - name: mlp
            model: {adapter: ADAPTERS/mlp8}
            serving: {lora: shared}
          - name: pattern
            model: {adapter: ADAPTERS/pattern}
            serving: {lora: shared}
          - name: own
            model: {adapter: ADAPTERS/qv4}
            serving: {lora: merged}
"""


def test_shared_fine_tunes_form_one_group(tiny, write_spec, tmp_path):
    plan = plan_of(write_spec, tmp_path, tiny, SHARED.replace("ADAPTERS", str(tiny)))
    (group,) = plan.lora_groups
    assert group.name == "base-lora" and group.base_variant == "base"
    assert [(m.variant, m.task_id, m.rank) for m in group.members] == [
        ("qv", task_id("qv"), 4),
        ("mlp", task_id("mlp"), 8),
        ("pattern", task_id("pattern"), 6),  # rank_pattern raises o_proj's rank above r
    ]
    assert len({m.task_id for m in group.members}) == 3 and all(0 < m.task_id < 2**31 for m in group.members)
    assert group.max_lora_rank == 8
    # The union of the adapters' modules, in TensorRT-LLM's id order.
    assert group.target_modules == (
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_dense",
        "mlp_h_to_4h",
        "mlp_4h_to_h",
        "mlp_gate",
    )
    by_name = {v.name: v for v in plan.variants}
    # A shared fine-tune is served by the group's engine: its stages, then a package of its own.
    qv = by_name["qv"]
    assert [s.name for s in qv.stages] == ["convert", "build", "lora", "package"]
    assert qv.stage("build") == by_name["base"].stage("build") and qv.stage("package").params[
        "lora_task_id"
    ] == task_id("qv")
    assert qv.stage("package").output == tmp_path / "repo" / "qv"
    assert [s.name for s in by_name["own"].stages] == ["merge", "convert", "build", "package"]
    # A shared fine-tune decodes plainly (method auto resolves to none); a merged one keeps Lookahead.
    assert by_name["qv"].method == "none" and by_name["own"].method == "lookahead"
    arch = by_name["qv"].arch
    assert group.members[0].bytes_per_gpu == adapter_bytes(arch, 4, ["attn_q", "attn_v"], 4)
    assert group.cache.gpu_bytes == 3 * adapter_bytes(arch, 8, group.target_modules, 4)  # 3 adapters < batch 4
    assert group.cache.max_adapter_size == 8
    body = json.loads(plan.to_json())
    lora = {v["name"]: v["lora"] for v in body["variants"]}
    assert lora["qv"] == {"mode": "shared", "group": "base-lora", "lora_task_id": task_id("qv")}
    assert lora["own"] == {"mode": "merged"} and lora["base"] is None
    assert body["lora_groups"][0]["max_lora_rank"] == 8
    assert "3 fine-tune(s) on one engine" in group.describe()


def test_auto_on_the_reference_target_shares_a_fine_tune_without_heads(tiny, write_spec, tmp_path):
    # no GPU to weigh: a fine-tune that would decode with Lookahead joins the base's LoRA engine
    plan = plan_of(
        write_spec,
        tmp_path,
        tiny,
        f"""
          - name: qv
            model: {{adapter: {tiny / "qv4"}}}
""",
    )
    (group,) = plan.lora_groups
    assert [m.variant for m in group.members] == ["qv"]
    lora = json.loads(plan.to_json())["variants"][1]["lora"]
    assert lora["mode"] == "shared" and lora["decision"]["choice"] == "shared"
    assert "CPU reference target" in lora["decision"]["reason"]
    assert lora["decision"]["predicted_speedup"] is None  # not weighed: JSON null, never NaN
    assert any(note.startswith("serving.lora auto: shared") for note in plan.variants[1].notes)


@pytest.mark.parametrize("method", ["eagle", "medusa", "lookahead"])
def test_shared_refuses_speculative_modes(tiny, write_spec, tmp_path, method):
    with pytest.raises(InputError) as err:
        plan_of(
            write_spec,
            tmp_path,
            tiny,
            f"""
          - name: qv
            model: {{adapter: {tiny / "qv4"}}}
            serving: {{lora: shared}}
            speculative: {{method: {method}}}
""",
        )
    message = str(err.value)
    assert f"speculative.method: {method} with serving.lora shared" in message
    assert "engine flow has no test, example or document combining the LoRA plugin" in message
    assert "[variant qv]" in message


@pytest.mark.parametrize(
    ("adapter", "expected"),
    [
        ("dora", "DoRA (use_dora) cannot be applied by TensorRT-LLM's LoRA plugin"),
        ("embed", "target module(s) ['embed_tokens'] are not LoRA plugin modules"),
    ],
)
def test_shared_refuses_adapters_the_plugin_cannot_apply(tiny, write_spec, tmp_path, adapter, expected):
    with pytest.raises(InputError) as err:
        plan_of(
            write_spec,
            tmp_path,
            tiny,
            f"""
          - name: ft
            model: {{adapter: {tiny / adapter}}}
            serving: {{lora: shared}}
""",
        )
    message = str(err.value)
    assert "model.adapter: " in message and f"{tiny / adapter / 'adapter_config.json'}: {expected}" in message


def test_shared_refuses_rank_over_the_engines_maximum(tiny, write_spec, tmp_path):
    with pytest.raises(InputError, match=r"rank 8 is over the engine's max_lora_rank 4"):
        plan_of(
            write_spec,
            tmp_path,
            tiny,
            f"""
          - name: mlp
            model: {{adapter: {tiny / "mlp8"}}}
            serving: {{lora: shared}}
""",
            build=", extra_flags: {max_lora_rank: 4}",
        )


def test_shared_refuses_an_adapter_list(tiny, write_spec, tmp_path):
    with pytest.raises(InputError, match=r"serving\.lora: shared needs exactly one model\.adapter"):
        plan_of(
            write_spec,
            tmp_path,
            tiny,
            f"""
          - name: two
            model: {{adapter: [{tiny / "qv4"}, {tiny / "mlp8"}]}}
            serving: {{lora: shared}}
""",
        )


def test_group_engine_gets_the_lora_plugin_a_lora_stage_and_cache_parameters(tiny, write_spec, tmp_path):
    from pipeline.trtllm.build_command import trtllm_build_argv
    from pipeline.trtllm.engine_config import predict_engine_config
    from pipeline.trtllm.flags import argv_problems

    plan = plan_of(write_spec, tmp_path, tiny, SHARED.replace("ADAPTERS", str(tiny)))
    base = plan.variants[0]
    (group,) = plan.lora_groups
    assert [s.name for s in base.stages] == ["convert", "build", "lora", "package"]
    lora = base.stage("lora")
    assert lora.inputs == {"model": tiny / "hf"} | {str(m.task_id): m.adapter for m in group.members}
    assert base.stage("package").inputs["lora"] == lora.output
    assert base.stage("package").params["lora"] == {
        "lora_cache_optimal_adapter_size": str(group.cache.optimal_adapter_size),
        "lora_cache_max_adapter_size": "8",
        "lora_cache_host_memory_bytes": str(group.cache.host_bytes),
        # Where the deployment mounts the adapters, as gpt_model_path: never the build host's path.
        "lora_prefetch_dir": f"/models/engines/{lora.output.parent.name}/lora",
    }
    argv = trtllm_build_argv(base, tmp_path / "ckpt", tmp_path / "eng", visible_gpus=None)
    modules = list(group.target_modules)
    at = argv.index("--lora_plugin")
    assert argv[at : at + 5 + len(modules)] == [
        "--lora_plugin",
        "float32",
        "--max_lora_rank",
        "8",
        "--lora_target_modules",
        *modules,
    ]
    assert argv_problems(argv) == []
    config = predict_engine_config(base, {"architecture": "LlamaForCausalLM", "mapping": {}}, output_dir=tmp_path)
    assert config["build_config"]["plugin_config"]["lora_plugin"] == "float32"
    assert config["build_config"]["lora_config"]["max_lora_rank"] == 8
    assert config["build_config"]["lora_config"]["lora_target_modules"] == modules
    # The group's engine decodes plainly; its memory estimate carries the LoRA cache.
    assert base.method == "none"
    assert base.memory.total_gib == pytest.approx(group.engine_gib + group.cache.gpu_gib, abs=1e-6)


def test_shared_needs_a_base_variant_for_the_groups_engine(tiny, write_spec, tmp_path):
    with pytest.raises(
        InputError, match=r"serving\.lora: shared needs the group's engine: a variant without model\.adapter"
    ):
        plan_of(
            write_spec,
            tmp_path,
            tiny,
            f"""
          - name: qv
            model: {{adapter: {tiny / "qv4"}}}
            serving: {{lora: shared}}
            build: {{max_batch_size: 2}}
""",
        )


def test_the_manifest_records_how_each_fine_tune_is_served(tiny, write_spec, tmp_path):
    from pipeline.io.hashing import HashCache
    from pipeline.release.manifest import write_manifest

    plan = plan_of(write_spec, tmp_path, tiny, SHARED.replace("ADAPTERS", str(tiny)))
    path = write_manifest(plan, tmp_path / "engines", {v.name: {} for v in plan.variants}, HashCache(None))
    variants = json.loads(path.read_text())["variants"]
    assert variants["qv"]["lora"] == {"mode": "shared", "group": "base-lora", "lora_task_id": task_id("qv")}
    assert variants["own"]["lora"] == {"mode": "merged"} and variants["base"]["lora"] is None


def test_shared_at_the_top_of_the_spec_leaves_the_base_alone(tiny, write_spec, tmp_path):
    spec = write_spec(f"""
        name: fleet
        model: {{path: {tiny / "hf"}, dtype: float32}}
        build: {{max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
        serving: {{lora: shared}}
        target: reference
        variants:
          - name: base
          - name: qv
            model: {{adapter: {tiny / "qv4"}}}
        """)
    plan = make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "repo", tmp_path / "cache"))
    (group,) = plan.lora_groups
    assert group.base_variant == "base" and [m.variant for m in group.members] == ["qv"]


def test_lora_stage_refuses_an_adapter_of_another_base_shape(tiny, write_spec, tmp_path):
    """The group's adapters get the merge's checks against the base: file and tensor named, nothing written."""
    from transformers import LlamaForCausalLM

    from pipeline.stages.lora import run

    other = LlamaForCausalLM.from_pretrained(
        make_hf_model(tmp_path / "wide", hidden_size=96, num_attention_heads=4)
    ).eval()
    make_adapter(other, tmp_path / "wide-adapter", 9, r=2, target_modules=["q_proj"])
    config = tmp_path / "wide-adapter" / "adapter_config.json"  # unnamed base: only the shapes can tell
    config.write_text(json.dumps(json.loads(config.read_text()) | {"base_model_name_or_path": None}))
    plan = plan_of(
        write_spec,
        tmp_path,
        tiny,
        f"""
          - name: wide
            model: {{adapter: {tmp_path / "wide-adapter"}}}
            serving: {{lora: shared}}
""",
    )
    base = plan.variants[0]
    with pytest.raises(
        InputError, match=r"adapter_model\.safetensors: tensor .*q_proj\.lora_A\.weight: the update has shape"
    ):
        run(base, base.stage("lora"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_ray_graph_builds_the_group_engine_once(tiny, write_spec, tmp_path):
    """engine --ray: the group engine's stages are one task each, owned by the base and every shared
    fine-tune; each fine-tune's own package waits for them."""
    from pipeline.fleet.graph import build_graph

    plan = plan_of(write_spec, tmp_path, tiny, SHARED.replace("ADAPTERS", str(tiny)))
    graph = build_graph(plan)
    build = graph.tasks[graph.cells[("base", "build")]]
    assert build.owners == ("base", "qv", "mlp", "pattern")
    assert graph.cells[("qv", "lora")] == graph.cells[("base", "lora")]
    assert graph.cells[("qv", "package")] != graph.cells[("base", "package")]
    assert graph.tasks[graph.cells[("qv", "package")]].deps == (graph.cells[("base", "lora")],)
