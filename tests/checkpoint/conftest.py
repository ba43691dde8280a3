"""Fixtures for converter tests: tiny random Llama models saved as HF folders, and conversions."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from pipeline.checkpoint import CheckpointSummary, convert_checkpoint


def llama_config(**overrides: Any):
    from transformers import LlamaConfig

    cfg: dict[str, Any] = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        initializer_range=0.08,
        architectures=["LlamaForCausalLM"],
    )
    cfg.update(overrides)
    return LlamaConfig(**cfg)


def random_llama(seed: int = 0, **overrides: Any):
    """A random LlamaForCausalLM whose norms are not all ones (so a norm mix-up shows in logits)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return model


@dataclass
class Tiny:
    path: Path
    model: Any

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model(ids).logits

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model.model(ids).last_hidden_state


@pytest.fixture
def tiny_llama(tmp_path):
    """make(name, seed=0, save_kwargs=None, **config) -> Tiny: a saved random model and the model itself."""

    def make(name: str = "hf", seed: int = 0, save_kwargs: dict[str, Any] | None = None, **overrides: Any) -> Tiny:
        model = random_llama(seed, **overrides)
        path = tmp_path / name
        model.save_pretrained(path, **(save_kwargs or {}))
        return Tiny(path, model)

    return make


@pytest.fixture
def make_random_llama():
    """random_llama(seed=0, **config) without saving (for tests that transform the model first)."""
    return random_llama


@pytest.fixture
def convert(tmp_path):
    """run(src, tp=1, pp=1, dtype="float32", **kw) -> (out_dir, summary), into a fresh empty folder."""
    counter = [0]

    def run(
        src: Path, *, tp: int = 1, pp: int = 1, dtype: str = "float32", **kw: Any
    ) -> tuple[Path, CheckpointSummary]:
        counter[0] += 1
        out = tmp_path / f"trt{counter[0]}"
        out.mkdir()
        return out, convert_checkpoint(src, out, tp=tp, pp=pp, dtype=dtype, **kw)

    return run


@dataclass
class ModelOptFP8:
    """A tiny random model quantized with ModelOpt FP8 (weights, activations, KV) on CPU, and its exports."""

    base: Any  # the unquantized fp32 model (deep copy taken before quantization)
    base_dir: Path  # its HF save (fp32)
    quant: Any  # the fake-quant model
    hf_fp8_dir: Path  # export_hf_checkpoint(quant, dtype=bfloat16): the converter's input
    trt_fp8: dict[int, Path]  # ModelOpt's own export_tensorrt_llm_checkpoint(quant, bf16), by tp
    trt_base: dict[int, Path]  # the same for the unquantized model


def _modelopt_trt_export(mte: Any, model: Any, out: Path, tp: int) -> Path:
    model = copy.deepcopy(model)  # the exporter mutates the model (weights become float8)
    # transformers 5 keeps rope_theta only in rope_parameters; the exporter reads config.rope_theta
    # and would silently drop rotary_base (ModelOpt 0.47 export_tensorrt_llm_checkpoint without tensorrt_llm installed).
    model.config.rope_theta = model.config.rope_parameters["rope_theta"]
    mte.export_tensorrt_llm_checkpoint(model, "llama", torch.bfloat16, str(out), inference_tensor_parallel=tp)
    return out


@pytest.fixture(scope="session")
def modelopt_fp8(tmp_path_factory) -> ModelOptFP8:
    mtq = pytest.importorskip("modelopt.torch.quantization")
    mte = pytest.importorskip("modelopt.torch.export")
    root = tmp_path_factory.mktemp("modelopt")
    # heads/kv divisible by 2 so ModelOpt's own TRT-LLM export is valid at tp=2 (it does not check).
    model = random_llama(
        seed=3,
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        initializer_range=0.1,
    )
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # peakier next-token distributions make top-1 agreement meaningful
    base = copy.deepcopy(model)
    base.save_pretrained(root / "base")
    calib = torch.randint(0, 128, (8, 24), generator=torch.Generator().manual_seed(7))
    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    cfg["quant_cfg"] = list(cfg["quant_cfg"]) + list(mtq.FP8_KV_CFG["quant_cfg"])

    def loop(m: Any) -> None:
        with torch.no_grad():
            m(calib)

    quant = mtq.quantize(model, cfg, loop)
    mte.export_hf_checkpoint(copy.deepcopy(quant), dtype=torch.bfloat16, export_dir=str(root / "hf_fp8"))
    trt_fp8 = {tp: _modelopt_trt_export(mte, quant, root / f"trt_fp8_tp{tp}", tp) for tp in (1, 2)}
    trt_base = {tp: _modelopt_trt_export(mte, base, root / f"trt_base_tp{tp}", tp) for tp in (1, 2)}
    return ModelOptFP8(base, root / "base", quant, root / "hf_fp8", trt_fp8, trt_base)


def eagle_drafter_dir(tmp_path: Path, hidden: int = 64, vocab: int = 96, fc_shape=(64, 128)) -> Path:
    """An EAGLE-1 drafter folder (config.json + zero weights) of the tiny test shapes."""
    heads = tmp_path / "eagle"
    heads.mkdir()
    (heads / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": hidden,
                "intermediate_size": 96,
                "vocab_size": vocab,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
            }
        )
    )
    sd = {"fc.weight": torch.zeros(*fc_shape), "fc.bias": torch.zeros(64)}
    p = "layers.0."
    sd.update(
        {
            p + "self_attn.q_proj.weight": torch.zeros(64, 64),
            p + "self_attn.k_proj.weight": torch.zeros(32, 64),
            p + "self_attn.v_proj.weight": torch.zeros(32, 64),
            p + "self_attn.o_proj.weight": torch.zeros(64, 64),
            p + "mlp.gate_proj.weight": torch.zeros(96, 64),
            p + "mlp.up_proj.weight": torch.zeros(96, 64),
            p + "mlp.down_proj.weight": torch.zeros(64, 96),
            p + "post_attention_layernorm.weight": torch.ones(64),
        }
    )
    save_file(sd, str(heads / "model.safetensors"))
    return heads


def make_adapter(model, folder, seed: int = 1, **config):
    """A random LoRA adapter made by PEFT on a copy of ``model``; returns the PEFT model."""
    import peft

    config = {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj", "v_proj", "down_proj"],
        "init_lora_weights": False,
        **config,
    }
    torch.manual_seed(seed)
    peft_model = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(**config)).eval()
    with torch.no_grad():  # PEFT's own init leaves B small; make the update large enough to matter
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                param.normal_(0, 0.2)
            if "lora_magnitude_vector" in name:
                param.mul_(1.0 + 0.1 * torch.rand_like(param))
    peft_model.save_pretrained(folder)
    return peft_model
