"""Medusa: label shift, training, the shipped ResBlocks format and its deterministic expansion."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from safetensors import safe_open

from pipeline.checkpoint.heads import MedusaOptions, load_medusa
from pipeline.checkpoint.hf_reader import open_hf_checkpoint
from pipeline.heads.expand import compact_medusa_layout, ensure_expanded_medusa, expand_medusa, is_compact_medusa
from pipeline.heads.export import export_medusa, load_medusa_folder, sha256_file, verify_manifest
from pipeline.heads.medusa import IGNORE, MedusaResBlocks, MedusaTrainConfig, medusa_targets, train_medusa
from pipeline.methods import heads_reader
from tests.heads.conftest import HIDDEN, VOCAB, tiny_llama_model


def test_head_i_targets_token_t_plus_2_plus_i():
    tokens = torch.arange(100, 112)  # token value = 100 + position
    y = medusa_targets(tokens, start=5, num_heads=3)
    for t in range(12):
        for i in range(3):
            target = t + 2 + i
            expected = 100 + target if 5 <= target < 12 else IGNORE
            assert int(y[t, i]) == expected, (t, i)


def test_resblock_forward_convention():
    torch.manual_seed(0)
    blocks = MedusaResBlocks(HIDDEN, num_heads=2, num_layers=2)
    for p in blocks.parameters():
        torch.nn.init.normal_(p, std=0.1)
    h = torch.randn(7, HIDDEN)
    x = h
    for layer in range(2):
        lin = blocks.heads[1][layer].linear
        x = x + F.silu(x @ lin.weight.T + lin.bias)
    assert torch.allclose(blocks(h)[1], x, atol=1e-6)
    # zero-initialised ResBlock weight (FasterDecoding/ModelOpt): a fresh head only adds silu(bias)
    fresh = MedusaResBlocks(HIDDEN, 3)
    assert torch.allclose(fresh(h)[2], h + F.silu(fresh.heads[2][0].linear.bias), atol=1e-6)


def test_training_reduces_loss(data):
    lm_head = tiny_llama_model().lm_head.weight.detach()
    _, log = train_medusa(data, lm_head, MedusaTrainConfig(epochs=4, batch_tokens=32, lr=1e-2), say=lambda _: None)
    first, last = log[0]["loss_per_head"], log[-1]["loss_per_head"]
    assert all(b < a for a, b in zip(first, last)), log


def _export(folder, seed=0):
    torch.manual_seed(seed)
    blocks = MedusaResBlocks(HIDDEN, num_heads=3)
    for p in blocks.parameters():
        torch.nn.init.normal_(p, std=0.05)
    export_medusa(
        blocks, folder, hidden_size=HIDDEN, vocab_size=VOCAB, base_model="tiny", info={"seed": seed}, readme="tiny\n"
    )
    return blocks


def test_shipped_folder_and_expansion(tmp_path, tiny_base):
    shipped = tmp_path / "heads"
    blocks = _export(shipped)
    assert is_compact_medusa(shipped) and compact_medusa_layout(shipped) == (3, 1)
    assert verify_manifest(shipped) == []
    config = json.loads((shipped / "config.json").read_text())
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (3, 1)
    reloaded = load_medusa_folder(shipped)
    assert all(torch.equal(v, blocks.state_dict()[k]) for k, v in reloaded.state_dict().items())

    out = expand_medusa(shipped, tiny_base, tmp_path / "expanded")
    layout = heads_reader.inspect_medusa(out)
    assert (layout.format, layout.num_heads, layout.num_layers, layout.config_num_heads) == ("fasterdecoding", 3, 1, 3)
    embedding = tiny_llama_model().model.embed_tokens.weight.detach()
    with safe_open(str(out / "medusa_lm_head.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
        assert keys == {f"{h}.0.linear.{k}" for h in range(3) for k in ("weight", "bias")} | {
            f"{h}.1.weight" for h in range(3)
        }
        for h in range(3):
            assert torch.equal(handle.get_tensor(f"{h}.1.weight"), embedding)  # tied base lm_head
            assert torch.equal(handle.get_tensor(f"{h}.0.linear.weight"), blocks.heads[h][0].linear.weight)

    # the converter reads the expanded folder
    heads = load_medusa(MedusaOptions(out), open_hf_checkpoint(tiny_base))
    assert (heads.num_heads, heads.num_layers) == (3, 1) and not heads.warnings


def test_expansion_is_deterministic(tmp_path, tiny_base):
    shipped = tmp_path / "heads"
    _export(shipped)
    a = expand_medusa(shipped, tiny_base, tmp_path / "a")
    b = expand_medusa(shipped, tiny_base, tmp_path / "b")
    for name in ("medusa_lm_head.safetensors", "config.json"):
        assert sha256_file(a / name) == sha256_file(b / name)
    cached = ensure_expanded_medusa(shipped, tiny_base, tmp_path / "cache")
    assert ensure_expanded_medusa(shipped, tiny_base, tmp_path / "cache") == cached
    assert sha256_file(cached / "medusa_lm_head.safetensors") == sha256_file(a / "medusa_lm_head.safetensors")
    # a re-trained head lands in a new cache folder instead of reusing the stale one
    _export(shipped, seed=1)
    assert ensure_expanded_medusa(shipped, tiny_base, tmp_path / "cache") != cached


def test_tampered_shipped_folder_is_refused(tmp_path, tiny_base):
    import pytest

    from pipeline.errors import InputError

    shipped = tmp_path / "heads"
    _export(shipped)
    (shipped / "README.md").write_text("edited\n")
    with pytest.raises(InputError, match="manifest"):
        expand_medusa(shipped, tiny_base, tmp_path / "out")
