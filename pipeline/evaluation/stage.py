"""The evaluate stage's body: the variant's checkpoint served by the reference runtime, every candidate
measured on the evaluation prompts, each one's GPU speedup predicted by the cost model.

``evaluation.device: cuda`` runs the same runtime with the weights and KV caches on the GPU (plain
torch matmuls), for models too large to rehearse on a CPU; the CPU step costs are then GPU step times
of the reference runtime (not TensorRT-LLM's).

Writes ``evaluation.json`` into the stage's output folder (the runner renames it into place):
settings, prompts, timings (wall, shared-prefill CPU time and the CPU time it saved), and per
candidate the measured record (measure.summarize), output identity against plain decoding and the
predicted GPU speedup at each of ``evaluation.batch_sizes`` on the plan's GPU type.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pipeline import methods, targets
from pipeline.costmodel.gemm_probe import probe
from pipeline.costmodel.hardware import gpu_perf
from pipeline.costmodel.predict import predict
from pipeline.costmodel.profile import DEFAULT_RUNTIME, Calibration, calibration
from pipeline.costmodel.step import Deployment
from pipeline.errors import InputError, StageError, StageUnavailable
from pipeline.evaluation import candidates as cands
from pipeline.evaluation.apply import candidate_build
from pipeline.evaluation.choose import Gates, choose
from pipeline.evaluation.measure import (
    ACCEPTANCE_BATCH,
    ACCEPTANCE_THREADS,
    PROBE_PROMPTS,
    forward_rows,
    identity,
    measure,
    planned_tokens,
    summarize,
)
from pipeline.evaluation.prompts import encode, needs_tokenizer, read_prompts
from pipeline.evaluation.report import CURVE_BATCHES, write_report
from pipeline.evaluation.result import RESULT_FILE
from pipeline.methods.lookahead import LookaheadConfig
from pipeline.methods.ngram import NGramConfig
from pipeline.plan.types import StagePlan, VariantPlan
from pipeline.progress import step_progress
from pipeline.runtime.model.engine import Engine
from pipeline.trtllm.engine_config import predict_engine_config

EVALUATION_PROBE_ROWS = (1, 2, 4, 8, 12, 16, 24, 32)  # the rows decode steps and trees feed here
DEFAULT_NGRAM_DRAFTS = 4  # NGram's K on the PyTorch backend when the plan decodes otherwise (the spec's default)
DEFAULT_GPU = "h100-sxm-80gb"  # predictions for a plan without gpu.type (said so in the result)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """CPU step costs are thread CPU time: torch on one thread, as the reference backend serves."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def load_engine(variant: VariantPlan, checkpoint: Path, scratch: Path, device: str = "cpu") -> Engine:
    """The reference engine of this checkpoint: the build config trtllm-build would write, the checkpoint's
    rank files linked beside it in ``scratch`` (as the reference build stage places them)."""
    try:
        checkpoint_config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise StageError(
            f"{checkpoint / 'config.json'}: no readable checkpoint ({exc}); run the convert stage"
        ) from None
    folder = scratch / "engine"
    folder.mkdir()
    for rank in range(variant.world_size):
        name = f"rank{rank}.safetensors"
        try:
            os.link(checkpoint / name, folder / name)
        except OSError:
            shutil.copy2(checkpoint / name, folder / name)
    config = predict_engine_config(variant, checkpoint_config, output_dir=folder)
    (folder / "config.json").write_text(json.dumps(config))
    return Engine.load(folder, device=device)


def candidates_checkpoint(variant: VariantPlan, stage: StagePlan, scratch: Path) -> Path:
    """The checkpoint the candidates are served from: the convert stage's, or (method: best, where convert
    follows the choice) the candidates' own, converted here by the convert stage's body."""
    if "checkpoint" in stage.inputs:
        return stage.inputs["checkpoint"]
    from pipeline.stages import convert

    folder = scratch / "checkpoint"
    folder.mkdir()
    inputs = {"model": stage.inputs["model"]} | ({"heads": stage.inputs["heads"]} if "heads" in stage.inputs else {})
    convert.run(variant, StagePlan("convert", folder, inputs, stage.params["convert"]), folder)
    return folder


