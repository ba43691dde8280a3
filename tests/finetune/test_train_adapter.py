"""train-adapter on a tiny random model: it trains, is reproducible, and writes a folder the merge stage takes."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.finetune.data import DataSettings, code_modules
from pipeline.finetune.train import REPORT_FILE, TrainSettings, train_adapter
from pipeline.heads.prompts import load_prompts
from tests.quantize.conftest import build_tiny_llama

pytest.importorskip("peft")


def _settings(task: str, **changes) -> TrainSettings:
    data = DataSettings(
        block=32, max_train_blocks=64, max_heldout_blocks=8, answer_tokens=12, gen_batch=8, max_train_prompts=8
    )
    settings = dict(rank=4, steps=8, batch=2, lr=1e-2, warmup=2, bf16_autocast=False, eval_new_tokens=8)
    return TrainSettings(task=task, data=data, **(settings | changes))


def test_json_adapter_trains_reproducibly(tmp_path):
    torch.set_num_threads(1)
    model = build_tiny_llama(tmp_path / "tiny")
    first = train_adapter(model, tmp_path / "a", tmp_path / "cache", _settings("json"), say=lambda _: None)
    assert first["steps_done"] == 8 and not first["stopped_early_by_time"]
    assert first["heldout_loss_after"] < first["heldout_loss_before"]
    assert first["eval_prompts"] == len(load_prompts("chat", "eval"))
    assert 0 <= first["eval_greedy_changed"] <= first["eval_prompts"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        REPORT_FILE,
    ]
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    assert json.loads((tmp_path / "a" / REPORT_FILE).read_text())["heldout_loss_after"] == first["heldout_loss_after"]
    # the base answers are cached: the second run only trains, and lands on the same bytes
    second = train_adapter(model, tmp_path / "b", tmp_path / "cache", _settings("json"), say=lambda _: None)
    assert (tmp_path / "a" / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "b" / "adapter_model.safetensors"
    ).read_bytes()
    assert second["heldout_loss_after"] == first["heldout_loss_after"]


def test_code_task_holds_out_the_eval_modules():
    train, heldout = code_modules()
    eval_modules = {r["source"].rsplit(".", 1)[0] for r in load_prompts("code", "eval")}
    assert heldout and not set(train) & set(heldout)
    assert not (set(train) | set(heldout)) & eval_modules


def test_cli_trains_a_code_adapter(cli, tmp_path):
    model = build_tiny_llama(tmp_path / "tiny")
    rc, out, err = cli(
        "train-adapter",
        "--task",
        "code",
        "--model",
        str(model),
        "--out",
        str(tmp_path / "code"),
        "--steps",
        "3",
        "--batch",
        "2",
        "--rank",
        "2",
        "--last-layers",
        "1",
        "--block",
        "32",
        "--eval-new-tokens",
        "4",
        "--heldout-blocks",
        "4",
    )
    assert rc == 0, err
    report = json.loads((tmp_path / "code" / REPORT_FILE).read_text())
    assert report["steps_done"] == 3 and report["task"] == "code" and report["train_examples"] > 0
    config = json.loads((tmp_path / "code" / "adapter_config.json").read_text())
    assert config["layers_to_transform"] == [1]
    assert "held-out loss" in out


def test_oversized_adapter_is_refused_before_training_and_leaves_nothing(tmp_path):
    """The adapter's size is known from the base's config: refused before the first step, the limit named."""
    from pipeline.errors import InputError

    model = build_tiny_llama(tmp_path / "tiny")
    said: list[str] = []
    with pytest.raises(InputError, match="over --max-adapter-mib 0.001; lower --rank"):
        train_adapter(
            model,
            tmp_path / "big",
            tmp_path / "cache",
            _settings("code", steps=1, max_adapter_mib=0.001),
            say=said.append,
        )
    assert said == []  # nothing was loaded or trained
    assert not (tmp_path / "big").exists() and not list(tmp_path.glob(".big.tmp-*"))


def test_the_predicted_adapter_size_is_the_saved_one(tmp_path):
    from safetensors import safe_open

    from pipeline.finetune.train import adapter_bytes, check_base

    model = build_tiny_llama(tmp_path / "tiny")
    settings = _settings("code", steps=1, targets=("q_proj", "k_proj", "down_proj"), last_layers=1)
    train_adapter(model, tmp_path / "a", tmp_path / "cache", settings, say=lambda _: None)
    with safe_open(tmp_path / "a" / "adapter_model.safetensors", "pt") as f:
        saved = sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
    assert adapter_bytes(check_base(model), settings) == saved


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda out: (out.mkdir(), (out / "notes.txt").write_text("mine")), "a folder specdeploy did not write"),
        (lambda out: out.write_text("a file"), "a file specdeploy did not write"),
        (lambda out: (out.mkdir(), (out / "adapter_config.json").write_text("{}")), "a folder specdeploy"),
    ],
)
def test_an_output_it_did_not_write_is_refused_and_kept(tmp_path, setup, expected):
    from pipeline.errors import HostFilesystemError

    model = build_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "work"
    setup(out)
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else out.read_text()
    with pytest.raises(HostFilesystemError, match=expected) as info:
        train_adapter(model, out, tmp_path / "cache", _settings("code", steps=1), say=lambda _: None)
    assert info.value.exit_code == 4 and str(out) in str(info.value)
    assert (sorted(p.name for p in out.iterdir()) if out.is_dir() else out.read_text()) == before


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--lr", "nan"], "--lr nan: must be a finite number above 0"),
        (["--alpha", "-1"], "--alpha -1.0: must be a finite number above 0"),
        (["--targets", "q_proj,qkv"], "--targets qkv: not a Llama projection"),
        (["--model", "MISSING"], "config.json"),
        (["--model", "BADCONFIG"], "config.json"),
        (["--last-layers", "999"], "--last-layers 999 is more than the base's"),
    ],
)
def test_cli_refuses_bad_input_before_training_in_one_line(cli, tmp_path, flags, expected):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    flags = [{"MISSING": str(tmp_path / "nowhere"), "BADCONFIG": str(tmp_path / "bad")}.get(f, f) for f in flags]
    if "--model" not in flags:
        flags += ["--model", str(build_tiny_llama(tmp_path / "tiny"))]
    rc, _, err = cli("train-adapter", "--task", "code", "--out", str(tmp_path / "x"), *flags)
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # (the tiny model's build logs too)
    assert rc == 2 and "Traceback" not in err and len(errors) == 1 and expected in errors[0], err
    assert not (tmp_path / "x").exists()


def test_a_format_task_trains_on_chosen_targets_and_counts_its_format(tmp_path):
    model = build_tiny_llama(tmp_path / "tiny")
    settings = _settings("tldr", steps=2, targets=("q_proj", "v_proj"))
    report = train_adapter(model, tmp_path / "tldr", tmp_path / "cache", settings, say=lambda _: None)
    assert report["task"] == "tldr" and report["settings"]["targets"] == ("q_proj", "v_proj")
    assert 0 <= report["eval_answers_tldr_after"] <= report["eval_prompts"]
    config = json.loads((tmp_path / "tldr" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]


def test_an_adapter_it_trained_before_is_replaced(tmp_path):
    model = build_tiny_llama(tmp_path / "tiny")
    settings = _settings("code", steps=1)
    train_adapter(model, tmp_path / "a", tmp_path / "cache", settings, say=lambda _: None)
    report = train_adapter(model, tmp_path / "a", tmp_path / "cache", settings, say=lambda _: None)
    assert report["steps_done"] == 1 and (tmp_path / "a" / REPORT_FILE).is_file()


def test_an_out_that_cannot_be_written_is_refused_before_training(cli, tmp_path):
    """--out directly under /proc: its parent exists, but nothing can be written there (exit 4, no training)."""
    tiny = build_tiny_llama(tmp_path / "tiny")
    rc, out, err = cli(
        "train-adapter", "--task", "code", "--model", str(tiny), "--out", "/proc/adapter", "--steps", "1"
    )
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 4 and "Traceback" not in err and len(errors) == 1 and "/proc/adapter" in errors[0], err
    assert "training" not in out.lower() and "held-out" not in out, out
