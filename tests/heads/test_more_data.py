"""More training-only prompts, bf16 answer generation, validation-based epoch choice."""

from __future__ import annotations

import ast
import hashlib
import textwrap
from pathlib import Path

import torch

from pipeline.heads.data import SHARD_SPECS, SHARDS, TRAIN_SHARDS, DataSettings, build_split, cache_key
from pipeline.heads.medusa import MedusaTrainConfig, train_medusa
from pipeline.heads.prompts import PROMPTS_DIR, load_prompts
from pipeline.heads.train import split_validation
from tests.heads.conftest import tiny_llama_model

# The held-out sets must stay byte-identical (the shipped figures and bench/speculative.py use them).
EVAL_SHA256 = {
    "chat_eval.jsonl": "642eb2490b81cf116676fdbce9184e02c864c9fac031074eb1d740ea416eb99f",
    "code_eval.jsonl": "2cf498eab22302c18cbb1a6d47aa2d25d9f97316d0a7918039e487363d954607",
}


def test_held_out_files_unchanged():
    for name, digest in EVAL_SHA256.items():
        assert hashlib.sha256((PROMPTS_DIR / name).read_bytes()).hexdigest() == digest, name


def test_more_training_prompts_are_disjoint_from_everything_else():
    sets = {
        (kind, part): [r["prompt"] for r in load_prompts(kind, part)]
        for kind, part in (
            ("chat", "train"),
            ("chat", "eval"),
            ("chat", "train_extra"),
            ("chat", "train_more"),
            ("code", "train"),
            ("code", "eval"),
            ("code", "train_extra"),
        )
    }
    more_chat, more_code = sets[("chat", "train_more")], sets[("code", "train_extra")]
    assert len(more_chat) >= 500 and len(set(more_chat)) == len(more_chat)
    assert len(more_code) >= 500 and len(set(more_code)) == len(more_code)
    for key, prompts in sets.items():
        if key not in (("chat", "train_more"), ("code", "train_extra")):
            assert not set(prompts) & set(more_chat) and not set(prompts) & set(more_code), key
    for prompt in more_code:  # def line(s) + docstring of a function or (dedented) method
        tree = ast.parse(textwrap.dedent(prompt) + "    pass\n")
        assert isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef))


def test_new_shards_do_not_change_existing_keys(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    settings = DataSettings()
    assert set(TRAIN_SHARDS) <= set(SHARDS) and "eval" not in SHARD_SPECS
    # the key of a shard without a spec is the original formula (so cached shards are reused)
    digest = hashlib.sha256(f"v1|{settings}|train".encode())
    digest.update(b"{}")
    for kind, part in SHARDS["train"]:
        digest.update((PROMPTS_DIR / f"{kind}_{part}.jsonl").read_bytes())
    assert cache_key(base, settings, "train") == digest.hexdigest()[:16]


class _Tok:
    pad_token_id, eos_token_id, unk_token_id = 2, 2, 0

    def __call__(self, text, add_special_tokens=False):
        return type("E", (), {"input_ids": [3 + (ord(c) % 90) for c in text]})()

    def convert_tokens_to_ids(self, token):
        return 0

    def decode(self, ids):
        return " ".join(map(str, ids))


def test_bf16_generation_keeps_float32_weights_and_features():
    model = tiny_llama_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = build_split(
        model,
        _Tok(),
        [("code", {"prompt": "abcdef"}), ("code", {"prompt": "xyz"})],
        DataSettings(max_new_tokens=5, gen_batch=2, feature_batch=2),
        lambda _: None,
        gen_dtype="bfloat16",
    )
    for k, v in model.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, before[k]), k
    tokens, hidden, _ = data.seq(0)
    with torch.no_grad():
        want = model.model(tokens[None]).last_hidden_state[0]
    assert torch.allclose(hidden.float(), want, atol=2e-3)


def test_validation_split_and_best_epoch(data):
    fit, valid = split_validation(data, every=3)
    assert len(fit) + len(valid) == len(data) and len(valid) == len(data) // 3
    lm_head = tiny_llama_model().lm_head.weight.detach()
    snapshots = []

    def validate(model):  # scores fall every epoch: epoch 1 must be the one returned
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return 10.0 - len(snapshots)

    blocks, log = train_medusa(
        fit, lm_head, MedusaTrainConfig(epochs=3, batch_tokens=32, lr=1e-2), say=lambda _: None, validate=validate
    )
    assert [e["valid_score"] for e in log] == [9.0, 8.0, 7.0]
    for k, v in blocks.state_dict().items():
        assert torch.equal(v, snapshots[0][k]), k


def test_prompt_files_exist():
    for name in ("code_train_extra.jsonl", "chat_train_more.jsonl"):
        assert Path(PROMPTS_DIR / name).stat().st_size > 0
