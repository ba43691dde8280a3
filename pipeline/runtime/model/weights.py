"""One rank file of a TensorRT-LLM checkpoint (``rank{r}.safetensors``) as float32 layer shards.

Read with the official ``safetensors`` library, independently of our writer. FP8 weights are
dequantized at load (``w.float() * weights_scaling_factor``) and keep their activation scale,
so every FP8 linear runs as the engine would (:class:`~pipeline.runtime.model.layers.Linear`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from pipeline.errors import InputError
from pipeline.runtime.model.gemm import Gemm
from pipeline.runtime.model.layers import FP8, LayerShard, Linear


@dataclass
class MedusaShard:
    layers: list[Linear | Gemm]  # rows of x + silu(W x + b), this rank's output slice
    lm_head: torch.Tensor


@dataclass
class EagleShard:
    embedding: torch.Tensor
    fc: Linear
    layers: dict[int, LayerShard]
    lm_head: torch.Tensor


@dataclass
class RankWeights:
    rank: int
    tp_rank: int
    pp_rank: int
    embedding: torch.Tensor | None = None
    layers: dict[int, LayerShard] = field(default_factory=dict)  # by global layer index
    ln_f: torch.Tensor | None = None
    lm_head: torch.Tensor | None = None
    medusa: list[MedusaShard] = field(default_factory=list)
    eagle: list[EagleShard] = field(default_factory=list)

    @classmethod
    def load(cls, ckpt_dir: Path, rank: int, config: dict[str, Any], device: str = "cpu") -> RankWeights:
        """``device``: where the tensors are read to ("cpu", or "cuda" to serve the engine on a GPU)."""
        m = config["mapping"]
        tp, pp = m["tp_size"], m["pp_size"]
        path = Path(ckpt_dir) / f"rank{rank}.safetensors"
        if not path.exists():
            raise InputError(f"{path}: missing rank file (mapping says world_size {tp * pp})")
        w = cls(rank, rank % tp, rank // tp)
        with safe_open(str(path), framework="pt", device=device) as f:
            names = set(f.keys())
            get = _Getter(f, names, path)
            if "transformer.vocab_embedding.weight" in names:
                w.embedding = get.f32("transformer.vocab_embedding.weight")
            first = _pp_first_layer(config["num_hidden_layers"], pp, w.pp_rank)
            local = 0
            while f"transformer.layers.{local}.post_layernorm.weight" in names:
                w.layers[first + local] = get.layer(f"transformer.layers.{local}")
                local += 1
            if "transformer.ln_f.weight" in names:
                w.ln_f = get.f32("transformer.ln_f.weight")
                w.lm_head = get.f32("lm_head.weight")
            for h in range(config.get("num_medusa_heads", 0)):
                p = f"medusa_heads.{h}"
                resblocks: list[Linear | Gemm] = [
                    get.linear(f"{p}.medusa_layers.{i}.linear", bias=True) for i in range(config["num_medusa_layers"])
                ]
                w.medusa.append(MedusaShard(resblocks, get.f32(f"{p}.lm_head.weight")))
            if "eagle_net_config" in config:
                n_layers = config["eagle_net_config"]["num_hidden_layers"]
                for i in range(config["num_eagle_layers"]):
                    p = f"eagle_nets.{i}"
                    layers = {j: get.layer(f"{p}.drafter.layers.{j}", input_norm=j > 0) for j in range(n_layers)}
                    w.eagle.append(
                        EagleShard(
                            get.f32(f"{p}.drafter.vocab_embedding.weight"),
                            get.linear(f"{p}.drafter.fc", bias=True),
                            layers,
                            get.f32(f"{p}.lm_head.weight"),
                        )
                    )
        return w


def _pp_first_layer(num_layers: int, pp: int, pp_rank: int) -> int:
    base, extra = divmod(num_layers, pp)
    return pp_rank * base + min(pp_rank, extra)


class _Getter:
    def __init__(self, f: Any, names: set[str], path: Path):
        self.f, self.names, self.path = f, names, path

    def raw(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise InputError(f"{self.path}: tensor {name} is missing")
        return self.f.get_tensor(name)

    def f32(self, name: str) -> torch.Tensor:
        return self.raw(name).float()

    def scalar(self, name: str) -> float | None:
        return float(self.raw(name).reshape(-1)[0]) if name in self.names else None

    def linear(self, prefix: str, bias: bool = False) -> Linear:
        w = self.raw(prefix + ".weight")
        act = None
        if w.dtype == FP8:
            w = w.float() * float(self.raw(prefix + ".weights_scaling_factor").reshape(-1)[0])
            act = self.scalar(prefix + ".activation_scaling_factor")
            if act is None:
                raise InputError(f"{self.path}: tensor {prefix}.activation_scaling_factor is missing")
        return Linear(w.float(), act, self.f32(prefix + ".bias") if bias else None)

    def layer(self, p: str, input_norm: bool = True) -> LayerShard:
        return LayerShard(
            input_layernorm=self.f32(f"{p}.input_layernorm.weight") if input_norm else None,
            qkv=self.linear(f"{p}.attention.qkv"),
            dense=self.linear(f"{p}.attention.dense"),
            post_layernorm=self.f32(f"{p}.post_layernorm.weight"),
            fc=self.linear(f"{p}.mlp.fc"),
            gate=self.linear(f"{p}.mlp.gate"),
            proj=self.linear(f"{p}.mlp.proj"),
            kv_cache_scale=self.scalar(f"{p}.attention.kv_cache_scaling_factor"),
        )
