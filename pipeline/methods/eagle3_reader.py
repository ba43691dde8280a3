"""An EAGLE-3 drafter folder, read strictly and without loading its weights.

The folder is the Hugging Face format NVIDIA ModelOpt exports (``EagleExporter`` in
modelopt/torch/export/plugins/hf_spec_export.py, template in hf_spec_configs.py, 0.47.0) and
TensorRT-LLM's PyTorch backend loads as ``speculative_config: {decoding_type: Eagle3,
speculative_model: <folder>}`` (tensorrt_llm/_torch/models/modeling_speculative.py @ 00679c66,
modeling_auto.py @ 01bffee1, speculative/eagle3.py). What the two agree on, and what is checked here:

* ``config.json``: ``architectures[0]`` that TensorRT-LLM maps to its ``EAGLE3LlamaForCausalLM``
  (it strips ``Eagle3`` and prefixes ``EAGLE3`` when the config has a ``draft_vocab_size`` key), the
  Llama fields of the drafter, ``draft_vocab_size`` and optionally ``target_hidden_size`` and
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (the target layers whose outputs the drafter fuses).
* ``model.safetensors``: ``fc`` [hidden, target_hidden x captured layers]; per drafter layer
  ``layers.N.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``, ``post_attention_layernorm``
  and ``hidden_norm``; the first layer also ``input_layernorm``, and its q/k/v take 2 x hidden inputs
  ([normed embedding; normed fused hidden], ModelOpt ``_expand_first_attn_in_dim`` and TensorRT-LLM
  ``Eagle3Attention``); ``norm``; ``d2t`` (integer [draft_vocab_size], target id = i + d2t[i]) when the
  draft vocabulary is smaller; ``lm_head`` [draft_vocab_size, hidden] (else the target's is used).
  TensorRT-LLM also reads the ``midlayer.*`` names of the EAGLE authors' checkpoints; so does this.

TensorRT-LLM's loader walks its own modules and takes what matches: a tensor it has no module for is
dropped without a word, and a module whose tensor is missing keeps uninitialised weights. So every
name here must be one the loader consumes, and every tensor it needs must be present.
Only headers are read (safetensors, never pickles), plus ``d2t``'s values, which are small.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.io.files import read_json, require_regular_file

# architectures[0] values TensorRT-LLM resolves to EAGLE3LlamaForCausalLM (modeling_auto.py: with a
# draft_vocab_size key, "EAGLE3" + arch.replace("Eagle3", "")). ModelOpt writes the first; the EAGLE
# authors' checkpoints the last. The MLA drafters (Eagle3DeepseekV2ForCausalLM) do not resolve.
ACCEPTED_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLM")
# EAGLE-1/2 drafters as ModelOpt (< 0.43), vLLM and SGLang name them.
EAGLE12_ARCHITECTURES = ("EagleForCausalLM", "EagleLlamaForCausalLM", "LlamaForCausalLMEagle", "EAGLEModel")
# TensorRT-LLM's Eagle3DecodingConfig.num_capture_layers when eagle3_layers_to_capture is not given.
DEFAULT_CAPTURE_COUNT = 3
_FLOAT_DTYPES = ("F32", "F16", "BF16")
_INT_DTYPES = ("I64", "I32", "I16", "I8", "U32", "U16", "U8")
_EAGLE12 = (
    "EAGLE-1/2 drafters do not load on TensorRT-LLM's PyTorch backend, which runs EAGLE-3 only; "
    "give an EAGLE-3 drafter (ModelOpt's export_speculative_decoding writes one) or use method eagle "
    "on the TensorRT engine flow"
)
_ADAPTER_FILE = "adapter_model.safetensors"  # ModelOpt's base-LoRA co-training export, not the drafter


@dataclass(frozen=True)
class Eagle3Layout:
    architecture: str
    num_layers: int  # decoder layers of the drafter
    hidden_size: int  # the drafter's
    target_hidden_size: int  # the base's hidden size, which fc reads
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    has_d2t: bool
    has_lm_head: bool  # False: TensorRT-LLM uses the target's lm_head
    has_embedding: bool  # its own embed_tokens (only used when target_hidden_size != hidden_size)
    capture_layers: tuple[int, ...]  # base layer indices (0-based outputs) the drafter fuses, sorted
    capture_from_config: bool  # False: TensorRT-LLM's default {1, L/2-1, L-4}
    fc_in_features: int
    weights: tuple[str, ...]  # safetensors file names
    base_adapter: bool  # adapter_model.safetensors: the base was LoRA-co-trained with the drafter


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]
    dtype: str
    file: Path


def default_capture_layers(num_layers: int) -> tuple[int, ...]:
    """TensorRT-LLM's (1, L//2-1, L-4) (speculative/eagle3.py); it refuses L <= 5."""
    return (1, num_layers // 2 - 1, num_layers - 4)


def read_eagle3(folder: Path, base: ModelGeometry) -> Eagle3Layout:
    """The drafter in ``folder`` for the target ``base``, or a one-line InputError naming the file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: EAGLE-3 drafter folder not found")
    config_file = folder / "config.json"
    require_regular_file(config_file, "EAGLE-3 drafter config")
    config = read_json(config_file, "EAGLE-3 drafter config")
    if not isinstance(config, dict):
        raise InputError(f"{config_file}: expected a JSON object (the drafter's Hugging Face config)")
    tensors, files = _read_tensors(folder)
    architecture = _architecture(config, config_file, tensors, folder)

    where = str(config_file)
    hidden = _int(config, "hidden_size", where)
    num_layers = _int(config, "num_hidden_layers", where)
    num_heads = _int(config, "num_attention_heads", where)
    num_kv_heads = _int(config, "num_key_value_heads", where, num_heads)
    head_dim = _int(config, "head_dim", where, hidden // num_heads)
    intermediate = _int(config, "intermediate_size", where)
    vocab = _int(config, "vocab_size", where)
    draft_vocab = _int(config, "draft_vocab_size", where, vocab)  # null: TensorRT-LLM takes vocab_size
    if vocab != base.vocab_size:
        raise InputError(
            f"{config_file}: vocab_size {vocab} is not the base model's {base.vocab_size}; "
            "this drafter was trained for another tokenizer"
        )
    if draft_vocab > vocab:
        raise InputError(f"{config_file}: draft_vocab_size {draft_vocab} is larger than vocab_size {vocab}")
    target_hidden = _int(config, "target_hidden_size", where, hidden)
    if target_hidden != base.hidden_size:
        field = "target_hidden_size" if "target_hidden_size" in config else "hidden_size"
        raise InputError(
            f"{config_file}: {field} {target_hidden} is not the base model's hidden_size {base.hidden_size}; "
            "this drafter was trained for another model"
        )
    eagle_config = _eagle_config(config, config_file, folder)
    next_layer_regular = eagle_config.get("next_layer_regular", True)
    if not isinstance(next_layer_regular, bool):
        raise InputError(f"{config_file}: eagle_config.next_layer_regular must be true or false")
    capture, from_config = _capture_layers(config, eagle_config, config_file, base)

    expected = _expected_shapes(
        config, num_layers, hidden, target_hidden, num_heads, num_kv_heads, head_dim, intermediate, len(capture)
    )
    optional = _optional_shapes(num_layers, hidden, vocab, draft_vocab, target_hidden, next_layer_regular)
    if draft_vocab != vocab:
        expected["d2t"] = (draft_vocab,)
        expected["lm_head.weight"] = (draft_vocab, hidden)  # the target's lm_head covers the full vocabulary
    _check_tensors(tensors, expected, optional, config, config_file, folder, num_layers, capture, from_config)
    if "lm_head.weight" in tensors and config.get("tie_word_embeddings") is True:
        raise InputError(
            f"{config_file}: tie_word_embeddings is true, so TensorRT-LLM skips loading the drafter's "
            "lm_head.weight and runs it uninitialised; set it to false (ModelOpt's export does)"
        )
    if draft_vocab != vocab:
        _check_d2t(tensors["d2t"], vocab)
    fc = tensors.get("fc.weight")
    return Eagle3Layout(
        architecture=architecture,
        num_layers=num_layers,
        hidden_size=hidden,
        target_hidden_size=target_hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        has_d2t="d2t" in tensors,
        has_lm_head="lm_head.weight" in tensors,
        has_embedding="embed_tokens.weight" in tensors,
        capture_layers=capture,
        capture_from_config=from_config,
        fc_in_features=fc.shape[1] if fc else target_hidden,
        weights=tuple(file.name for file in files),
        base_adapter=(folder / _ADAPTER_FILE).exists(),
    )


def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise InputError(f"{where}: missing field {key}; re-export the drafter (ModelOpt writes it)")
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputError(f"{where}: {key} must be a positive whole number, got {value!r}")
    return value


def _read_tensors(folder: Path) -> tuple[dict[str, _Tensor], list[Path]]:
    files = sorted(p for p in folder.glob("*.safetensors") if p.name != _ADAPTER_FILE)
    if not files:
        if (folder / "pytorch_model.bin").exists():
            raise InputError(
                f"{folder / 'pytorch_model.bin'}: pickled weights are not read; save the drafter as "
                "model.safetensors (ModelOpt's export does)"
            )
        raise InputError(
            f"{folder}: no model.safetensors; export the drafter with ModelOpt's export_speculative_decoding"
        )
    tensors: dict[str, _Tensor] = {}
    for file in files:
        require_regular_file(file, "safetensors file")
        try:
            with safe_open(str(file), framework="numpy") as handle:
                for raw in handle.keys():
                    part = handle.get_slice(raw)
                    name = _canonical(raw)
                    if name in tensors:
                        raise InputError(f"{file}: tensor '{raw}' is also in {tensors[name].file.name}; keep one copy")
                    tensors[name] = _Tensor(tuple(part.get_shape()), part.get_dtype(), file)
        except InputError:
            raise
        except Exception as exc:  # safetensors raises several unrelated types for bad files
            raise InputError(f"{file}: not a readable safetensors file ({exc}); re-download or re-export it") from None
    return tensors, files


def _canonical(name: str) -> str:
    """The EAGLE authors' ``midlayer.X`` / ``midlayer.N.X`` as ModelOpt's ``layers.0.X`` / ``layers.N.X``
    (TensorRT-LLM maps both onto its ``midlayer``)."""
    match = re.match(r"^midlayer\.(?:(\d+)\.)?(.*)$", name)
    if match is None:
        return name
    return f"layers.{match.group(1) or 0}.{match.group(2)}"


def _architecture(config: dict[str, Any], config_file: Path, tensors: dict[str, _Tensor], folder: Path) -> str:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise InputError(
            f"{config_file}: architectures must be a list naming the drafter class "
            f"(TensorRT-LLM takes {', '.join(ACCEPTED_ARCHITECTURES)})"
        )
    arch = archs[0]
    if arch in EAGLE12_ARCHITECTURES:
        raise InputError(f"{config_file}: architecture {arch} is an EAGLE-1/2 drafter; {_EAGLE12}")
    if arch not in ACCEPTED_ARCHITECTURES:
        raise InputError(
            f"{config_file}: architecture {arch} is not an EAGLE-3 drafter TensorRT-LLM loads "
            f"(it takes {', '.join(ACCEPTED_ARCHITECTURES)}, mapped to EAGLE3LlamaForCausalLM)"
        )
    first_q = tensors.get("layers.0.self_attn.q_proj.weight")
    hidden = config.get("hidden_size")
    eagle12 = "layers.0.hidden_norm.weight" not in tensors and (
        first_q is None or len(first_q.shape) != 2 or first_q.shape[1] == hidden
    )
    if eagle12 and "fc.weight" in tensors:
        raise InputError(
            f"{folder}: no layers.0.hidden_norm and the first layer's q_proj reads hidden_size inputs, "
            f"so this is an EAGLE-1/2 drafter; {_EAGLE12}"
        )
    if "draft_vocab_size" not in config:
        raise InputError(
            f"{config_file}: no draft_vocab_size; TensorRT-LLM recognises an EAGLE-3 drafter by that key "
            "(set it to the drafter's lm_head rows, or to vocab_size for a full vocabulary)"
        )
    return arch


def _eagle_config(config: dict[str, Any], config_file: Path, folder: Path) -> dict[str, Any]:
    eagle_config = config.get("eagle_config", {})
    if eagle_config is None:
        eagle_config = {}
    if not isinstance(eagle_config, dict):
        raise InputError(f"{config_file}: eagle_config must be an object, got {type(eagle_config).__name__}")
    if eagle_config.get("use_aux_hidden_state") is False:
        raise InputError(
            f"{config_file}: eagle_config.use_aux_hidden_state is false: the drafter reads no fused target "
            "layers, and TensorRT-LLM's Eagle3 drafter always does; train it with use_aux_hidden_state true"
        )
    unchecked = [key for key in ("eh_proj_before_attn", "norm_before_fc") if eagle_config.get(key)]
    unchecked += [key for key in ("fc_norm",) if config.get(key)]
    if unchecked:
        raise InputError(
            f"{config_file}: {', '.join(unchecked)} set; specdeploy checks only the ModelOpt EAGLE-3 layout "
            "(fc before the first layer, no extra norms), so it cannot vouch for this drafter"
        )
    if config.get("quantization_config") is not None or (folder / "hf_quant_config.json").exists():
        raise InputError(
            f"{config_file}: a quantized drafter; specdeploy reads unquantized EAGLE-3 drafters only — "
            "export it without quantization (keep '*eagle_module*' out of the quantization config)"
        )
    return eagle_config


def _capture_layers(
    config: dict[str, Any], eagle_config: dict[str, Any], config_file: Path, base: ModelGeometry
) -> tuple[tuple[int, ...], bool]:
    ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    field = "eagle_config.eagle_aux_hidden_state_layer_ids"
    if not ids and config.get("eagle_aux_hidden_state_layer_ids"):  # the vLLM speculators spelling
        ids, field = config["eagle_aux_hidden_state_layer_ids"], "eagle_aux_hidden_state_layer_ids"
    if not ids:
        if base.num_layers <= 5:
            raise InputError(
                f"{config_file}: no {field}, and TensorRT-LLM's default capture (layers 1, L/2-1, L-4) needs "
                f"more than 5 base layers ({base.name} has {base.num_layers}); list the layers the drafter was "
                "trained on"
            )
        return default_capture_layers(base.num_layers), False
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InputError(f"{config_file}: {field} must be a list of layer numbers, got {ids!r}")
    outside = [i for i in ids if not 0 <= i < base.num_layers]
    if outside:
        raise InputError(
            f"{config_file}: {field} {ids} names layer {outside[0]}, outside the base model's "
            f"0..{base.num_layers - 1}; this drafter was trained for another model"
        )
    if len(set(ids)) != len(ids):
        raise InputError(f"{config_file}: {field} {ids} repeats a layer; each captured layer counts once")
    return tuple(sorted(ids)), True


def _expected_shapes(
    config: dict[str, Any],
    num_layers: int,
    hidden: int,
    target_hidden: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate: int,
    captured: int,
) -> dict[str, tuple[int, ...]]:
    """Every tensor TensorRT-LLM's Eagle3 drafter loads, with its shape (HF [out, in])."""
    eagle_config = config.get("eagle_config") or {}
    regular_after_first = eagle_config.get("next_layer_regular", True)
    attention_bias = config.get("attention_bias") is True
    mlp_bias = config.get("mlp_bias") is True
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {"norm.weight": (hidden,)}
    if captured > 1:  # TensorRT-LLM builds fc only for more than one captured layer
        shapes["fc.weight"] = (hidden, target_hidden * captured)
        if config.get("bias") is True:
            shapes["fc.bias"] = (hidden,)
    for i in range(num_layers):
        regular = regular_after_first and i > 0
        width = hidden if regular else 2 * hidden  # the first layer reads [embedding; fused hidden]
        p = f"layers.{i}."
        for name, shape in (
            ("self_attn.q_proj", (q, width)),
            ("self_attn.k_proj", (kv, width)),
            ("self_attn.v_proj", (kv, width)),
            ("self_attn.o_proj", (hidden, q)),
        ):
            shapes[f"{p}{name}.weight"] = shape
            if attention_bias:
                shapes[f"{p}{name}.bias"] = (shape[0],)
        for name, shape in (
            ("mlp.gate_proj", (intermediate, hidden)),
            ("mlp.up_proj", (intermediate, hidden)),
            ("mlp.down_proj", (hidden, intermediate)),
        ):
            shapes[f"{p}{name}.weight"] = shape
            if mlp_bias:
                shapes[f"{p}{name}.bias"] = (shape[0],)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{p}hidden_norm.weight"] = (hidden,)
        if not regular:
            shapes[f"{p}input_layernorm.weight"] = (hidden,)
    if target_hidden != hidden:  # TensorRT-LLM then gives the drafter its own embedding
        shapes["embed_tokens.weight"] = (config["vocab_size"], hidden)
    return shapes


def _optional_shapes(
    num_layers: int, hidden: int, vocab: int, draft_vocab: int, target_hidden: int, next_layer_regular: bool
) -> dict[str, tuple[int, ...]]:
    """Tensors that may be there: used when present (lm_head) or known to be dropped harmlessly."""
    shapes: dict[str, tuple[int, ...]] = {"lm_head.weight": (draft_vocab, hidden), "t2d": (vocab,)}
    if target_hidden == hidden:
        shapes["embed_tokens.weight"] = (vocab, hidden)  # TensorRT-LLM shares the target's
    if next_layer_regular:
        for i in range(1, num_layers):  # ModelOpt writes it (HF LlamaDecoderLayer); TensorRT-LLM has none
            shapes[f"layers.{i}.input_layernorm.weight"] = (hidden,)
    return shapes


def _check_tensors(
    tensors: dict[str, _Tensor],
    expected: dict[str, tuple[int, ...]],
    optional: dict[str, tuple[int, ...]],
    config: dict[str, Any],
    config_file: Path,
    folder: Path,
    num_layers: int,
    capture: tuple[int, ...],
    from_config: bool,
) -> None:
    files = sorted({t.file for t in tensors.values()})
    weights = files[0] if len(files) == 1 else folder
    hidden = config["hidden_size"]
    target_hidden = config.get("target_hidden_size") or hidden
    fc = tensors.get("fc.weight")
    if fc is not None and len(fc.shape) == 2 and fc.shape[0] == hidden and "fc.weight" in expected:
        width = fc.shape[1]
        if width != expected["fc.weight"][1]:
            source = (
                f"config.json captures {len(capture)} layers {list(capture)}"
                if from_config
                else f"config.json lists no eagle_aux_hidden_state_layer_ids, so TensorRT-LLM captures its default "
                f"{DEFAULT_CAPTURE_COUNT} layers {list(capture)}"
            )
            per_layer = f"{width / target_hidden:g}"
            raise InputError(
                f"{fc.file}: tensor 'fc.weight' reads {width} features ({per_layer} x hidden {target_hidden}) but "
                f"{source}; set eagle_config.eagle_aux_hidden_state_layer_ids to the layers it was trained on"
            )
    if fc is not None and "fc.weight" not in expected:
        raise InputError(
            f"{fc.file}: tensor 'fc.weight' present but the drafter captures one layer {list(capture)}; "
            "TensorRT-LLM builds no fc for one captured layer and would drop it"
        )
    for name, shape in expected.items():
        tensor = tensors.get(name)
        if tensor is None:
            raise InputError(f"{weights}: tensor '{name}' missing, {_why_missing(name, config_file)}")
        _check_shape(name, tensor, shape)
    for name, tensor in tensors.items():
        if name in expected:
            continue
        if name in optional:
            _check_shape(name, tensor, optional[name])
            continue
        layer = re.match(r"^layers\.(\d+)\.", name)
        if layer and int(layer.group(1)) >= num_layers:
            raise InputError(
                f"{tensor.file}: tensor '{name}' belongs to layer {layer.group(1)}, but {config_file.name} says "
                f"num_hidden_layers {num_layers}; fix num_hidden_layers or re-export"
            )
        if name == "d2t":
            raise InputError(
                f"{tensor.file}: tensor 'd2t' present but draft_vocab_size equals vocab_size "
                f"({config['vocab_size']}); TensorRT-LLM then maps no ids and would drop it — set draft_vocab_size"
            )
        if name.endswith(("_scale", "_amax", ".scale")):
            raise InputError(
                f"{tensor.file}: tensor '{name}' is a quantization scale; specdeploy reads unquantized "
                "EAGLE-3 drafters only — export it without quantization"
            )
        raise InputError(
            f"{tensor.file}: tensor '{name}' is not part of an EAGLE-3 drafter TensorRT-LLM loads (its loader "
            "would drop it, running a different drafter than was trained); remove it or re-export with ModelOpt"
        )


def _why_missing(name: str, config_file: Path) -> str:
    if name == "lm_head.weight":
        return "and draft_vocab_size < vocab_size needs the drafter's own lm_head (the target's covers all ids)"
    if name == "d2t":
        return "and draft_vocab_size < vocab_size needs the draft-to-target id map; re-export with ModelOpt"
    if name == "embed_tokens.weight":
        return "and target_hidden_size != hidden_size needs the drafter's own embedding"
    if name.endswith(".bias"):
        return f"but {config_file.name} sets the bias flag for it; fix attention_bias/mlp_bias/bias or re-export"
    if name.endswith("hidden_norm.weight"):
        return "which TensorRT-LLM's Eagle3 layer needs (it would run uninitialised); re-export the drafter"
    return "which TensorRT-LLM's Eagle3 drafter loads (it would run uninitialised); re-export the drafter with ModelOpt"


def _check_shape(name: str, tensor: _Tensor, shape: tuple[int, ...]) -> None:
    if name in ("d2t", "t2d"):
        allowed = _INT_DTYPES + (("BOOL",) if name == "t2d" else ())
        if tensor.dtype not in allowed:
            raise InputError(f"{tensor.file}: tensor '{name}' is {tensor.dtype}, expected an integer id map")
    elif tensor.dtype not in _FLOAT_DTYPES:
        raise InputError(
            f"{tensor.file}: tensor '{name}' is {tensor.dtype}, expected {'/'.join(_FLOAT_DTYPES)}; "
            "a quantized drafter is not read — export it unquantized"
        )
    if tensor.shape != shape:
        why = " (the first layer reads [embedding; fused hidden], 2 x hidden)" if "layers.0.self_attn" in name else ""
        raise InputError(
            f"{tensor.file}: tensor '{name}' is {list(tensor.shape)}, expected {list(shape)} from config.json{why}"
        )


def _check_d2t(tensor: _Tensor, vocab: int) -> None:
    import numpy as np

    try:
        with safe_open(str(tensor.file), framework="numpy") as handle:
            name = next(k for k in handle.keys() if _canonical(k) == "d2t")
            offsets = np.asarray(handle.get_tensor(name)).astype(np.int64)
    except Exception as exc:
        raise InputError(f"{tensor.file}: tensor 'd2t' cannot be read ({exc}); re-export the drafter") from None
    targets = np.arange(offsets.shape[0], dtype=np.int64) + offsets
    bad = np.flatnonzero((targets < 0) | (targets >= vocab))
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{tensor.file}: tensor 'd2t' maps draft id {i} to target id {int(targets[i])}, outside the "
            f"vocabulary 0..{vocab - 1} ({bad.size} ids out of range); d2t holds offsets (target = id + d2t[id]) "
            "— recompute it (ModelOpt: scripts/calibrate_draft_vocab.py)"
        )
