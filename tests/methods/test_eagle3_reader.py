"""pipeline/methods/eagle3_reader.py: a real ModelOpt EAGLE-3 export reads, and each broken folder
is refused with one line naming the file and the tensor.

The literal folders mirror what ModelOpt 0.47's ``EagleExporter`` writes
(modelopt/torch/export/plugins/hf_spec_export.py: ``LLAMA_EAGLE_SINGLE_LAYER`` and
``_extract_state_dict``, which strips ``eagle_module.`` and copies the base ``lm_head`` in;
hf_spec_configs.py: ``llama_eagle_template_config``; speculative/plugins/modeling_eagle.py: ``fc`` is
[hidden, hidden x captured], the first layer's q/k/v read 2 x hidden, ``d2t`` is int64
[draft_vocab_size] when the draft vocabulary is smaller). The ModelOpt test checks that mirror.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.geometry import ModelGeometry
from pipeline.methods.eagle3_reader import read_eagle3
from tests.methods.eagle3_fixtures import (
    BASE,
    BASE8,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    INTER,
    KV_HEADS,
    VOCAB,
    config,
    tensors,
    write,
)


def refused(folder: Path, *needles: str, base: ModelGeometry = BASE) -> str:
    with pytest.raises(InputError) as info:
        read_eagle3(folder, base)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


# --- a real export -------------------------------------------------------------------------------


@pytest.mark.slow  # imports transformers and ModelOpt (~10 s)
def test_modelopt_export_reads(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    mtsp = pytest.importorskip("modelopt.torch.speculative")
    from modelopt.torch.export import export_speculative_decoding

    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=HIDDEN, num_hidden_layers=4, vocab_size=VOCAB, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128,
            tie_word_embeddings=False,
        )
    )  # fmt: skip
    cfg = copy.deepcopy(mtsp.EAGLE3_DEFAULT_CFG["config"])
    cfg["eagle_use_torch_compile"] = False  # a GPU optimisation; on CPU it only compiles
    cfg["eagle_export_rope_scaling"] = {}  # keep the training RoPE in the exported config
    cfg["eagle_architecture_config"].update(
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=INTER,
        draft_vocab_size=500,
    )  # fmt: skip
    mtsp.convert(base, [("eagle", cfg)])
    with torch.no_grad():  # what scripts/calibrate_draft_vocab.py would compute: offsets into the vocabulary
        base.eagle_module.d2t.copy_(torch.arange(500) % 7)
    export_speculative_decoding(base, export_dir=tmp_path / "drafter")

    layout = read_eagle3(tmp_path / "drafter", BASE)
    assert layout.architecture == "LlamaForCausalLMEagle3"
    assert (layout.num_layers, layout.hidden_size, layout.draft_vocab_size) == (1, HIDDEN, 500)
    assert layout.has_d2t and layout.has_lm_head and not layout.has_embedding
    # ModelOpt's default for 4 layers is {1, max(0, 4//2-1), max(0, 4-4)} = {0, 1}: fc reads 2 x hidden
    assert layout.capture_layers == (0, 1) and layout.capture_from_config
    assert layout.fc_in_features == 2 * HIDDEN
    assert (layout.num_heads, layout.num_kv_heads, layout.head_dim, layout.intermediate_size) == (4, 2, 16, 96)

    # the literal folders below mirror this export: same names, same shapes
    from safetensors import safe_open

    with safe_open(str(tmp_path / "drafter" / "model.safetensors"), framework="numpy") as handle:
        exported = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
    assert exported == {k: v.shape for k, v in tensors(draft_vocab=500).items()}
    exported_config = json.loads((tmp_path / "drafter" / "config.json").read_text())
    for key, value in config(draft_vocab_size=500).items():
        if key != "eagle_config":
            assert exported_config[key] == value, key
    assert exported_config["eagle_config"] == config()["eagle_config"]


# --- literal folders that read -------------------------------------------------------------------


def test_literal_full_vocabulary_reads(tmp_path):
    layout = read_eagle3(write(tmp_path / "d", config()), BASE)
    assert not layout.has_d2t and layout.has_lm_head and layout.capture_layers == (0, 1)


def test_midlayer_names_read_as_layer_zero(tmp_path):
    weights = {k.replace("layers.0.", "midlayer."): v for k, v in tensors().items()}
    assert read_eagle3(write(tmp_path / "d", config(), weights), BASE).num_layers == 1


def test_default_capture_is_tensorrt_llms(tmp_path):
    cfg = config(eagle_config={"use_aux_hidden_state": True})
    weights = tensors(captured=3)
    del weights["lm_head.weight"]  # the target's is used
    layout = read_eagle3(write(tmp_path / "d", cfg, weights), BASE8)
    assert layout.capture_layers == (1, 3, 4) and not layout.capture_from_config and not layout.has_lm_head


# --- one refusal per check -----------------------------------------------------------------------


def test_config_missing(tmp_path):
    refused(write(tmp_path / "d"), "config.json", "not found")


def test_config_not_an_object(tmp_path):
    refused(write(tmp_path / "d", ["LlamaForCausalLMEagle3"]), "config.json", "JSON object")


def test_pickle_only_refused(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config()))
    (folder / "pytorch_model.bin").write_bytes(b"not unpickled")
    refused(folder, "pytorch_model.bin", "safetensors")


def test_unregistered_architecture(tmp_path):
    refused(
        write(tmp_path / "d", config(architectures=["Eagle3DeepseekV2ForCausalLM"])),
        "config.json", "Eagle3DeepseekV2ForCausalLM", "LlamaForCausalLMEagle3",
    )  # fmt: skip


def test_eagle12_architecture(tmp_path):
    refused(write(tmp_path / "d", config(architectures=["EagleForCausalLM"])), "config.json", "EAGLE-1/2 drafters")


def test_eagle1_folder_by_its_tensors(tmp_path):
    """The EAGLE-1 reference layout: LlamaForCausalLM, fc [h, 2h] with bias, a plain first layer."""
    cfg = config(architectures=["LlamaForCausalLM"])
    del cfg["draft_vocab_size"], cfg["eagle_config"]
    weights = tensors()
    del weights["layers.0.hidden_norm.weight"]
    weights["fc.bias"] = np.zeros(HIDDEN, dtype=np.float16)
    for name in ("q", "k", "v"):
        rows = weights[f"layers.0.self_attn.{name}_proj.weight"].shape[0]
        weights[f"layers.0.self_attn.{name}_proj.weight"] = np.zeros((rows, HIDDEN), dtype=np.float16)
    refused(write(tmp_path / "d", cfg, weights), "EAGLE-1/2 drafters do not load on TensorRT-LLM's PyTorch backend")


def test_no_draft_vocab_size(tmp_path):
    cfg = config()
    del cfg["draft_vocab_size"]
    refused(write(tmp_path / "d", cfg), "config.json", "draft_vocab_size")


def test_hidden_size_differs_from_base(tmp_path):
    base = ModelGeometry(**{**BASE.to_dict(), "hidden_size": 128})
    refused(write(tmp_path / "d", config()), "config.json", "hidden_size 64", "128", base=base)


def test_target_hidden_size_differs_from_base(tmp_path):
    refused(write(tmp_path / "d", config(target_hidden_size=32)), "config.json", "target_hidden_size 32")


def test_vocab_differs_from_base(tmp_path):
    refused(write(tmp_path / "d", config(vocab_size=999)), "config.json", "vocab_size 999")


def test_required_tensor_missing(tmp_path):
    weights = tensors()
    del weights["norm.weight"]
    refused(write(tmp_path / "d", config(), weights), "model.safetensors", "'norm.weight' missing")


def test_first_layer_q_reads_hidden_not_twice(tmp_path):
    weights = tensors()
    weights["layers.0.self_attn.q_proj.weight"] = np.zeros((HEADS * HEAD_DIM, HIDDEN), dtype=np.float16)
    refused(
        write(tmp_path / "d", config(), weights),
        "model.safetensors", "'layers.0.self_attn.q_proj.weight'", "[64, 64]", "[64, 128]", "2 x hidden",
    )  # fmt: skip


def test_kv_heads_from_config(tmp_path):
    refused(write(tmp_path / "d", config(num_key_value_heads=4)), "'layers.0.self_attn.k_proj.weight'", "[64, 128]")


def test_fc_width_differs_from_capture_layers(tmp_path):
    cfg = config()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]
    refused(write(tmp_path / "d", cfg), "model.safetensors", "'fc.weight'", "3 layers [0, 1, 2]")


def test_fc_width_against_the_default_capture(tmp_path):
    refused(write(tmp_path / "d", config(eagle_config={})), "'fc.weight'", "default 3 layers [1, 3, 4]", base=BASE8)


def test_default_capture_needs_more_than_five_layers(tmp_path):
    refused(write(tmp_path / "d", config(eagle_config={})), "config.json", "more than 5 base layers")


def test_capture_layer_outside_base(tmp_path):
    cfg = config()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 4]
    refused(write(tmp_path / "d", cfg), "config.json", "names layer 4", "0..3")


def test_d2t_missing_for_smaller_draft_vocabulary(tmp_path):
    weights = tensors(draft_vocab=500)
    del weights["d2t"]
    refused(write(tmp_path / "d", config(draft_vocab_size=500), weights), "model.safetensors", "'d2t' missing")


def test_d2t_with_full_vocabulary(tmp_path):
    weights = tensors()
    weights["d2t"] = np.zeros(VOCAB, dtype=np.int64)
    refused(write(tmp_path / "d", config(), weights), "model.safetensors", "'d2t'", "draft_vocab_size equals")


def test_d2t_not_integer(tmp_path):
    weights = tensors(draft_vocab=500)
    weights["d2t"] = np.zeros(500, dtype=np.float32)
    refused(write(tmp_path / "d", config(draft_vocab_size=500), weights), "'d2t'", "F32", "integer")


def test_d2t_wrong_length(tmp_path):
    weights = tensors(draft_vocab=500)
    weights["d2t"] = np.zeros(400, dtype=np.int64)
    refused(write(tmp_path / "d", config(draft_vocab_size=500), weights), "'d2t'", "[400]", "[500]")


def test_d2t_maps_outside_the_vocabulary(tmp_path):
    weights = tensors(draft_vocab=500)
    weights["d2t"] = np.arange(500, dtype=np.int64) * 2  # absolute ids written instead of offsets
    refused(
        write(tmp_path / "d", config(draft_vocab_size=500), weights),
        "model.safetensors", "'d2t'", "draft id 334 to target id 1002", "offsets",
    )  # fmt: skip


def test_d2t_negative_target(tmp_path):
    weights = tensors(draft_vocab=500)
    weights["d2t"][7] = -8
    refused(write(tmp_path / "d", config(draft_vocab_size=500), weights), "'d2t'", "draft id 7 to target id -1")


def test_lm_head_wrong_shape(tmp_path):
    weights = tensors(draft_vocab=500)
    weights["lm_head.weight"] = np.zeros((VOCAB, HIDDEN), dtype=np.float16)
    refused(write(tmp_path / "d", config(draft_vocab_size=500), weights), "'lm_head.weight'", "[1000, 64]", "[500, 64]")


def test_lm_head_missing_for_smaller_draft_vocabulary(tmp_path):
    weights = tensors(draft_vocab=500)
    del weights["lm_head.weight"]
    refused(write(tmp_path / "d", config(draft_vocab_size=500), weights), "'lm_head.weight' missing", "own lm_head")


def test_unknown_tensor(tmp_path):
    weights = tensors()
    weights["parallel_draft_heads.0.medusa_layers.0.linear.weight"] = np.zeros((HIDDEN, HIDDEN), dtype=np.float16)
    refused(
        write(tmp_path / "d", config(), weights),
        "model.safetensors", "'parallel_draft_heads.0.medusa_layers.0.linear.weight'", "would drop it",
    )  # fmt: skip


def test_layer_beyond_num_hidden_layers(tmp_path):
    weights = tensors()
    weights["layers.1.mlp.up_proj.weight"] = np.zeros((INTER, HIDDEN), dtype=np.float16)
    refused(write(tmp_path / "d", config(), weights), "'layers.1.mlp.up_proj.weight'", "num_hidden_layers 1")


def test_tied_lm_head(tmp_path):
    refused(write(tmp_path / "d", config(tie_word_embeddings=True)), "config.json", "tie_word_embeddings")


def test_quantized_drafter(tmp_path):
    refused(write(tmp_path / "d", config(quantization_config={"quant_method": "modelopt"})), "config.json", "quantized")


def test_no_aux_hidden_state_variant(tmp_path):
    cfg = config()
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    refused(write(tmp_path / "d", cfg), "config.json", "use_aux_hidden_state")
