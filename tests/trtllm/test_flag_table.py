"""The trtllm-build 1.2 flag table itself: complete, consistent, and used to judge argvs."""

from __future__ import annotations

import json

import pytest

from pipeline import methods
from pipeline.methods.base import SPECULATIVE_DECODING_MODES as SPECULATIVE_DECODING_MODE
from pipeline.trtllm.flags import TABLE_FILE, argv_problems, flag, load_flags, plan_owned, table_version

# Flags older TensorRT-LLM had and 1.x removed (tensorrt_llm/commands/build.py @ 65f1d153); emitting one
# fails the build.
REMOVED = (
    "--tp_size",
    "--pp_size",
    "--world_size",
    "--max_output_len",
    "--use_custom_all_reduce",
    "--multi_block_mode",
    "--enable_xqa",
    "--auto_parallel",
    "--gpus_per_node",
    "--cluster_key",
)


def test_table_loads_with_unique_names_and_legal_defaults():
    data = json.loads(TABLE_FILE.read_text())
    names = [entry["name"] for entry in data["flags"]]
    assert len(names) == len(set(names)) == 67 and table_version() == "1.2.1"
    for entry in {f.name: f for f in load_flags().values()}.values():
        assert entry.name.startswith("--") and entry.type in ("int", "str", "choice", "store_true")
        if entry.type == "choice":
            assert entry.choices and (entry.default is None or entry.default in entry.choices), entry.name
            assert set(entry.reject_values) <= set(entry.choices), entry.name
        if entry.type == "store_true":
            assert entry.default is False


def test_removed_flags_are_absent():
    assert not set(REMOVED) & set(load_flags())


def test_aliases_resolve_to_the_same_flag():
    assert flag("max_decoder_seq_len") is flag("--max_seq_len")
    assert flag("--max_multimodal_len").name == "--max_prompt_embedding_table_size"


def test_speculative_modes_match_the_plan_and_the_engine_enum():
    choices = set(flag("speculative_decoding_mode").choices)
    assert {d.build_mode for d in methods.definitions() if d.build_mode} <= choices
    assert set(SPECULATIVE_DECODING_MODE) - {None} == choices
    assert SPECULATIVE_DECODING_MODE == {
        None: 1,
        "draft_tokens_external": 2,
        "medusa": 4,
        "lookahead_decoding": 8,
        "explicit_draft_tokens": 16,
        "eagle": 32,
    }


def test_plan_owned_flags():
    assert set(plan_owned()) == {
        "--checkpoint_dir",
        "--output_dir",
        "--max_batch_size",
        "--max_input_len",
        "--max_seq_len",
        "--max_beam_width",
        "--max_num_tokens",
        "--kv_cache_type",
        "--output_timing_cache",
        "--workers",
        "--speculative_decoding_mode",
        "--max_draft_len",
        "--gpt_attention_plugin",
        "--gemm_plugin",
        "--remove_input_padding",
        "--tokens_per_block",
        "--use_paged_context_fmha",
        "--use_fp8_context_fmha",
        "--multiple_profiles",
    }


@pytest.mark.parametrize(
    "argv,problem",
    [
        (["trtllm-build", "--tp_size", "2"], "--tp_size: not a trtllm-build 1.2 flag"),
        (["trtllm-build", "--use_fused_mlp", "on"], "--use_fused_mlp on: must be one of enable, disable"),
        (["trtllm-build", "--max_batch_size", "-1"], "--max_batch_size -1: must be a non-negative integer"),
        (["trtllm-build", "--workers", "1", "--workers", "2"], "--workers: given twice"),
        (["trtllm-build", "--max_draft_len"], "--max_draft_len: missing its value"),
        (["trtllm-build", "--speculative_decoding_mode", "ngram"], "must be one of draft_tokens_external"),
    ],
)
def test_argv_problems_catch_what_trtllm_build_would_reject(argv, problem):
    assert any(problem in line for line in argv_problems(argv))


def test_argv_problems_accept_switches_and_values():
    assert argv_problems(["trtllm-build", "--strip_plan", "--max_seq_len", "4096", "--log_level", "verbose"]) == []
