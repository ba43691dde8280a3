"""The reference engine against transformers on the original HF model (fp32, token for token)."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.errors import InputError
from pipeline.runtime.model.engine import Engine, Logits, StepInput
from tests.runtime.fixtures import PROMPTS, engine_greedy, write_engine


def hf_greedy(hf_model, prompt: list[int], n: int) -> list[int]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(hf_model).eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_greedy_matches_transformers(tmp_path, hf_model, tp, pp):
    engine = Engine.load(write_engine(hf_model, tmp_path / "engine", tp=tp, pp=pp))
    assert engine.geo.kv_heads == 2 // tp  # GQA: 4 query heads over 2 KV heads
    for prompt in PROMPTS[:2]:
        assert engine_greedy(engine, prompt, 24) == hf_greedy(hf_model, prompt, 24)


def test_prefill_logits_match_transformers(engine, hf_model):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(hf_model).eval()
    prompt = PROMPTS[2]
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits[0]
    got = engine.forward([StepInput(engine.new_cache(32), prompt, Logits.ALL)])[0].logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_all_hidden_returns_every_hidden_state_and_only_the_asked_logits(engine):
    prompt = PROMPTS[2]
    full = engine.forward([StepInput(engine.new_cache(32), prompt, Logits.ALL)])[0]
    for rows, want in ((Logits.LAST, full.logits[-1:]), (Logits.NONE, full.logits[:0])):
        (got,) = engine.forward([StepInput(engine.new_cache(32), prompt, rows, all_hidden=True)])
        torch.testing.assert_close(got.hidden, full.hidden)
        torch.testing.assert_close(got.logits, want)


def test_batched_step_equals_each_alone(engine):
    """Different past lengths in one forward: prompts of 6, 1, 13, 3 tokens, then 5 decode steps."""
    alone = [engine_greedy(engine, p, 6) for p in PROMPTS]
    caches = [engine.new_cache(32) for _ in PROMPTS]
    rows = engine.forward([StepInput(c, p) for c, p in zip(caches, PROMPTS)])
    tokens = [[int(r.logits[-1].argmax())] for r in rows]
    for _ in range(5):
        rows = engine.forward([StepInput(c, [t[-1]]) for c, t in zip(caches, tokens)])
        for t, r in zip(tokens, rows):
            t.append(int(r.logits[-1].argmax()))
    assert tokens == alone
    assert [c.length for c in caches] == [len(p) + 5 for p in PROMPTS]


def test_chunked_prefill_equals_whole_prompt(engine):
    prompt = PROMPTS[2]
    whole = engine.forward([StepInput(engine.new_cache(32), prompt)])[0].logits
    cache = engine.new_cache(32)
    assert engine.forward([StepInput(cache, prompt[:5], Logits.NONE)])[0].logits.shape[0] == 0
    chunked = engine.forward([StepInput(cache, prompt[5:])])[0].logits
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)


def test_cache_keep_compacts_accepted_slots(engine):
    """What tree verification relies on: keeping slots = having fed only those tokens."""
    prompt, extra = PROMPTS[0], [11, 12, 13]
    reference = engine.new_cache(32)
    engine.forward([StepInput(reference, prompt + [11, 13])])
    cache = engine.new_cache(32)
    engine.forward([StepInput(cache, prompt)])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # 11 -> {12, 13} tree
    engine.forward([StepInput(cache, extra, Logits.ALL, positions=[6, 7, 7], mask=mask)])
    cache.keep(len(prompt), [0, 2])
    assert cache.length == reference.length
    for layer in range(engine.config.model.num_layers):
        torch.testing.assert_close(
            cache.keys[0][layer][:, : cache.length],
            reference.keys[0][layer][:, : reference.length],
            atol=1e-5,
            rtol=1e-5,
        )
    after = engine.forward([StepInput(cache, [20])])[0].logits
    expected = engine.forward([StepInput(reference, [20])])[0].logits
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)


def test_engine_config_errors_are_one_line(tmp_path, engine_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(
        json.dumps({"pretrained_config": {"architecture": "GPT2LMHeadModel"}, "build_config": {}})
    )
    with pytest.raises(InputError, match="architecture 'GPT2LMHeadModel' is not supported"):
        Engine.load(broken)
    config = json.loads((engine_dir / "config.json").read_text())
    config["pretrained_config"]["mapping"] = {"world_size": 2, "tp_size": 2, "pp_size": 1}
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="missing rank0.safetensors, rank1.safetensors"):
        Engine.load(broken)
    with pytest.raises(InputError, match="engine folder not found"):
        Engine.load(tmp_path / "nope")


def _quantize_engine_to_fp8(src, dst):
    """Rewrite an fp32 engine as a per-tensor FP8 one (weights, activation and KV scales)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["pretrained_config"]["quantization"] = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    (dst / "config.json").write_text(json.dumps(config))
    for path in dst.glob("rank*.safetensors"):
        tensors = load_file(path)
        for name in [
            n for n in tensors if n.endswith(("qkv.weight", "dense.weight", "fc.weight", "gate.weight", "proj.weight"))
        ]:
            prefix, w = name[: -len(".weight")], tensors[name]
            scale = w.abs().max() / 448
            tensors[name] = (w / scale).to(torch.float8_e4m3fn)
            tensors[prefix + ".weights_scaling_factor"] = scale.reshape(1).float()
            tensors[prefix + ".activation_scaling_factor"] = torch.tensor([0.01])
        for name in [n for n in tensors if n.endswith("attention.qkv.weight")]:
            tensors[name.replace("qkv.weight", "kv_cache_scaling_factor")] = torch.tensor([0.02])
        save_file(tensors, path)
    return dst


