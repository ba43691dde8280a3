"""Speculative-decoding heads: Medusa (FasterDecoding or ModelOpt layout) and EAGLE-1 drafters.

The weights are the truth: head and layer counts come from the tensor names, and a config that
disagrees is reported as a warning (FasterDecoding's medusa-vicuna-7b-v1.3 says 2 heads, has 4).
Pickles are loaded only with ``torch.load(..., weights_only=True)``, which refuses any object
that is not plain tensors/containers instead of running its code.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipeline.checkpoint.hf_reader import FP8, HFCheckpoint
from pipeline.checkpoint.safetensors_io import SafetensorsFile, StateDictSource, TensorRef, TensorSource
from pipeline.checkpoint.sharding import Src
from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.io.files import read_json, require_regular_file

if TYPE_CHECKING:
    from pipeline.plan.speculative import SpeculativeConfig


@dataclass(frozen=True)
class MedusaOptions:
    """``dir`` None: the heads are inside the base checkpoint (ModelOpt ``medusa_heads.*``)."""

    dir: Path | None = None
    max_draft_len: int = 63


@dataclass(frozen=True)
class EagleOptions:
    dir: Path
    num_eagle_layers: int = 4
    max_non_leaves_per_layer: int = 10
    max_draft_len: int = 63


def heads_options(speculative: SpeculativeConfig, heads: Path) -> tuple[MedusaOptions | None, EagleOptions | None]:
    """The converter's options for the plan's Medusa heads or EAGLE drafter in ``heads`` (None: none planned)."""
    medusa, eagle = speculative.medusa, speculative.eagle
    return (
        MedusaOptions(dir=heads, max_draft_len=medusa.max_draft_len) if medusa is not None else None,
        EagleOptions(
            dir=heads,
            num_eagle_layers=eagle.num_eagle_layers,
            max_non_leaves_per_layer=eagle.max_non_leaves_per_layer,
            max_draft_len=eagle.max_draft_len,
        )
        if eagle is not None
        else None,
    )


@dataclass
class MedusaHeads:
    num_heads: int
    num_layers: int
    linear_weight: list[list[Src]]  # [head][layer], (H, H)
    linear_bias: list[list[Src]]  # [head][layer], (H,)
    lm_head: list[Src]  # [head], (V, H)
    consumed: set[str] = field(default_factory=set)  # base-checkpoint names used (combined layout)
    warnings: list[str] = field(default_factory=list)


@dataclass
class EagleDrafter:
    spec: ModelGeometry  # the drafter's own LlamaConfig (heads, intermediate size, rope)
    fc_weight: Src  # (H, 2H): concat[embedding; feature] -> H
    fc_bias: Src | None  # None: synthesized zeros (NVIDIA/TensorRT-LLM#2588)
    embedding: Src  # the drafter's embed_tokens, or the base embedding when absent
    layers: list[dict[str, Src]]  # HF-style names relative to ``layers.{j}.``
    warnings: list[str] = field(default_factory=list)


def load_pickle_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A flat name->tensor dict from a .pt/.bin file, never executing pickled code."""
    require_regular_file(path, "weights file")
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            # Legacy (non-zip) torch.save files cannot be memory-mapped; same safe loader otherwise.
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"{path}: refusing to unpickle: the file needs arbitrary code to load "
            f"({first[:160]}); convert it to safetensors"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise InputError(
            f"{path}: cannot load weights ({type(exc).__name__}: {str(exc)[:160]}); "
            "re-save it or convert it to safetensors"
        ) from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise InputError(f"{path}: expected a flat dict of tensor names to tensors; save the state_dict itself")
    return obj


def _open_weights(path: Path) -> TensorSource:
    if path.suffix == ".safetensors":
        return SafetensorsFile(path)
    return StateDictSource(str(path), load_pickle_state_dict(path))


def _expect_shape(ref: TensorRef, shape: tuple[int, ...], what: str) -> None:
    got = ref.meta.shape
    if got != shape:
        raise InputError(
            f"{ref.where}: shape {list(got)} does not match the base model ({what} expects "
            f"{list(shape)}); the heads were trained for a different base model"
        )


