"""Stale heads: heads fitted on model A, served on a perturbed model B (a stand-in for a fine-tune of A
reusing A's heads), measure lower acceptance, and choosing by measurement stops picking them."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.costmodel.hardware import gpu_perf
from pipeline.costmodel.predict import predict
from pipeline.costmodel.step import Deployment
from pipeline.evaluation.candidates import candidates, load
from pipeline.evaluation.choose import Gates, choose
from pipeline.evaluation.measure import identity, measure, summarize
from pipeline.geometry import ModelGeometry
from tests.runtime import fixtures as sf

PROMPTS = sf.test_prompts(96)[:6]  # the traffic the heads were fitted on (on model A)
NEW = 16


@pytest.fixture(scope="module")
def model_b(tiny):
    """Model A with every decoder weight moved by noise of 0.6x its own spread (seeded)."""
    folder = tiny.root / "hf-perturbed"
    if not folder.exists():
        shutil.copytree(tiny.hf, folder)
        path = next(folder.glob("*.safetensors"))
        state = load_file(str(path))
        gen = torch.Generator().manual_seed(7)
        for name, tensor in state.items():
            if ".layers." in name and name.endswith("proj.weight"):
                state[name] = tensor + torch.randn(tensor.shape, generator=gen) * tensor.std() * 0.6
        save_file(state, str(path), metadata={"format": "pt"})
    return folder


def evaluate(engine, hf, kind):
    listed = candidates(engine, sf.rehearsing(kind))
    loaded = [load(engine, c) for c in listed]
    found, _ = measure(loaded, PROMPTS, NEW, end_id=None)
    config = hf / "config.json"
    deployment = Deployment(ModelGeometry.from_hf(json.loads(config.read_text()), str(config)), gpu_perf("l40s"))
    records = []
    for item in loaded:
        measured, plain = found[item.candidate.name], found["plain"]
        record = {
            "name": item.candidate.name,
            "method": item.candidate.method,
            **summarize(measured, plain, item.method.draft_positions),
            "identity": identity(engine, PROMPTS, plain.acceptance.outputs, measured.acceptance.outputs),
        }
        al = min(record["mean_acceptance_length"], item.candidate.drafting.rows)
        record["predicted_speedup"] = {
            str(p.batch): p.speedup for p in predict(deployment, item.candidate.drafting, al, [1])
        }
        records.append(record)
    return {r["name"]: r for r in records}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_stale_heads_measure_lower_acceptance_and_best_drops_them(tiny, model_b, kind):
    fresh = evaluate(tiny.engine(kind), tiny.hf, kind)
    stale = evaluate(tiny.engine(kind, f"{kind}-stale-engine", hf=model_b), model_b, kind)
    heads = [name for name in fresh if name.startswith(kind)][0]
    print(
        json.dumps(
            {
                n: (round(fresh[n]["mean_acceptance_length"], 2), round(stale[n]["mean_acceptance_length"], 2))
                for n in fresh
            }
        )
    )
    assert stale[heads]["mean_acceptance_length"] < fresh[heads]["mean_acceptance_length"] - 0.3
    assert all(r["identity"]["lossless"] for r in stale.values())  # stale heads cost speed, never correctness
    assert choose(list(fresh.values()), 1, "l40s", Gates()).method == kind  # the fitted heads pay on model A
    assert choose(list(stale.values()), 1, "l40s", Gates()).method in ("lookahead", "none")
