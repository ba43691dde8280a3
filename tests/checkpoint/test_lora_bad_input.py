"""Bad adapters fail before any output byte, with one line naming the file and the tensor."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.checkpoint.merge import merge_adapters
from pipeline.errors import InputError
from tests.checkpoint.conftest import make_adapter
from tests.quantize.conftest import build_tiny_llama

peft = pytest.importorskip("peft")


@pytest.fixture
def setup(tiny_llama, tmp_path):
    """(base folder, adapter folder, merge()) for an ordinary LoRA adapter of the tiny model."""
    base = tiny_llama()
    folder = tmp_path / "adapter"
    make_adapter(base.model, folder)

    def merge(adapter=folder, model=base.path):
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        try:
            return merge_adapters(model, [adapter], out)
        except InputError:
            assert not any(out.iterdir())  # refused before the first output byte
            raise

    return base, folder, merge


def edit_config(folder, **changes):
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_tensors(folder, edit):
    path = folder / "adapter_model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def refused(merge, *needles):
    with pytest.raises(InputError) as info:
        merge()
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"


def test_target_module_absent_from_base(setup):
    _, folder, merge = setup
    edit_config(folder, target_modules=["q_proj", "v_proj", "down_proj", "c_attn"])
    refused(merge, "adapter_config.json", "target module 'c_attn' is absent")


def test_tensor_for_a_module_the_base_lacks(setup):
    _, folder, merge = setup
    edit_tensors(
        folder,
        lambda t: t.update(
            {
                Q0.replace("layers.0", "layers.7") + ".lora_A.weight": t[Q0 + ".lora_A.weight"].clone(),
                Q0.replace("layers.0", "layers.7") + ".lora_B.weight": t[Q0 + ".lora_B.weight"].clone(),
            }
        ),
    )
    refused(merge, "adapter_model.safetensors", "layers.7.self_attn.q_proj", "does not have")


def test_rank_differs_from_config(setup):
    _, folder, merge = setup
    edit_config(folder, r=8)
    refused(merge, "adapter_model.safetensors", "lora_A.weight", "rank does not match r=8")


def test_adapter_of_another_shape(setup, tiny_llama, tmp_path):
    other = tiny_llama("wider", intermediate_size=128)
    make_adapter(other.model, tmp_path / "wide")
    _, _, merge = setup
    refused(
        lambda: merge(tmp_path / "wide"), "down_proj.lora_A.weight", "[64, 128]", "[64, 96]", "trained on another model"
    )


def test_missing_half_of_a_pair(setup):
    _, folder, merge = setup
    edit_tensors(folder, lambda t: t.pop(Q0 + ".lora_B.weight"))
    refused(merge, f"{Q0}.lora_A.weight", "no matching lora_B")


def test_trained_bias_is_refused(setup):
    _, folder, merge = setup
    edit_config(folder, lora_bias=True)
    refused(merge, "adapter_config.json", "bias training")
    edit_config(folder, lora_bias=False)
    edit_tensors(folder, lambda t: t.update({Q0 + ".lora_B.bias": torch.zeros(64)}))
    refused(merge, f"{Q0}.lora_B.bias", "no biases")


def test_dora_magnitude_without_use_dora(setup):
    _, folder, merge = setup
    edit_tensors(folder, lambda t: t.update({Q0 + ".lora_magnitude_vector": torch.ones(64)}))
    refused(merge, "use_dora is False", "magnitude vector is present")


def test_modules_to_save_with_another_vocabulary(setup, tiny_llama, tmp_path):
    other = tiny_llama("bigvocab", vocab_size=128)
    make_adapter(other.model, tmp_path / "vocab", target_modules=["q_proj"], modules_to_save=["lm_head"])
    _, _, merge = setup
    refused(lambda: merge(tmp_path / "vocab"), "base_model.model.lm_head.weight", "[128, 64]", "resized vocabulary")


def test_tied_embeddings_are_not_updated(tiny_llama, tmp_path):
    base = tiny_llama("tied", tie_word_embeddings=True)
    make_adapter(base.model, tmp_path / "emb", target_modules=["q_proj", "embed_tokens"])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError, match="tied embeddings"):
        merge_adapters(base.path, [tmp_path / "emb"], out)
    assert not any(out.iterdir())


def test_pickled_objects_are_never_unpickled(setup, tmp_path):
    _, folder, merge = setup
    (folder / "adapter_model.safetensors").unlink()

    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    (folder / "adapter_model.bin").write_bytes(pickle.dumps({"x": Payload()}))
    refused(merge, "adapter_model.bin", "cannot be loaded safely", "weights_only=True")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "adapter_config.json: missing"),
        ("{not json", "not valid JSON"),
        ('{"peft_type": "IA3"}', "peft_type 'IA3' is not supported"),
        ('{"peft_type": "LORA", "r": 0, "lora_alpha": 8}', "r must be a positive integer"),
        ('{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "fan_in_fan_out": true}', "fan_in_fan_out"),
        ('{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "layer_replication": [[0, 2]]}', "layer_replication"),
    ],
)
def test_bad_adapter_config(setup, content, needle):
    _, folder, merge = setup
    path = folder / "adapter_config.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    refused(merge, str(path), needle)


def test_bad_adapter_fails_the_engine_with_exit_2_and_no_output(write_spec, cli, tmp_path):
    from transformers import LlamaForCausalLM

    base = build_tiny_llama(tmp_path / "tiny")  # with a tokenizer: planning checks it
    folder = tmp_path / "adapter"
    make_adapter(LlamaForCausalLM.from_pretrained(base).eval(), folder)
    edit_config(folder, r=2)
    spec = write_spec(f"name: t\nmodel: {{path: {base}, adapter: {folder}}}\ntarget: reference\n")
    rc, _, err = cli("engine", str(spec))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "lora_A.weight" in errors[0] and "r=2" in errors[0], err
    merged = tmp_path / "engines" / "t" / "merged"
    assert not merged.exists() and not list(merged.parent.glob(".merged.tmp-*"))