def _src(source_name: str, lookup: dict[str, TensorRef], scales: dict[str, float]) -> Src:
    ref = lookup[source_name]
    if ref.meta.dtype not in (torch.float32, torch.float16, torch.bfloat16, FP8):
        raise InputError(f"{ref.where} has dtype {ref.meta.dtype}; expected float weights")
    if ref.meta.dtype == FP8:
        if source_name not in scales:
            raise InputError(f"{ref.where} is float8 but has no weight_scale next to it")
        return Src(ref, scales[source_name])
    return Src(ref)


_MEDUSA_LINEAR = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
_MEDUSA_LM = re.compile(r"^(\d+)\.(\d+)\.weight$")
_MEDUSA_SCALE = re.compile(r"^(\d+)\.(\d+)\.(?:linear\.)?(weight_scale|input_scale)$")


@dataclass
class _MedusaInput:
    lookup: dict[str, TensorRef]  # names relative to the head prefix
    prefix: str  # "medusa_heads." inside a ModelOpt checkpoint, "" in a FasterDecoding file
    label: str
    claimed: tuple[object, object]  # (heads, layers) the config says
    cfg_where: str


def _medusa_input(opts: MedusaOptions, base: HFCheckpoint, warnings: list[str]) -> _MedusaInput:
    if opts.dir is None:
        prefix = "medusa_heads."
        lookup = {n[len(prefix) :]: r for n, r in base.tensors.items() if n.startswith(prefix)}
        if not lookup:
            raise InputError(
                f"{base.path}: no medusa_heads.* tensors; pass the Medusa head folder (FasterDecoding layout) instead"
            )
        medusa = base.config.get("medusa")
        combined: dict = medusa if isinstance(medusa, dict) else {}
        return _MedusaInput(
            lookup,
            prefix,
            f"{base.path} (medusa_heads.*)",
            (combined.get("num_medusa_heads"), combined.get("num_medusa_layers")),
            f"{base.path / 'config.json'} medusa",
        )
    folder = Path(opts.dir)
    if not folder.is_dir():
        raise InputError(f"{folder}: Medusa head folder does not exist")
    candidates = [folder / "medusa_lm_head.safetensors", folder / "medusa_lm_head.pt"]
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        raise InputError(f"{folder}: no medusa_lm_head.safetensors or medusa_lm_head.pt")
    source = _open_weights(path)
    cfg_path = folder / "config.json"
    cfg: dict = {}
    if cfg_path.exists():
        cfg = read_json(cfg_path, "Medusa head config")
        if not isinstance(cfg, dict):
            raise InputError(f"{cfg_path}: Medusa head config must be a JSON object")
    else:
        warnings.append(f"{cfg_path}: missing; head count taken from the weights")
    return _MedusaInput(
        {n: TensorRef(source, n) for n in source.names()},
        "",
        str(path),
        (cfg.get("medusa_num_heads"), cfg.get("medusa_num_layers")),
        str(cfg_path),
    )