def run_evaluation(variant: VariantPlan, stage: StagePlan, out: Path, say: Callable[[str], None] = print) -> dict:
    variant = variant.rehearsed()  # method: best: the heads' candidates, whatever was chosen before
    params = stage.params
    settings = params["evaluation"]
    device = settings["device"]
    if device == "cuda" and not torch.cuda.is_available():
        raise StageUnavailable(
            "evaluation.device cuda: this host has no CUDA device (torch.cuda.is_available() "
            "is false); use device: cpu, or run the evaluation on a GPU host"
        )
    started = time.perf_counter()
    prompt_path = stage.inputs["prompts0"] if settings["prompts"] else None  # resolved against the spec file
    prompts_read = read_prompts(prompt_path, settings["count"])
    tokenizer = None
    if needs_tokenizer(prompts_read):
        from transformers import AutoTokenizer

        folder = stage.inputs["tokenizer"]
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(
                f"{folder}: cannot load the model's tokenizer for the text prompts ({first}); add the "
                'tokenizer files, or give evaluation.prompts with "input_ids"'
            ) from None
    prompts = encode(prompts_read, tokenizer, variant.arch.vocab_size)
    look = LookaheadConfig(*params["lookahead"])
    spec = variant.speculative
    target = targets.definition(variant.target)
    # On a GPU the methods' own tensors (masks, indices) are made there too; on the CPU no device mode is
    # entered: it would put a torch-function hook in front of every op (~40% on small ops).
    on_device = torch.device(device) if device != "cpu" else contextlib.nullcontext()
    with tempfile.TemporaryDirectory(prefix=".evaluate-engine-", dir=out.parent) as scratch, one_thread(), on_device:
        engine = load_engine(variant, candidates_checkpoint(variant, stage, Path(scratch)), Path(scratch), device)
        limit = engine.config.limits.max_input_len
        for prompt, ids in zip(prompts_read, prompts):
            if len(ids) + settings["max_new_tokens"] > engine.config.limits.max_seq_len or len(ids) > limit:
                raise InputError(
                    f"{prompt.where}: the prompt has {len(ids)} tokens; with max_new_tokens "
                    f"{settings['max_new_tokens']} it exceeds the build's max_input_len {limit} / "
                    f"max_seq_len {engine.config.limits.max_seq_len}"
                )
        configs = {**spec.configs(), "lookahead": look}
        # The PyTorch backend measures its zero-touch method whatever the plan's (TensorRT-LLM's NGram K 4)
        if spec.ngram is None and not target.builds_engines:
            configs["ngram"] = NGramConfig(DEFAULT_NGRAM_DRAFTS)
        heads = Path(stage.inputs["heads"]) if "heads" in stage.inputs else None
        listed = cands.candidates(engine, cands.Measuring(configs, params["eagle_dynamic_top_k"], heads))
        listed = [c for c in listed if variant.target in methods.definition(c.method).targets]  # what it can run
        loaded = [cands.load(engine, candidate) for candidate in listed]
        say(
            f"[{variant.name}] evaluate: {len(listed)} candidates ({', '.join(c.name for c in listed)}) on "
            f"{len(prompts)} prompts x {settings['max_new_tokens']} tokens"
        )
        end_id = tokenizer.eos_token_id if tokenizer is not None else None
        samples: dict[int, list[float]] = {r: [] for r in forward_rows(listed)}
        tokens = planned_tokens(len(loaded), len(prompts), settings["max_new_tokens"])
        with step_progress(f"[{variant.name}] evaluate: tokens", tokens) as advance:
            found, prefill_cpu = measure(
                loaded, prompts, settings["max_new_tokens"], end_id, say=say, forward=samples, progress=advance
            )
        forward_s = {str(r): statistics.median(t) for r, t in samples.items()}
        # The CPU cost model's GEMM probe, here: in the same minutes as the step costs it is checked against
        # (this host's speed drifts with its load; bench/costmodel_cpu.py reads it from the result).
        gemms = (
            probe(variant.arch, bf16=engine.bf16, repeats=3, rows=EVALUATION_PROBE_ROWS) if device == "cpu" else None
        )
        plain = found["plain"]
        records = []
        for item in loaded:
            measured = found[item.candidate.name]
            record: dict[str, Any] = {
                "name": item.candidate.name,
                "method": item.candidate.method,
                "describe": item.candidate.describe,
                "build": candidate_build(item.candidate),  # what method: best builds when this one is chosen
                **summarize(measured, plain, item.method.draft_positions),
            }
            record["identity"] = identity(engine, prompts, plain.acceptance.outputs, measured.acceptance.outputs)
            records.append(record)
    wall = time.perf_counter() - started
    gpu = params["gpu"] or DEFAULT_GPU
    context = int(sum(len(p) for p in prompts) / len(prompts) + settings["max_new_tokens"] / 2)
    calibration_file = stage.inputs.get("calibration")
    calibrated = load_calibration(calibration_file, gpu) if calibration_file else calibration(DEFAULT_RUNTIME)
    add_predictions(records, listed, variant, gpu, settings["batch_sizes"], context, calibrated)
    batch = settings["batch_sizes"][0]
    planned = None if params["method"] == "best" else planned_candidate(listed, variant)
    gates = Gates.from_dict(params["release"])
    choice = choose(records, batch, gpu, gates, planned, settings.get("prefer"))
    result = {
        "variant": variant.name,
        "settings": settings,
        "method_planned": variant.method,
        "engine_dtype": variant.build.dtype,
        "prompts": {
            "source": str(prompt_path) if prompt_path else "default: chat_eval + code_eval",
            "count": len(prompts),
            "mean_tokens": sum(len(p) for p in prompts) / len(prompts),
        },
        "gpu": {
            "type": gpu,
            "assumed": params["gpu"] is None,
            "context_len": context,
            "dtype": _weights_dtype(params),
            "runtime": calibrated.profile.runtime,
            "calibration": calibrated.source,
            "calibration_file": str(calibration_file) if calibration_file else None,
            "error_bands": {m: dataclasses.asdict(b) for m, b in sorted(calibrated.bands.items())},
        },
        "timing": {
            "wall_s": wall,
            "prefill_cpu_s": prefill_cpu,
            "prefill_saved_cpu_s": prefill_cpu * (len(listed) - 1),
            "decode_cpu_s": sum(m.acceptance.decode_cpu_s + m.probe.decode_cpu_s for m in found.values()),
            "acceptance_cpu_s": sum(m.acceptance.decode_cpu_s for m in found.values()),
            "probe_cpu_s": sum(m.probe.decode_cpu_s for m in found.values()),
            "acceptance_batch": ACCEPTANCE_BATCH,
            "acceptance_threads": min(ACCEPTANCE_THREADS, os.cpu_count() or 1),
            "cpu_forward_s": forward_s,  # one engine pass by rows fed (measure.forward_probe)
            "cpu_gemm_probe": gemms.to_dict() if gemms is not None else None,  # costmodel.gemm_probe.probe
            "probe_prompts": min(PROBE_PROMPTS, len(prompts)),
        },
        "candidates": records,
        "choice": choice.to_dict(),
        "method_requested": params["method"],
        "release": params["release"],  # the gates the choice was judged by (None: none)
    }
    (out / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
    write_report(result, out)
    say(f"[{variant.name}] evaluate: chose {choice.candidate}: {choice.reason}")
    if choice.failed:
        say(f"[{variant.name}] release gate failed: {choice.failed}")
    return result


def load_calibration(path: Path, gpu: str) -> Calibration:
    """gpu.calibration's profile (the plan checked it; a file changed since is an input error here)."""
    from pipeline.costmodel.calibrate import CalibrationError, load

    try:
        return load(path, gpu)
    except CalibrationError as exc:
        raise InputError(str(exc)) from None


def planned_candidate(listed: list[cands.Candidate], variant: VariantPlan) -> str:
    """The candidate that is the plan's own method and settings (method auto or explicit)."""
    spec = variant.speculative
    # a method with a static and a dynamic tree (EAGLE-1 and EAGLE-2) lists a candidate of each
    dynamic = bool(getattr(spec.config, "dynamic_tree", False))
    return next(c.name for c in listed if c.method == spec.method and c.settings.eagle_dynamic_tree == dynamic)


def _weights_dtype(params: dict) -> str:
    return "fp8" if params["quantization"]["weights"] == "fp8" else "bfloat16"


def add_predictions(
    records: list[dict],
    listed: list[cands.Candidate],
    variant: VariantPlan,
    gpu: str,
    batch_sizes: list[int],
    context_len: int,
    calibrated: Calibration,
) -> None:
    """Each record's predicted GPU speedup per batch size, at its measured mean acceptance length, with
    the interval of its method's error band (``calibrated``)."""
    quant = variant.quant
    deployment = Deployment(
        variant.arch,
        gpu_perf(gpu),
        "fp8" if quant.weights_fp8 else "bfloat16",
        "fp8" if quant.kv_cache_fp8 else "bfloat16",
        variant.tp,
        variant.pp,
        context_len,
        profile=calibrated.profile,
    )
    for record, candidate in zip(records, listed):
        drafting = candidate.drafting
        if drafting.rows_vary:  # Lookahead, NGram: fewer rows than the most when the pool has no match
            drafting = dataclasses.replace(drafting, rows=max(1, math.ceil(record["rows_per_step"])))
        al = min(max(record["mean_acceptance_length"], 1.0), drafting.rows)
        band = calibrated.band(drafting.method)
        rows = predict(deployment, drafting, al, batch_sizes)
        curve = predict(deployment, drafting, al, CURVE_BATCHES)
        record["predicted_speedup"] = {str(p.batch): p.speedup for p in rows}
        record["predicted_interval"] = {str(p.batch): band.interval(p.speedup).to_dict() for p in rows}
        record["predicted_step_ms"] = {str(p.batch): p.method_s * 1e3 for p in rows}
        record["predicted_curve"] = {str(p.batch): p.speedup for p in curve}
        record["predicted_curve_interval"] = {str(p.batch): band.interval(p.speedup).to_dict() for p in curve}