@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_engine_matches_the_reference_forward(tmp_path, hf_model, tp):
    """FP8 weights dequantized at load, activations and K/V fake-quantized: incremental, batched
    decoding gives the full-sequence reference forward's logits."""
    from pipeline.checkpoint.reference_forward import ReferenceModel

    fp8 = _quantize_engine_to_fp8(write_engine(hf_model, tmp_path / "fp32", tp=tp), tmp_path / "fp8")
    engine = Engine.load(fp8)
    assert engine.config.quant.fp8 and engine.stage(0)[0].layers[0].qkv.act_scale == pytest.approx(0.01)
    pretrained = json.loads((fp8 / "config.json").read_text())["pretrained_config"]
    reference = ReferenceModel(pretrained, engine.ranks)
    prompts = [PROMPTS[0], PROMPTS[2]]
    caches = [engine.new_cache(32) for _ in prompts]
    rows = engine.forward([StepInput(c, p) for c, p in zip(caches, prompts)])
    seqs = [p + [int(r.logits[-1].argmax())] for p, r in zip(prompts, rows)]
    for _ in range(4):
        rows = engine.forward([StepInput(c, [s[-1]]) for c, s in zip(caches, seqs)])
        for s, r in zip(seqs, rows):
            expected = reference.forward(torch.tensor(s))[-1]
            torch.testing.assert_close(r.logits[-1], expected, atol=1e-4, rtol=1e-4)
            s.append(int(r.logits[-1].argmax()))


def test_cache_counts_the_blocks_a_paged_cache_allocates():
    """kv_cache_alloc_new_blocks: one block per tokens_per_block tokens ever reserved, drafts included;
    truncating rejected drafts frees no block (TensorRT-LLM keeps them for the request's lifetime)."""
    import torch

    from pipeline.runtime.model.kv_cache import KVCache

    cache = KVCache([1], 1, 2, torch.float32, limit=64, tokens_per_block=4)
    cache.reserve(6)  # a 6-token prompt: 2 blocks
    assert cache.blocks == 2
    cache.advance(6)
    cache.reserve(1 + 3)  # one token + 3 drafts: 10 tokens, 3 blocks
    assert cache.blocks == 3
    cache.advance(4)
    cache.truncate(8)  # two drafts rejected
    cache.reserve(1)
    assert cache.blocks == 3
