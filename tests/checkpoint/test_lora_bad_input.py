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


# -- the values inside the adapter's tensors -------------------------------------------------------


@pytest.mark.parametrize(
    "tensor, value, index, row",
    [
        (Q0 + ".lora_A.weight", float("nan"), (2, 5), 2),
        (Q0 + ".lora_B.weight", float("inf"), (40, 1), 40),
        ("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", float("-inf"), (0, 3), 0),
    ],
)
def test_non_finite_adapter_tensor_is_refused_before_any_output(setup, tensor, value, index, row):
    _, folder, merge = setup
    edit_tensors(folder, lambda t: t[tensor].__setitem__(index, value))
    message = refused(
        merge, str(folder / "adapter_model.safetensors"), f"tensor {tensor} holds NaN or Inf at row {row}"
    )
    assert "model.safetensors:" not in message.replace(
        "adapter_model.safetensors:", ""
    )  # the adapter, not a merged file


@pytest.mark.parametrize("alpha", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_lora_alpha_is_refused(setup, alpha):
    _, folder, merge = setup
    path = folder / "adapter_config.json"
    path.write_text(path.read_text().replace('"lora_alpha": 8', f'"lora_alpha": {alpha}'))
    assert alpha in path.read_text()
    refused(merge, str(path), "lora_alpha must be a positive finite number")


def test_finite_but_absurd_update_is_refused_with_the_numbers(setup, tmp_path):
    _, folder, merge = setup
    edit_tensors(folder, lambda t: t[Q0 + ".lora_B.weight"].fill_(3e38))  # the update reaches ~1e38 in float32
    message = refused(
        merge,
        str(folder / "adapter_model.safetensors"),
        f"tensors {Q0}.lora_A.weight / {Q0}.lora_B.weight",
        "the change to model.layers.0.self_attn.q_proj.weight reaches",
        "times the base tensor's largest value",
        "the limit is 256x",
    )
    assert "e+3" in message  # the numbers: an update of order 1e38 against weights below 1
    assert not any((tmp_path / "out").iterdir())  # refused while merging: the files begun are removed


def test_an_update_just_inside_the_limit_merges_and_is_reported(setup, tmp_path):
    base, folder, merge = setup
    weights = load_file(folder / "adapter_model.safetensors")
    summary = merge()
    ratio, tensor = summary.largest_change
    assert 0 < ratio < 256 and tensor.endswith(".weight")
    provenance = json.loads((tmp_path / "out" / "specdeploy_merge.json").read_text())
    assert provenance["adapters"][0]["largest_change"] == {"ratio": ratio, "tensor": tensor}
    # Scaled to 200x: large, but the base survives the rounding; merged, and the ratio says so.
    for name in list(weights):
        if name.endswith("lora_B.weight"):
            weights[name] *= 200 / ratio
    save_file(weights, folder / "adapter_model.safetensors")
    for path in (tmp_path / "out").iterdir():
        path.unlink()
    assert merge().largest_change[0] == pytest.approx(200, rel=1e-3)


def test_absurd_modules_to_save_copy_is_refused(setup, tiny_llama, tmp_path):
    base, _, merge = setup
    make_adapter(base.model, tmp_path / "saved", target_modules=["q_proj"], modules_to_save=["lm_head"])
    edit_tensors(tmp_path / "saved", lambda t: t["base_model.model.lm_head.weight"].mul_(1e6))
    refused(lambda: merge(tmp_path / "saved"), "tensor base_model.model.lm_head.weight", "change to lm_head.weight")


def test_update_that_overflows_the_base_dtype_is_refused(tiny_llama, tmp_path):
    base = tiny_llama()
    with torch.no_grad():
        base.model.model.layers[0].self_attn.q_proj.weight[5, 0] = 1000.0
    base.model.half().save_pretrained(tmp_path / "half")
    make_adapter(base.model.float(), tmp_path / "ad")

    def one_entry(t):  # an update of 70000 at [5, 0] (scale 8/4 = 2): 70x the weight, 71000 overflows float16
        t[Q0 + ".lora_A.weight"].zero_()[0, 0] = 1.0
        t[Q0 + ".lora_B.weight"].zero_()[5, 0] = 35000.0

    edit_tensors(tmp_path / "ad", one_entry)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError) as info:
        merge_adapters(tmp_path / "half", [tmp_path / "ad"], out)
    assert str(info.value) == (
        f"{tmp_path / 'ad' / 'adapter_model.safetensors'}: tensors {Q0}.lora_A.weight / {Q0}.lora_B.weight: "
        "merged into model.layers.0.self_attn.q_proj.weight, it overflows float16 at row 5; the adapter is "
        "corrupt or was trained on another model"
    )
    assert not any(out.iterdir())


def test_non_finite_base_tensor_is_blamed_on_the_base(setup, tmp_path):
    base, _, merge = setup
    weights = load_file(base.path / "model.safetensors")
    weights["model.layers.0.self_attn.q_proj.weight"][7, 1] = float("nan")
    save_file(weights, base.path / "model.safetensors", metadata={"format": "pt"})
    refused(merge, str(base.path / "model.safetensors"), "tensor model.layers.0.self_attn.q_proj.weight", "row 7")


def test_non_finite_adapter_fails_the_engine_naming_the_adapter_and_leaves_no_merged_folder(write_spec, cli, tmp_path):
    from transformers import LlamaForCausalLM

    base = build_tiny_llama(tmp_path / "tiny")
    folder = tmp_path / "adapter"
    make_adapter(LlamaForCausalLM.from_pretrained(base).eval(), folder)
    edit_tensors(folder, lambda t: t[Q0 + ".lora_B.weight"].__setitem__((3, 0), float("nan")))
    spec = write_spec(f"name: t\nmodel: {{path: {base}, adapter: {folder}}}\ntarget: reference\n")
    rc, _, err = cli("engine", str(spec))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, err
    assert f"{folder / 'adapter_model.safetensors'}: tensor {Q0}.lora_B.weight holds NaN or Inf at row 3" in errors[0]
    merged = tmp_path / "engines" / "t" / "merged"
    assert not merged.exists() and not list(merged.parent.glob(".merged.tmp-*"))


# -- the same adapters converted for a shared LoRA engine (the lora stage) ---------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_the_lora_stage_refuses_a_non_finite_adapter_as_the_merge_does(setup, value):
    from pipeline.lora.convert import convert_adapter

    base, folder, _ = setup
    edit_tensors(folder, lambda t: t[Q0 + ".lora_A.weight"].__setitem__((2, 5), value))
    with pytest.raises(InputError) as info:
        convert_adapter(folder, "float32", base.path)
    assert f"tensor {Q0}.lora_A.weight holds NaN or Inf at row 2" in str(info.value)


def test_the_lora_stage_refuses_an_adapter_float16_cannot_hold(setup):
    """Scaled by lora_alpha / r, a large lora_B overflows float16: refused naming the tensor, not served as Inf."""
    from pipeline.lora.convert import convert_adapter

    base, folder, _ = setup
    edit_tensors(folder, lambda t: t[Q0 + ".lora_B.weight"].__setitem__((1, 1), 60000.0))
    convert_adapter(folder, "float32", base.path)  # float32 holds it
    with pytest.raises(InputError, match=rf"{Q0}.lora_B.weight.*not finite in float16"):
        convert_adapter(folder, "float16", base.path)
