"""Contract: every trtllm-build argv the build stage can emit uses only table flags and values,
and carries the plan's numbers unchanged (example specs + a property-based sweep)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trtllm_helpers import PRESET_8B, checkpoint_config

from pipeline.errors import InputError
from pipeline.trtllm.build_command import trtllm_build_argv, workers
from pipeline.trtllm.engine_config import check_engine_config, predict_engine_config
from pipeline.trtllm.flags import argv_problems, load_flags
from tests.conftest import engine_specs

CKPT, ENGINE = Path("/ckpt"), Path("/engine")


def argv_dict(argv: list[str]) -> dict[str, str | bool | list[str]]:
    """flag -> value (True for switches, a list for nargs="+" flags such as --lora_target_modules);
    argv_problems already proved the pairing is sound."""
    flags, result, index = load_flags(), {}, 1
    while index < len(argv):
        flag = flags[argv[index]]
        if flag.type == "store_true":
            result[argv[index]], index = True, index + 1
        elif flag.nargs == "+":
            end = index + 1
            while end < len(argv) and not argv[end].startswith("--"):
                end += 1
            result[argv[index]], index = argv[index + 1 : end], end
        else:
            result[argv[index]], index = argv[index + 1], index + 2
    return result


def assert_argv_follows_plan(variant, visible_gpus=None):
    argv = trtllm_build_argv(variant, CKPT, ENGINE, visible_gpus=visible_gpus)
    assert argv[0] == "trtllm-build" and argv_problems(argv) == []
    args, b = argv_dict(argv), variant.build
    assert args["--checkpoint_dir"] == str(CKPT) and args["--output_dir"] == str(ENGINE)
    assert int(args["--max_seq_len"]) == b.max_seq_len  # as requested: trtllm-build adds the draft itself
    assert int(args["--max_num_tokens"]) == b.max_num_tokens
    assert int(args["--max_batch_size"]) == b.max_batch_size and args["--max_beam_width"] == "1"
    assert args["--kv_cache_type"] == "paged" and args["--remove_input_padding"] == "enable"
    assert args["--gemm_plugin"] == b.gemm_plugin and args["--multiple_profiles"] == "enable"
    assert args["--use_fp8_context_fmha"] == ("enable" if b.use_fp8_context_fmha else "disable")
    assert args["--output_timing_cache"] == str(ENGINE / "model.cache")
    assert int(args["--workers"]) == workers(variant.world_size, visible_gpus) <= variant.world_size
    if b.lora is not None:  # a LoRA group's engine
        assert args["--lora_plugin"] == b.lora.plugin_dtype and int(args["--max_lora_rank"]) == b.lora.max_rank
        assert args["--lora_target_modules"] == list(b.lora.target_modules)
    if variant.method == "none":
        assert "--speculative_decoding_mode" not in args and "--max_draft_len" not in args
    else:
        assert args["--speculative_decoding_mode"] == b.speculative_decoding_mode
        assert int(args["--max_draft_len"]) == variant.speculative.max_draft_len == b.max_draft_len
    return args


@pytest.mark.parametrize("spec_file", engine_specs(), ids=lambda p: p.stem)
def test_example_specs_emit_only_table_flags(spec_file, plan_example):
    for variant in plan_example(spec_file):
        for visible in (None, 0, 1, 8):
            assert_argv_follows_plan(variant, visible)


def test_workers_are_capped_by_visible_gpus(plan_text):
    variant = plan_text(PRESET_8B + "parallel: {tp: 4, pp: 2}\n")[0]
    assert [workers(variant.world_size, v) for v in (None, 0, 3, 8, 16)] == [8, 1, 3, 8, 8]


def test_argv_is_a_list_of_strings_never_a_shell_line(plan_text, tmp_path):
    weird = tmp_path / "dir with spaces; rm -rf x"
    argv = trtllm_build_argv(plan_text(PRESET_8B)[0], weird, weird / "engine", visible_gpus=1)
    assert all(isinstance(arg, str) for arg in argv) and str(weird) in argv


def test_legal_extra_flags_pass_through_sorted(plan_text):
    flags = (
        "{use_fused_mlp: disable, --log_level: verbose, strip_plan: true, weight_streaming: false, "
        "max_prompt_embedding_table_size: 0}"
    )
    variant = plan_text(PRESET_8B + f"build:\n  extra_flags: {flags}\n")[0]
    argv = trtllm_build_argv(variant, CKPT, ENGINE, visible_gpus=1)
    assert argv[-7:] == [
        "--log_level",
        "verbose",
        "--max_prompt_embedding_table_size",
        "0",
        "--strip_plan",
        "--use_fused_mlp",
        "disable",
    ]
    args = argv_dict(argv)
    assert args["--use_fused_mlp"] == "disable" and args["--strip_plan"] is True
    assert "--weight_streaming" not in args  # false switches are left out


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            "{use_fused_mlp: fast}",
            "build.extra_flags.use_fused_mlp: 'fast' is not legal; allowed: one of enable, disable",
        ),
        ("{use_fused_mlp: on}", "use_fused_mlp: true is not legal (YAML reads on/off/yes/no as booleans)"),
        ("{tp_size: 2}", "build.extra_flags.tp_size: not a trtllm-build 1.2.1 flag"),
        ("{max_seq_len: 9000}", "build.extra_flags.max_seq_len: set by the plan (build.max_seq_len)"),
        ("{max_decoder_seq_len: 9000}", "build.extra_flags.max_decoder_seq_len: set by the plan"),
        ("{max_draft_len: 3}", "build.extra_flags.max_draft_len: set by the plan"),
        ("{workers: 8}", "build.extra_flags.workers: set by the plan"),
        ("{build_config: x.json}", "build.extra_flags.build_config: not allowed: a BuildConfig JSON replaces"),
        ("{dry_run: true}", "build.extra_flags.dry_run: not allowed: a dry run writes no engine"),
        ("{opt_num_tokens: 64}", "mutually exclusive with --multiple_profiles enable"),
        ("{paged_kv_cache: enable}", "deprecated"),
        ("{max_lora_rank: 1.5}", "build.extra_flags.max_lora_rank: 1.5 is not legal; allowed: a non-negative integer"),
        ("{strip_plan: 1}", "allowed: true or false"),
        ("{streamingllm: enable}", "StreamingLLM is asserted off"),
        ("{gather_context_logits: true}", "context logits with speculative decoding"),
        ("{low_latency_gemm_plugin: fp8}", "needs FP8 weights"),
        ("{reduce_fusion: enable}", "enable needs tp > 1"),
        ("{user_buffer: enable}", "needs build.extra_flags.reduce_fusion: enable"),
        ("{use_fused_mpl: enable}", "did you mean 'use_fused_mlp'?"),
        ("{use_fused_mlp: enable, --use_fused_mlp: disable}", "--use_fused_mlp is given twice"),
        ("{max_multimodal_len: 8, max_prompt_embedding_table_size: 8}", "given twice"),
    ],
)
def test_illegal_extra_flags_are_input_errors(plan_text, flags, message):
    variant = plan_text(PRESET_8B + f"build:\n  extra_flags: {flags}\n")[0]
    with pytest.raises(InputError) as info:
        trtllm_build_argv(variant, CKPT, ENGINE, visible_gpus=1)
    assert message in str(info.value) and "[variant p]" in str(info.value)


def test_variant_dependent_extra_flags_pass_where_they_apply(plan_text):
    text = PRESET_8B + (
        "quantization: {weights: fp8}\nparallel: {tp: 2}\nspeculative: {method: none}\nbuild:\n"
        "  extra_flags: {low_latency_gemm_plugin: fp8, reduce_fusion: enable, user_buffer: enable,"
        " gather_context_logits: true}\n"
    )
    args = argv_dict(trtllm_build_argv(plan_text(text)[0], CKPT, ENGINE, visible_gpus=2))
    assert args["--reduce_fusion"] == "enable" and args["--gather_context_logits"] is True


# --- property-based sweep over spec settings ------------------------------------------------------

SAFE_EXTRA = {
    "use_fused_mlp": st.sampled_from(["enable", "disable"]),
    "context_fmha": st.sampled_from(["enable"]),
    "paged_state": st.sampled_from(["enable", "disable"]),
    "log_level": st.sampled_from(["info", "verbose"]),
    "profiling_verbosity": st.sampled_from(["layer_names_only", "detailed", "none"]),
    "strip_plan": st.booleans(),
    "weight_streaming": st.booleans(),
    "enable_debug_output": st.booleans(),
    "max_prompt_embedding_table_size": st.integers(0, 4096),
    "logits_dtype": st.sampled_from(["float16", "float32"]),
    "lora_plugin": st.sampled_from(["auto", "disable", "float16"]),
    "max_lora_rank": st.integers(1, 256),
    "bert_attention_plugin": st.sampled_from(["auto", "disable"]),
    "moe_plugin": st.sampled_from(["auto", "disable"]),
}
MEDUSA_TREES = {"chain_3": 3, "chain_4": 4, "cpu_small_10_depth_3": 3, "mc_sim_7b_63": 4, "cpu_small_15": 5}


@st.composite
def spec_texts(draw) -> str:
    method = draw(st.sampled_from(["lookahead", "medusa", "eagle", "none"]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = 1 if method == "eagle" else draw(st.sampled_from([1, 2, 4]))
    fp8 = draw(st.booleans())
    kv = "fp8" if fp8 and draw(st.booleans()) else "auto"
    gpu = draw(st.sampled_from([None, "h100-sxm-80gb", "h200-141gb", "l40s", "b200-180gb"]))
    batch = draw(st.integers(1, 64))
    input_len = draw(st.integers(1, 2048))
    seq = input_len + draw(st.integers(1, 2048))
    lines = [
        PRESET_8B.rstrip(),
        f"parallel: {{tp: {tp}, pp: {pp}}}",
        f"quantization: {{weights: {'fp8' if fp8 else 'none'}, kv_cache: {kv}}}",
        f"build:\n  max_batch_size: {batch}\n  max_input_len: {input_len}\n  max_seq_len: {seq}\n"
        f"  max_num_tokens: {draw(st.integers(1, 16384))}",
    ]
    extra = draw(st.dictionaries(st.sampled_from(sorted(SAFE_EXTRA)), st.none(), max_size=4))
    if extra:
        values = {key: draw(SAFE_EXTRA[key]) for key in extra}
        rendered = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items())
        lines.append(f"  extra_flags: {{{rendered}}}")
    if gpu:
        lines.append(f"gpu: {{type: {gpu}, count: {tp * pp}}}")
    if method == "lookahead":
        ngram = draw(st.integers(1, 7))
        window, ver = (1, 0) if ngram == 1 else (draw(st.integers(1, 8)), draw(st.integers(0, 8)))
        lines.append(f"speculative:\n  lookahead: {{window: {window}, ngram: {ngram}, verification_set: {ver}}}")
    elif method == "medusa":
        tree = draw(st.sampled_from(sorted(MEDUSA_TREES)))
        heads = draw(st.integers(MEDUSA_TREES[tree], 6))
        lines.append(
            f"heads:\n  medusa: {{path: nowhere, num_heads: {heads}}}\nspeculative:\n  medusa: {{choices: {tree}}}"
        )
    elif method == "eagle":
        if draw(st.booleans()):
            top_k, layers = draw(st.integers(1, 8)), draw(st.integers(1, 4))
            body = f"{{dynamic_tree: true, dynamic_tree_max_top_k: {top_k}, num_eagle_layers: {layers}}}"
        else:
            tree = draw(st.sampled_from(["chain_3", "chain_4", "cpu_small_10_depth_3", "mc_sim_7b_63"]))
            body = f"{{choices: {tree}}}"
        lines.append(f"heads:\n  eagle: {{path: nowhere}}\nspeculative:\n  eagle: {body}")
    else:
        lines.append("speculative: {method: none}")
    return "\n".join(lines) + "\n"


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=spec_texts(), visible=st.one_of(st.none(), st.integers(0, 16)))
def test_sweep_argv_and_engine_config_follow_the_plan(plan_text, text, visible):
    try:
        variants = plan_text(text)
    except InputError as exc:  # a plan may refuse (e.g. memory); it must say where
        assert all(":" in line and "[variant p]" in line for line in str(exc).splitlines())
        return
    variant = variants[0]
    args = assert_argv_follows_plan(variant, visible)
    for key, value in variant.build.extra_flags.items():
        flag = load_flags()["--" + key]
        assert (args.get(flag.name) is True) if flag.type == "store_true" and value else True
    predicted = predict_engine_config(variant, checkpoint_config(variant), output_dir=ENGINE)
    assert check_engine_config(predicted, variant) == []
    b = predicted["build_config"]
    assert b["max_seq_len"] == variant.build.max_seq_len + (
        variant.build.max_draft_len + (variant.speculative.eagle.num_eagle_layers if variant.speculative.eagle else 0)
        if variant.method != "none"
        else 0
    )
    requested = variant.build
    expected_tokens = max(
        min(requested.max_num_tokens, requested.max_batch_size * requested.max_seq_len), requested.tokens_per_block
    )
    if variant.method != "none":
        expected_tokens = max(expected_tokens, requested.max_batch_size * (requested.max_draft_len + 1))
    assert b["max_num_tokens"] == expected_tokens
