"""Medusa and EAGLE-1 heads: converted head outputs equal a direct evaluation of the original weights."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from pipeline.checkpoint import EagleOptions, MedusaOptions, ReferenceModel
from pipeline.errors import InputError

TOL = 1e-4


def _ids(vocab: int, seq: int = 20, seed: int = 5) -> torch.Tensor:
    return torch.randint(0, vocab, (seq,), generator=torch.Generator().manual_seed(seed))


def medusa_weights(H: int, V: int, heads: int, layers: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for h in range(heads):
        for layer in range(layers):
            sd[f"{h}.{layer}.linear.weight"] = torch.randn(H, H, generator=g) * 0.2
            sd[f"{h}.{layer}.linear.bias"] = torch.randn(H, generator=g) * 0.2
        sd[f"{h}.{layers}.weight"] = torch.randn(V, H, generator=g) * 0.2
    return sd


def write_medusa_dir(folder: Path, sd: dict[str, torch.Tensor], fmt: str, config: dict | None) -> Path:
    folder.mkdir()
    if fmt == "pt":
        torch.save(sd, folder / "medusa_lm_head.pt")
    else:
        save_file(sd, str(folder / "medusa_lm_head.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def direct_medusa(
    sd: dict[str, torch.Tensor], hidden: torch.Tensor, heads: int, layers: int, prefix: str = ""
) -> torch.Tensor:
    out = []
    for h in range(heads):
        x = hidden
        for layer in range(layers):
            w, b = sd[f"{prefix}{h}.{layer}.linear.weight"], sd[f"{prefix}{h}.{layer}.linear.bias"]
            x = x + F.silu(x @ w.float().T + b.float())
        out.append(x @ sd[f"{prefix}{h}.{layers}.weight"].float().T)
    return torch.stack(out)


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_medusa_fasterdecoding_layout(tmp_path, tiny_llama, convert, fmt, tp):
    tiny = tiny_llama(vocab_size=101)  # 101 % tp != 0: head lm_heads are padded like the base lm_head
    sd = medusa_weights(64, 101, heads=4, layers=2)
    # The config lies about the head count (as FasterDecoding/medusa-vicuna-7b-v1.3 does): weights win.
    heads_dir = write_medusa_dir(tmp_path / "medusa", sd, fmt, {"medusa_num_heads": 2, "medusa_num_layers": 2})
    out, summary = convert(tiny.path, tp=tp, medusa=MedusaOptions(heads_dir, max_draft_len=31))
    assert summary.num_medusa_heads == 4 and summary.architecture == "MedusaForCausalLM"
    assert any("says 2 Medusa heads but the weights have 4" in w for w in summary.warnings)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_medusa_heads"], cfg["num_medusa_layers"], cfg["max_draft_len"]) == (4, 2, 31)
    model = ReferenceModel.load(out)
    ids = _ids(101)
    hidden, _ = model.hidden_states(ids)
    assert (hidden - tiny.hidden(ids[None])[0]).abs().max().item() < TOL
    assert (model.logits_from_hidden(hidden) - tiny.logits(ids[None])[0]).abs().max().item() < TOL
    got = model.medusa_logits(hidden)
    assert got.shape == (4, 20, 101)
    assert (got - direct_medusa(sd, hidden, 4, 2)).abs().max().item() < TOL


def test_medusa_on_every_pp_rank(tmp_path, tiny_llama, convert):
    from safetensors import safe_open

    tiny = tiny_llama()
    heads_dir = write_medusa_dir(
        tmp_path / "medusa",
        medusa_weights(64, 96, 2, 1),
        "safetensors",
        {"medusa_num_heads": 2, "medusa_num_layers": 1},
    )
    out, _ = convert(tiny.path, tp=2, pp=2, medusa=MedusaOptions(heads_dir))
    for r in range(4):
        with safe_open(str(out / f"rank{r}.safetensors"), "pt") as f:
            # TRT-LLM's MedusaForCausalLm declares the heads on every pp rank.
            assert f.get_tensor("medusa_heads.1.medusa_layers.0.linear.weight").shape == (32, 64)
            assert f.get_tensor("medusa_heads.1.lm_head.weight").shape == (48, 64)


def test_medusa_modelopt_combined_layout_synthetic(tiny_llama, convert):
    tiny = tiny_llama()
    sd = medusa_weights(64, 96, heads=3, layers=1, seed=4)
    weights = load_file(str(tiny.path / "model.safetensors"))
    weights.update({f"medusa_heads.{k}": v for k, v in sd.items()})
    save_file(weights, str(tiny.path / "model.safetensors"))
    cfg = json.loads((tiny.path / "config.json").read_text())
    cfg["medusa"] = {"num_medusa_heads": 5, "num_medusa_layers": 1}  # wrong on purpose
    (tiny.path / "config.json").write_text(json.dumps(cfg))
    out, summary = convert(tiny.path, tp=2, medusa=MedusaOptions(None, max_draft_len=7))
    assert summary.num_medusa_heads == 3
    assert any("says 5 Medusa heads" in w for w in summary.warnings)
    model = ReferenceModel.load(out)
    hidden, _ = model.hidden_states(_ids(96))
    assert (model.medusa_logits(hidden) - direct_medusa(sd, hidden, 3, 1)).abs().max().item() < TOL


def test_medusa_heads_in_base_need_medusa_options(tiny_llama, convert):
    tiny = tiny_llama()
    weights = load_file(str(tiny.path / "model.safetensors"))
    weights.update({f"medusa_heads.{k}": v for k, v in medusa_weights(64, 96, 1, 1).items()})
    save_file(weights, str(tiny.path / "model.safetensors"))
    with pytest.raises(InputError, match="medusa_heads.0.0.linear.bias: unexpected tensor.*pass medusa options"):
        convert(tiny.path)


@pytest.mark.slow
def test_medusa_modelopt_export_matches_modelopt_forward(tmp_path, convert, make_random_llama):
    """A real ModelOpt (mtsp) Medusa model exported with export_hf_checkpoint; reference = its own forward."""
    mtsp = pytest.importorskip("modelopt.torch.speculative")
    mte = pytest.importorskip("modelopt.torch.export")
    model = make_random_llama(seed=11)
    model = mtsp.convert(model, [("medusa", {"medusa_num_heads": 3, "medusa_num_layers": 1})])
    with torch.no_grad():
        for p in model.medusa_heads.parameters():
            p.normal_(0, 0.2)
    mte.export_hf_checkpoint(copy.deepcopy(model), dtype=torch.float32, export_dir=str(tmp_path / "med"))
    out, summary = convert(tmp_path / "med", tp=2, medusa=MedusaOptions(None))
    assert summary.num_medusa_heads == 3
    ref_model = ReferenceModel.load(out)
    ids = _ids(96)
    with torch.no_grad():
        expected = model(ids[None])
    hidden, _ = ref_model.hidden_states(ids)
    assert (ref_model.logits_from_hidden(hidden) - expected.logits[0]).abs().max().item() < TOL
    got = ref_model.medusa_logits(hidden)
    want = torch.stack([m[0] for m in expected.medusa_logits])
    assert (got - want).abs().max().item() < TOL


# -- EAGLE ----------------------------------------------------------------------------------------


def drafter_config(**overrides) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 30000.0,
        "hidden_act": "silu",
    }
    cfg.update(overrides)
    return cfg


def eagle_weights(cfg: dict, seed: int = 0, fc_bias: bool = True, embed: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    H, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def rnd(*shape: int, s: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * s

    sd = {"fc.weight": rnd(H, 2 * H)}
    if fc_bias:
        sd["fc.bias"] = rnd(H)
    if embed:
        sd["embed_tokens.weight"] = rnd(cfg["vocab_size"], H, s=0.5)
    for j in range(cfg["num_hidden_layers"]):
        p = f"layers.{j}."
        sd.update(
            {
                p + "self_attn.q_proj.weight": rnd(q, H),
                p + "self_attn.k_proj.weight": rnd(kv, H),
                p + "self_attn.v_proj.weight": rnd(kv, H),
                p + "self_attn.o_proj.weight": rnd(H, q),
                p + "mlp.gate_proj.weight": rnd(inter, H),
                p + "mlp.up_proj.weight": rnd(inter, H),
                p + "mlp.down_proj.weight": rnd(H, inter),
                p + "post_attention_layernorm.weight": 1 + rnd(H),
            }
        )
        if j > 0:
            sd[p + "input_layernorm.weight"] = 1 + rnd(H)
    return sd


def write_eagle_dir(folder: Path, cfg: dict, sd: dict[str, torch.Tensor], fmt: str) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    if fmt == "bin":
        torch.save(sd, folder / "pytorch_model.bin")
    else:
        save_file(sd, str(folder / "model.safetensors"))
    return folder


def direct_eagle(cfg: dict, sd: dict[str, torch.Tensor], base, ids: torch.Tensor, feats: torch.Tensor):
    """EAGLE-1 drafter from the original weights with transformers' own Llama layer and RoPE."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    lcfg = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    embed = sd.get("embed_tokens.weight", base.model.embed_tokens.weight.detach())
    x = torch.cat((embed[ids], feats), dim=-1)
    h = x @ sd["fc.weight"].T + sd.get("fc.bias", torch.zeros(cfg["hidden_size"]))
    T = ids.shape[0]
    pos = torch.arange(T)[None]
    pe = LlamaRotaryEmbedding(lcfg)(h[None], pos)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    h = h[None]
    for j in range(cfg["num_hidden_layers"]):
        layer = LlamaDecoderLayer(lcfg, j).eval()
        state = {k[len(f"layers.{j}.") :]: v for k, v in sd.items() if k.startswith(f"layers.{j}.")}
        if j == 0:
            layer.input_layernorm = torch.nn.Identity()  # EAGLE-1: no input norm on the first layer
        layer.load_state_dict(state, strict=True)
        with torch.no_grad():
            out = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=pe)
        h = out[0] if isinstance(out, tuple) else out
    # No final norm: the base lm_head reads the drafter output directly.
    return h[0] @ base.lm_head.weight.detach().T, h[0]