def load_medusa(opts: MedusaOptions, base: HFCheckpoint) -> MedusaHeads:
    spec = base.spec
    warnings: list[str] = []
    if opts.max_draft_len <= 0:
        raise InputError(f"medusa max_draft_len must be positive, got {opts.max_draft_len}")
    inp = _medusa_input(opts, base, warnings)
    lookup, prefix, label = inp.lookup, inp.prefix, inp.label

    linear: dict[tuple[int, int, str], str] = {}
    lm: dict[tuple[int, int], str] = {}
    scales: dict[str, float] = {}
    for key, ref in lookup.items():
        if m := _MEDUSA_LINEAR.match(key):
            linear[(int(m[1]), int(m[2]), m[3])] = key
        elif m := _MEDUSA_SCALE.match(key):
            target = key.rsplit(".", 1)[0] + ".weight"
            if m[3] == "weight_scale":
                scales[target] = _scalar(ref)
            # input_scale only matters for FP8 heads; we write the heads unquantized.
        elif m := _MEDUSA_LM.match(key):
            lm[(int(m[1]), int(m[2]))] = key
        else:
            raise InputError(
                f"{label}: unexpected tensor {prefix}{key}; expected "
                "{h}.{l}.linear.weight|bias and {h}.{L}.weight (Medusa heads)"
            )
    heads = sorted({h for h, _, _ in linear} | {h for h, _ in lm})
    if not heads:
        raise InputError(f"{label}: no Medusa head tensors found")
    if heads != list(range(len(heads))):
        raise InputError(f"{label}: Medusa head indices {heads} are not 0..{len(heads) - 1}")
    num_heads = len(heads)
    layer_counts = {h: len({lyr for hh, lyr, _ in linear if hh == h}) for h in heads}
    num_layers = layer_counts[0]
    H, V = spec.hidden_size, spec.vocab_size
    lw: list[list[Src]] = []
    lb: list[list[Src]] = []
    lmh: list[Src] = []
    for h in heads:
        if layer_counts[h] != num_layers:
            raise InputError(f"{label}: head {h} has {layer_counts[h]} layers, head 0 has {num_layers}")
        lw.append([])
        lb.append([])
        for layer in range(num_layers):
            for kind in ("weight", "bias"):
                found = linear.get((h, layer, kind))
                if found is None:
                    raise InputError(f"{label}: tensor {prefix}{h}.{layer}.linear.{kind} is missing")
                _expect_shape(lookup[found], (H, H) if kind == "weight" else (H,), f"Medusa linear {kind}")
                (lw if kind == "weight" else lb)[-1].append(_src(found, lookup, scales))
        head = lm.get((h, num_layers))
        if head is None:
            raise InputError(f"{label}: tensor {prefix}{h}.{num_layers}.weight (head {h} LM layer) is missing")
        _expect_shape(lookup[head], (V, H), "Medusa lm_head")
        lmh.append(_src(head, lookup, scales))
    stray = set(lm) - {(h, num_layers) for h in heads}
    if stray:
        h, layer = sorted(stray)[0]
        raise InputError(
            f"{label}: unexpected tensor {prefix}{h}.{layer}.weight (LM layer index should be {num_layers})"
        )
    for what, claim, actual in (("heads", inp.claimed[0], num_heads), ("layers", inp.claimed[1], num_layers)):
        if claim is not None and claim != actual:
            warnings.append(
                f"{inp.cfg_where}: says {claim} Medusa {what} but the weights have {actual}; using the weights"
            )
    if any(s.scale is not None for row in lw for s in row) or any(s.scale is not None for s in lmh):
        warnings.append(
            f"{label}: FP8 Medusa heads are dequantized to the model dtype "
            "(TRT-LLM builds fail on FP8 heads, NVIDIA/TensorRT-LLM#2115)"
        )
    consumed = {prefix + k for k in lookup} if opts.dir is None else set()
    return MedusaHeads(num_heads, num_layers, lw, lb, lmh, consumed, warnings)


def _scalar(ref: TensorRef) -> float:
    t = ref.read().float().reshape(-1)
    if t.numel() != 1:
        raise InputError(f"{ref.where}: expected a per-tensor scale, got shape {list(ref.meta.shape)}")
    return float(t[0])


_EAGLE_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_EAGLE_LAYER_KEYS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
)


