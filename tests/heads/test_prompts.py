"""Prompt sets: deterministic split, held-out prompts disjoint from training prompts."""

from __future__ import annotations

import ast
import platform

from pipeline.heads.prompts import CHAT_EXTRA_SOURCE, chat_records, code_records, load_prompts, split


def test_chat_split_matches_source():
    train, held = split(chat_records())
    assert load_prompts("chat", "train") == train
    assert load_prompts("chat", "eval") == held
    assert 20 <= len(held) <= 30 and len(train) >= 250
    assert load_prompts("chat", "train_extra") == chat_records(CHAT_EXTRA_SOURCE, prefix="chatx")


def test_extra_training_prompts_never_reach_the_held_out_set():
    held = {r["prompt"] for r in load_prompts("chat", "eval")}
    extra = {r["prompt"] for r in load_prompts("chat", "train_extra")}
    train = {r["prompt"] for r in load_prompts("chat", "train")}
    assert not extra & held and not extra & train and len(extra) >= 200


def test_sets_are_disjoint_and_sized():
    for kind in ("chat", "code"):
        train = {r["prompt"] for r in load_prompts(kind, "train")}
        held = {r["prompt"] for r in load_prompts(kind, "eval")}
        assert not train & held and 20 <= len(held) <= 30 and len(train) >= 200


def test_code_prompts_are_function_heads():
    records = load_prompts("code", "train") + load_prompts("code", "eval")
    for r in records:
        tree = ast.parse(r["prompt"] + "    pass\n")  # def line(s) + docstring, body left to the model
        assert isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)), r["source"]
    if records[0]["python"] == platform.python_version():  # stdlib text depends on the Python version
        train, held = split(code_records())
        assert load_prompts("code", "train") == train and load_prompts("code", "eval") == held
