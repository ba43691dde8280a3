"""FP8 PTQ of the real SmolLM2-135M-Instruct, checked against the unquantized model.

W8A8 FP8 on this 135M model is numerically chaotic (measured: FP8 vs fp32 top-1 agree at ~89% of
positions): positions 0-4
sit next to a massive-activation attention sink (down_proj input amax ~3000 in layers 11
and 28 vs ~10 elsewhere) and their low-confidence predictions flip easily. So the check
is statistical: overall top-1 agreement and mean KL over all positions of chat and plain
prompts, agreement where the reference is confident, and the greedy answer to a question.
The FP8 checkpoint is simulated in plain torch from the exported tensors (transformers
would silently load the FP8 codes as bf16 values).
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

CHAT = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "List three primary colors.",
    "Explain how a bicycle works.",
    "Give me a recipe for pancakes.",
    "How do I sort a list in Python?",
]
PLAIN = [
    "The history of the printing press begins in the fifteenth century, when",
    "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n",
    "Photosynthesis converts light energy into chemical energy. In plants, it happens",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The three laws of thermodynamics describe how energy behaves. The first law states that",
    "To make a cup of tea, first boil the water, then",
]


@pytest.fixture(scope="module")
def smollm2_fp8(smollm2_dir, module_tmp):
    from pipeline.quantize import quantize_fp8

    out = module_tmp("smollm2-fp8") / "out"
    summary = quantize_fp8(smollm2_dir, out, kv_cache_fp8=True, calib_path=None, calib_size=512, calib_max_len=256)
    return summary, out


def _simulated_fp8(src, out):
    """The unquantized model with FP8-dequantized weights and FP8 fake-quantized linear inputs."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    tensors = load_file(str(out / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    modules = dict(model.named_modules())

    def fake_quant(x, scale):
        return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype) * scale

    for key, value in tensors.items():
        if value.dtype == torch.float8_e4m3fn:
            name = key.removesuffix(".weight")
            module = modules[name]
            module.weight.data = value.float() * tensors[f"{name}.weight_scale"]
            scale = tensors[f"{name}.input_scale"]
            module.register_forward_pre_hook(lambda _m, args, s=scale: (fake_quant(args[0], s),))
    return model


def test_smollm2_fp8_export(smollm2_fp8, smollm2_dir):
    import torch
    from safetensors import safe_open

    summary, out = smollm2_fp8
    assert summary.num_quantized_linears == 30 * 7 and summary.calib_samples >= 60
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        dtypes = {k: handle.get_slice(k).get_dtype() for k in handle.keys()}
    assert sum(d == "F8_E4M3" for d in dtypes.values()) == 210
    assert sum(k.endswith((".k_scale", ".v_scale")) for k in dtypes) == 60
    assert dtypes["model.embed_tokens.weight"] == "BF16" and "lm_head.weight" not in dtypes  # tied
    assert {d for k, d in dtypes.items() if k.endswith("_scale")} == {"F32"}
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert config["tie_word_embeddings"] is True and config["dtype"] == "bfloat16"
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert (out / "chat_template.jinja").read_text() == (smollm2_dir / "chat_template.jinja").read_text()
    assert torch.float8_e4m3fn  # the simulation below needs float8 support in torch


def test_smollm2_fp8_logits_close_to_unquantized(smollm2_fp8, smollm2_dir):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    reference = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    fp8 = _simulated_fp8(smollm2_dir, smollm2_fp8[1])

    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in CHAT
    ] + PLAIN
    agree = total = confident_agree = confident = 0
    kls = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
            ref_logits, fp8_logits = reference(ids).logits[0], fp8(ids).logits[0]
            same = ref_logits.argmax(-1) == fp8_logits.argmax(-1)
            sure = ref_logits.softmax(-1).max(-1).values > 0.5
            agree += int(same.sum())
            total += same.numel()
            confident_agree += int(same[sure].sum())
            confident += int(sure.sum())
            kls += (
                F.kl_div(
                    F.log_softmax(fp8_logits, -1), F.log_softmax(ref_logits, -1), log_target=True, reduction="none"
                )
                .sum(-1)
                .tolist()
            )
    top1, mean_kl, sure_top1 = agree / total, sum(kls) / len(kls), confident_agree / confident
    print(
        f"FP8 vs fp32 over {total} positions: top-1 {top1:.3f}, mean KL {mean_kl:.4f}, "
        f"confident top-1 {sure_top1:.3f} ({confident} positions)"
    )
    assert top1 >= 0.80 and mean_kl <= 0.12 and sure_top1 >= 0.93

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": CHAT[0]}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = fp8.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