def load_eagle(opts: EagleOptions, base: HFCheckpoint) -> EagleDrafter:
    folder = Path(opts.dir)
    warnings: list[str] = []
    for name in ("num_eagle_layers", "max_non_leaves_per_layer", "max_draft_len"):
        if getattr(opts, name) <= 0:
            raise InputError(f"eagle {name} must be positive, got {getattr(opts, name)}")
    if opts.max_draft_len > 256:
        raise InputError(f"eagle max_draft_len {opts.max_draft_len} exceeds TRT-LLM's limit of 256")
    if not folder.is_dir():
        raise InputError(f"{folder}: EAGLE drafter folder does not exist")
    cfg_path = folder / "config.json"
    if not cfg_path.exists() and not cfg_path.is_symlink():
        raise InputError(f"{cfg_path}: missing (EAGLE drafter LlamaConfig)")
    cfg = read_json(cfg_path, "EAGLE drafter LlamaConfig")
    if not isinstance(cfg, dict):
        raise InputError(f"{cfg_path}: EAGLE drafter LlamaConfig must be a JSON object")
    spec = ModelGeometry.from_hf(cfg, str(cfg_path), name=cfg_path.parent.name, require_architecture=False)
    path = next(
        (
            p
            for p in (folder / "model.safetensors", folder / "pytorch_model.bin", folder / "pytorch_model.pt")
            if p.exists()
        ),
        None,
    )
    if path is None:
        raise InputError(f"{folder}: no model.safetensors or pytorch_model.bin (EAGLE drafter weights)")
    source = _open_weights(path)
    names = source.names()
    lookup = {n: TensorRef(source, n) for n in names}
    base_spec = base.spec
    H, V = base_spec.hidden_size, base_spec.vocab_size
    if spec.hidden_size != H:
        raise InputError(f"{cfg_path}: drafter hidden_size {spec.hidden_size} != base hidden_size {H}")
    if spec.vocab_size != V:
        raise InputError(f"{cfg_path}: drafter vocab_size {spec.vocab_size} != base vocab_size {V}")

    layer_ids = sorted({int(m[1]) for n in names if (m := _EAGLE_LAYER.match(n))})
    if not layer_ids:
        raise InputError(f"{path}: no layers.N.* tensors (not an EAGLE-1 drafter)")
    if layer_ids != list(range(len(layer_ids))):
        raise InputError(f"{path}: drafter layer indices {layer_ids} are not 0..{len(layer_ids) - 1}")
    if len(layer_ids) != spec.num_layers:
        warnings.append(
            f"{cfg_path}: says {spec.num_layers} drafter layers but the weights have "
            f"{len(layer_ids)}; using the weights"
        )
    spec = replace(spec, num_layers=len(layer_ids), vocab_size=V)

    q_out, kv_out = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes = {
        "self_attn.q_proj.weight": (q_out, H),
        "self_attn.k_proj.weight": (kv_out, H),
        "self_attn.v_proj.weight": (kv_out, H),
        "self_attn.o_proj.weight": (H, q_out),
        "mlp.gate_proj.weight": (spec.intermediate_size, H),
        "mlp.up_proj.weight": (spec.intermediate_size, H),
        "mlp.down_proj.weight": (H, spec.intermediate_size),
        "post_attention_layernorm.weight": (H,),
        "input_layernorm.weight": (H,),
    }
    used: set[str] = set()

    def take(name: str, shape: tuple[int, ...], what: str) -> Src:
        ref = lookup.get(name)
        if ref is None:
            raise InputError(f"{path}: tensor {name} is missing ({what})")
        _expect_shape(ref, shape, what)
        if ref.meta.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InputError(f"{ref.where} has dtype {ref.meta.dtype}; EAGLE drafters must be float weights")
        used.add(name)
        return Src(ref)

    fc_weight = take("fc.weight", (H, 2 * H), "EAGLE fc over concat[embedding; feature]")
    fc_bias = None
    if "fc.bias" in lookup:
        fc_bias = take("fc.bias", (H,), "EAGLE fc bias")
    else:
        warnings.append(
            f"{path}: fc.bias missing; writing zeros (TRT-LLM's EagleNet fc has a bias, NVIDIA/TensorRT-LLM#2588)"
        )
    if "embed_tokens.weight" in lookup:
        embedding = take("embed_tokens.weight", (V, H), "EAGLE embedding")
    else:
        embedding = Src(base.ref("model.embed_tokens.weight"))
        warnings.append(f"{path}: no embed_tokens.weight; the drafter uses the base model's embedding")
    layers: list[dict[str, Src]] = []
    for j in layer_ids:
        keys = list(_EAGLE_LAYER_KEYS) + (["input_layernorm.weight"] if j > 0 else [])
        layers.append({k: take(f"layers.{j}.{k}", shapes[k], f"EAGLE layer {j}") for k in keys})
    extra = sorted(set(names) - used)
    if extra:
        raise InputError(
            f"{path}: unexpected tensor {extra[0]}"
            f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}; an EAGLE-1 drafter has "
            "fc, embed_tokens and layers.N.{self_attn,mlp,post_attention_layernorm} "
            "(input_layernorm only for N>0)"
        )
    return EagleDrafter(spec, fc_weight, fc_bias, embedding, layers, warnings)
