"""EAGLE-1 drafter: the drafting math, training, and the exported layout."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from pipeline.checkpoint.heads import EagleOptions, load_eagle
from pipeline.checkpoint.hf_reader import open_hf_checkpoint
from pipeline.geometry import ModelGeometry
from pipeline.heads.eagle import EagleDrafter, EagleTrainConfig, attend, drafter_llama_config, eagle_loss, pad_batch
from pipeline.heads.export import export_eagle, load_eagle_folder, verify_manifest
from pipeline.methods import heads_reader
from tests.heads.conftest import HIDDEN, TINY_DRAFTER, VOCAB, tiny_llama_model


def random_drafter(seed: int = 0) -> EagleDrafter:
    torch.manual_seed(seed)
    drafter = EagleDrafter(TINY_DRAFTER).eval()
    with torch.no_grad():
        drafter.layers[0].post_attention_layernorm.weight.copy_(1 + 0.2 * torch.randn(HIDDEN))
        drafter.fc.bias.copy_(0.1 * torch.randn(HIDDEN))
    return drafter


def explicit_draft(drafter, embed, tokens, feats, anchor, depth):
    """Drafting as the runtime does it: prefix inputs (true features), then a chain of drafted nodes,
    each attending to everything before it (plain causal attention over prefix + path)."""
    layer = drafter.layers[0]
    xs = [drafter.inputs(embed[tokens[i + 1]], feats[i]) for i in range(anchor + 1)]
    positions = list(range(anchor + 1))
    outs = []

    def run():
        x = torch.stack(xs)[None]
        q, k, v = layer.self_attn.qkv(x, torch.tensor(positions))
        T = len(xs)
        allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        return layer.finish(x, attend(q, k, v, allowed))[0, -1]

    out = run()
    outs.append(out)
    for s in range(2, depth + 1):
        xs.append(drafter.inputs(embed[tokens[anchor + s]], out))
        positions.append(anchor + s - 1)
        out = run()
        outs.append(out)
    return outs


def test_unrolled_equals_explicit_drafting():
    drafter = random_drafter()
    embed = torch.randn(VOCAB, HIDDEN)
    T = 12
    tokens = torch.randint(0, VOCAB, (T,))
    feats = torch.randn(T, HIDDEN)
    with torch.no_grad():
        preds = drafter.unrolled(embed, tokens[None], feats[None], torch.ones(1, T, dtype=torch.bool), 4)
        for anchor in (0, 3, 7):
            for s, want in enumerate(explicit_draft(drafter, embed, tokens, feats, anchor, 4), start=1):
                assert torch.allclose(preds[s - 1][0, anchor], want, atol=1e-5), (anchor, s)


def test_step1_matches_transformers_llama_layer():
    """fc over concat[embedding; feature], then a transformers LlamaDecoderLayer without input norm."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    drafter = random_drafter(1)
    cfg = drafter_llama_config(TINY_DRAFTER, "float32")
    lcfg = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    layer = LlamaDecoderLayer(lcfg, 0).eval()
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict(
        {k[len("layers.0.") :]: v for k, v in drafter.state_dict().items() if k.startswith("layers.0.")}
    )
    embed = torch.randn(VOCAB, HIDDEN)
    T = 9
    tokens, feats = torch.randint(0, VOCAB, (T,)), torch.randn(T, HIDDEN)
    with torch.no_grad():
        ours = drafter.unrolled(embed, tokens[None], feats[None], torch.ones(1, T, dtype=torch.bool), 1)[0][0]
        x = drafter.fc(torch.cat([embed[tokens[1:]], feats[:-1]], -1))[None]
        pos = torch.arange(T - 1)[None]
        mask = torch.full((T - 1, T - 1), float("-inf")).triu(1)[None, None]
        out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=LlamaRotaryEmbedding(lcfg)(x, pos))
        ref = (out[0] if isinstance(out, tuple) else out)[0]
    assert torch.allclose(ours[: T - 1], ref, atol=1e-5)


@pytest.mark.parametrize("unroll", [1, 2])
def test_training_step_reduces_loss(data, unroll):
    torch.manual_seed(0)
    base = tiny_llama_model()
    embed = base.model.embed_tokens.weight.detach()
    drafter = EagleDrafter(TINY_DRAFTER)
    cfg = EagleTrainConfig(unroll=unroll, w_cls=0.1)
    batch = pad_batch(data, list(range(len(data))))
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss, _ = eagle_loss(drafter, embed, embed, batch, cfg, noise_amp=0.0, gen=None)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0] * 0.9, losses


def test_export_is_the_eagle1_layout(tmp_path, tiny_base):
    drafter = random_drafter()
    folder = tmp_path / "eagle"
    export_eagle(drafter, folder, info={"seed": 0}, readme="tiny\n")
    assert verify_manifest(folder) == []
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
        assert {handle.get_tensor(k).dtype for k in handle.keys()} == {torch.float16}
    q, kv, inter = 4 * 16, 2 * 16, 96
    assert shapes == {
        "fc.weight": (HIDDEN, 2 * HIDDEN),
        "fc.bias": (HIDDEN,),
        "layers.0.self_attn.q_proj.weight": (q, HIDDEN),
        "layers.0.self_attn.k_proj.weight": (kv, HIDDEN),
        "layers.0.self_attn.v_proj.weight": (kv, HIDDEN),
        "layers.0.self_attn.o_proj.weight": (HIDDEN, q),
        "layers.0.mlp.gate_proj.weight": (inter, HIDDEN),
        "layers.0.mlp.up_proj.weight": (inter, HIDDEN),
        "layers.0.mlp.down_proj.weight": (HIDDEN, inter),
        "layers.0.post_attention_layernorm.weight": (HIDDEN,),
    }
    config = json.loads((folder / "config.json").read_text())
    spec = ModelGeometry.from_hf(config, "config.json")
    assert (spec.num_layers, spec.rope_theta, spec.num_kv_heads) == (1, 10000.0, 2)
    layout = heads_reader.inspect_eagle(folder)
    assert (layout.num_layers, layout.has_fc_bias, layout.hidden_size) == (1, True, HIDDEN)
    drafter_in = load_eagle(EagleOptions(folder), open_hf_checkpoint(tiny_base))
    assert len(drafter_in.layers) == 1 and drafter_in.fc_bias is not None
    assert any("base model's embedding" in w for w in drafter_in.warnings)
    reloaded = load_eagle_folder(folder)
    for name, value in drafter.state_dict().items():
        assert torch.allclose(reloaded.state_dict()[name], value, atol=1e-3, rtol=1e-3)
