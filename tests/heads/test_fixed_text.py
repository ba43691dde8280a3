"""Teacher-forced fixed-text data and warm starts (pipeline.heads.fixed_text, pipeline.heads.refresh)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from pipeline.errors import InputError
from pipeline.heads.eagle import EagleDrafter, EagleTrainConfig, train_eagle
from pipeline.heads.fixed_text import fixed_text_data, read_texts, token_blocks
from pipeline.heads.medusa import MedusaResBlocks, MedusaTrainConfig, train_medusa
from pipeline.io.hashing import HashCache
from tests.heads.conftest import HIDDEN, TINY_DRAFTER
from tests.quantize.conftest import build_tiny_llama


class _Tokenizer:
    """Whitespace words -> their lengths (enough to count tokens)."""

    def __call__(self, text, add_special_tokens=False):
        return type("Encoded", (), {"input_ids": [len(w) for w in text.split()]})()


def test_blocks_have_the_block_size_and_respect_the_token_budget():
    texts = [" ".join(["ab"] * 50), " ".join(["c"] * 7), " ".join(["def"] * 30)]
    blocks = token_blocks(_Tokenizer(), texts, block=16, tokens=70)
    # the 2-token tail of the first text is under a quarter block and goes; the budget cuts the last block
    assert [len(b) for b in blocks] == [16, 16, 16, 7, 15]
    assert blocks[3] == [1] * 7 and blocks[4] == [3] * 15


def test_training_text_files(tmp_path):
    (tmp_path / "a.txt").write_text("first document\nstill first\n\nsecond\n\n\n")
    assert read_texts(tmp_path / "a.txt") == ["first document\nstill first", "second"]
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert read_texts(tmp_path / "b.jsonl") == ["one", "two"]
    (tmp_path / "c.jsonl").write_text('{"text": "one"}\n{"txt": 2}\n')
    with pytest.raises(InputError, match=r"c.jsonl:2: each line must be a JSON object"):
        read_texts(tmp_path / "c.jsonl")
    with pytest.raises(InputError, match="training text not found"):
        read_texts(tmp_path / "none.txt")


def test_features_are_one_teacher_forced_pass_of_the_target(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build_tiny_llama(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text(("write short code python def return print function class data model text " * 8) + "\n\nwhy sky")
    data, meta = fixed_text_data(model, tokenizer, text, tokens=100, block=32, batch=2, say=lambda _: None)
    assert meta["tokens"] == 96 and len(data) == 3  # "why sky" is shorter than a quarter block
    assert data.prompt_lens.tolist() == [0, 0, 0]  # every position trains
    tokens, hidden, _ = data.seq(1)
    with torch.no_grad():
        expected = model.model(tokens[None]).last_hidden_state[0]
    torch.testing.assert_close(hidden.float(), expected, atol=2e-3, rtol=2e-3)  # stored as float16


def test_warm_starts_begin_from_the_given_heads(data):
    lm_head = torch.randn(96, HIDDEN)
    torch.manual_seed(5)
    init = EagleDrafter(TINY_DRAFTER)
    cfg = EagleTrainConfig(epochs=1, batch_tokens=64, lr=1e-9, warmup_steps=1, vocab_top_k=None, bf16=False)
    embed = torch.randn(96, HIDDEN)
    warm, _ = train_eagle(data, embed, lm_head, TINY_DRAFTER, cfg, say=lambda _: None, init=init)
    cold, _ = train_eagle(data, embed, lm_head, TINY_DRAFTER, cfg, say=lambda _: None)
    torch.testing.assert_close(warm.fc.weight, init.fc.weight, atol=1e-6, rtol=0)
    assert not torch.allclose(cold.fc.weight, init.fc.weight)
    blocks = MedusaResBlocks(HIDDEN, 2)
    torch.nn.init.normal_(blocks.heads[0][0].linear.weight)
    medusa_cfg = MedusaTrainConfig(num_heads=2, epochs=1, lr=1e-9, vocab_top_k=None, bf16=False)
    trained, _ = train_medusa(data, lm_head, medusa_cfg, say=lambda _: None, init=blocks)
    torch.testing.assert_close(trained.heads[0][0].linear.weight, blocks.heads[0][0].linear.weight)


def test_training_data_is_cached_by_target_and_settings(tmp_path, monkeypatch):
    from pipeline.heads import refresh

    folder = build_tiny_llama(tmp_path / "tiny")
    text = tmp_path / "text.txt"
    text.write_text("write short code python def return print function class data model text " * 8)
    settings = refresh.RefreshSettings(method="eagle", init=None, data=str(text), tokens=64, block=32)
    cache = tmp_path / "cache"
    first, meta = refresh.training_data(folder, settings, say=lambda _: None, cache=cache)
    assert len(list(cache.glob("refresh-*.json"))) == 1 and not list(cache.glob(".*"))  # complete entries only
    assert refresh.data_key(folder, settings, HashCache(cache)) == refresh.data_key(folder, settings)

    def no_target(_):
        raise AssertionError("the target was loaded although the data was cached")

    monkeypatch.setattr(refresh, "load_base", no_target)
    again, meta_again = refresh.training_data(folder, settings, say=lambda _: None, cache=cache)
    assert meta_again == meta and torch.equal(again.hidden, first.hidden) and torch.equal(again.tokens, first.tokens)
    assert again.teacher_ids is not None and torch.equal(again.teacher_ids, first.teacher_ids)
    key = refresh.data_key(folder, settings)
    assert refresh.data_key(folder, refresh.RefreshSettings("medusa", None, data=str(text), tokens=64, block=32)) == key
    assert refresh.data_key(folder, refresh.RefreshSettings("eagle", None, data=str(text), tokens=96)) != key
    (folder / "specdeploy_merge.json").write_text('{"adapters": [{"path": "elsewhere"}]}')
    assert refresh.data_key(folder, settings) == key  # where a merge found its adapters shapes no weight
    text.write_text("other text " * 40)  # another source file: other data
    assert refresh.data_key(folder, settings) != key
    text.write_text("write short code python def return print function class data model text " * 8)
    config = folder / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"rms_norm_eps": 1e-3}))
    assert refresh.data_key(folder, settings) != key  # another target: other data


def test_data_cache_keeps_the_most_recently_used_entries(tmp_path):
    from pipeline.heads.refresh import prune_data_cache

    def entry(name: str, size: int, age: int) -> Path:
        (tmp_path / f"refresh-{name}.safetensors").write_bytes(b"x" * size)
        marker = tmp_path / f"refresh-{name}.json"
        marker.write_text("{}")
        os.utime(marker, (1_000_000 - age, 1_000_000 - age))
        return tmp_path / f"refresh-{name}"

    entry("old", 40, age=3)
    entry("mid", 40, age=2)
    entry("new", 40, age=1)
    (tmp_path / "eval-base.json").write_text("{}")  # not a refresh entry: never pruned
    said: list[str] = []
    prune_data_cache(tmp_path, keep=tmp_path / "refresh-new", say=said.append, max_bytes=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "eval-base.json",
        "refresh-mid.json",
        "refresh-mid.safetensors",
        "refresh-new.json",
        "refresh-new.safetensors",
    ]
    assert len(said) == 1 and "refresh-old.safetensors" in said[0]
    # The entry being used stays although it alone exceeds the limit; everything older goes.
    huge = entry("huge", 500, age=0)
    prune_data_cache(tmp_path, keep=huge, say=said.append, max_bytes=100)
    assert [p.name for p in tmp_path.glob("refresh-*.json")] == ["refresh-huge.json"]