@pytest.mark.parametrize("fmt,tp,layers", [("bin", 1, 1), ("safetensors", 2, 2), ("bin", 4, 1)])
def test_eagle_drafter_matches_direct_evaluation(tmp_path, tiny_llama, convert, fmt, tp, layers):
    tiny = tiny_llama(vocab_size=101)
    cfg = drafter_config(vocab_size=101, num_hidden_layers=layers)
    sd = eagle_weights(cfg)
    eagle_dir = write_eagle_dir(tmp_path / "eagle", cfg, sd, fmt)
    out, summary = convert(
        tiny.path,
        tp=tp,
        eagle=EagleOptions(eagle_dir, num_eagle_layers=3, max_non_leaves_per_layer=5, max_draft_len=40),
    )
    assert summary.architecture == "EagleForCausalLM" and summary.num_eagle_layers == 3
    cfg_out = json.loads((out / "config.json").read_text())
    net = cfg_out["eagle_net_config"]
    assert (cfg_out["num_eagle_layers"], cfg_out["max_non_leaves_per_layer"], cfg_out["max_draft_len"]) == (3, 5, 40)
    assert net["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}
    assert net["num_hidden_layers"] == layers and net["rotary_base"] == 30000.0
    assert net["intermediate_size"] == 128 and net["architecture"] == "LlamaForCausalLM"
    assert "*eagle_nets*" not in (cfg_out["quantization"]["exclude_modules"] or [])  # unquantized base
    model = ReferenceModel.load(out)
    ids = _ids(101)
    feats, _ = model.hidden_states(ids)  # EAGLE-1 features: the base model's final-normed hidden states
    want_logits, want_hidden = direct_eagle(cfg, sd, tiny.model, ids, feats)
    for net_index in (0, 2):  # every eagle_nets.{i} is a copy of the same drafter
        logits, hidden, _ = model.eagle_forward(ids, feats, net=net_index)
        assert (hidden - want_hidden).abs().max().item() < TOL
        assert (logits - want_logits).abs().max().item() < TOL


def test_eagle_missing_fc_bias_and_embedding_are_synthesized(tmp_path, tiny_llama, convert):
    tiny = tiny_llama()
    cfg = drafter_config()
    sd = eagle_weights(cfg, seed=2, fc_bias=False, embed=False)
    eagle_dir = write_eagle_dir(tmp_path / "eagle", cfg, sd, "safetensors")
    out, summary = convert(tiny.path, tp=2, eagle=EagleOptions(eagle_dir, num_eagle_layers=1))
    assert any("fc.bias missing; writing zeros" in w for w in summary.warnings)
    assert any("uses the base model's embedding" in w for w in summary.warnings)
    model = ReferenceModel.load(out)
    ids = _ids(96)
    feats, _ = model.hidden_states(ids)
    want_logits, _ = direct_eagle(cfg, sd, tiny.model, ids, feats)
    logits, _, _ = model.eagle_forward(ids, feats)
    assert (logits - want_logits).abs().max().item() < TOL


def test_eagle_layer_count_from_weights(tmp_path, tiny_llama, convert):
    tiny = tiny_llama()
    cfg = drafter_config(num_hidden_layers=2)
    sd = eagle_weights(cfg)
    cfg["num_hidden_layers"] = 1  # the config lies
    eagle_dir = write_eagle_dir(tmp_path / "eagle", cfg, sd, "safetensors")
    out, summary = convert(tiny.path, eagle=EagleOptions(eagle_dir, num_eagle_layers=1))
    assert any("says 1 drafter layers but the weights have 2" in w for w in summary.warnings)
    assert json.loads((out / "config.json").read_text())["eagle_net_config"]["num_hidden_layers"] == 2


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_the_plans_heads_fields_are_what_the_converter_writes(tmp_path, tiny_llama, convert, kind):
    """The convert stage's options come from the plan's config (heads_options) and the engine config check
    expects the config's checkpoint_fields(): the converter writes exactly those."""
    from pipeline.checkpoint.heads import heads_options
    from pipeline.methods.eagle import EagleConfig
    from pipeline.methods.medusa import MedusaConfig
    from pipeline.plan.speculative import SpeculativeConfig
    from pipeline.trees import CHAIN_3

    tiny = tiny_llama()
    if kind == "medusa":
        heads_dir = write_medusa_dir(tmp_path / "heads", medusa_weights(64, 96, 3, 1), "safetensors", None)
        config = MedusaConfig(3, 1, CHAIN_3, 31)
        fields = {"num_medusa_heads": 3, "max_draft_len": 31}
    else:
        cfg = drafter_config(vocab_size=96, num_hidden_layers=1)
        heads_dir = write_eagle_dir(tmp_path / "heads", cfg, eagle_weights(cfg), "safetensors")
        config = EagleConfig(CHAIN_3, 2, 5, 40, False, 10)
        fields = {"num_eagle_layers": 2, "max_draft_len": 40, "max_non_leaves_per_layer": 5}
    planned = SpeculativeConfig.of(kind, f"method: {kind} set in the spec", config)
    medusa, eagle = heads_options(planned, heads_dir)
    assert (medusa is None, eagle is None) == (kind != "medusa", kind != "eagle")
    out, _ = convert(tiny.path, medusa=medusa, eagle=eagle)
    written = json.loads((out / "config.json").read_text())
    assert config.checkpoint_fields() == fields
    assert {key: written[key] for key in fields} == fields
