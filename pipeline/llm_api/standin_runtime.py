"""The CPU stand-in for TensorRT-LLM's LLM API: what ``trtllm-serve`` would load, served by the
reference backend (pipeline/runtime/) on this host.

The GPU deployment's files are read as the GPU reads them: the checkpoint stage's Hugging Face folder
(``engines/<v>/checkpoint``), the lora stage's PEFT folders (``engines/<v>/lora/<task id>``) and the
plan's LLM API arguments. The reference backend serves TensorRT-LLM checkpoints, so the folder is
converted here, in a scratch folder, by the convert stage's own body, and each adapter into the
runtime's LoRA format; nothing is written next to the build.

The PyTorch backend's rules, not the engine flow's, govern the scheduler: a request's adapter is
applied to the target while it speculates (``Scheduler(target="pytorch")``), with one shared drafter
(NGram drafts from the text; its pool is the same whatever the adapter). An EAGLE-3 variant drafts
with the drafter deployed beside the model (``checkpoint/eagle3``).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.evaluation.stage import load_engine
from pipeline.llm_api.deployment import DRAFTER_FOLDER, lora_members
from pipeline.lora.convert import convert_adapter
from pipeline.lora.rules import ADAPTER_NUMPY_DTYPE
from pipeline.plan.types import StagePlan, VariantPlan, jsonable
from pipeline.runtime.model.lora import LoraCache, prefetch
from pipeline.runtime.request import FinishReason, GenerationRequest, LoraRequest, StepOutput
from pipeline.runtime.serving.metrics import SpecDecodingStats
from pipeline.runtime.serving.scheduler import Scheduler
from pipeline.runtime.spec_decode.factory import MethodSettings, make_method
from pipeline.stages import convert


@dataclass
class ModelStats:
    """What one served model name's finished requests drafted and accepted (the stand-in's /metrics)."""

    requests: int = 0
    completion_tokens: int = 0
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)

    def to_dict(self) -> dict[str, Any]:
        steps = self.spec.verification_steps
        return {
            "requests": self.requests,
            "completion_tokens": self.completion_tokens,
            "draft_tokens": self.spec.draft_tokens,
            "accepted_draft_tokens": self.spec.accepted_tokens,
            "acceptance_rate": self.spec.accepted_tokens / self.spec.draft_tokens if self.spec.draft_tokens else 0.0,
            # tokens per verification step, the accepted drafts plus the target's own token
            "acceptance_length": 1 + self.spec.accepted_tokens / steps if steps else 1.0,
        }


@dataclass
class StandinRuntime:
    """One served variant: its scheduler, tokenizer, and the model names it answers to."""

    variant: VariantPlan
    scheduler: Scheduler
    tokenizer: Any  # transformers' tokenizer of the checkpoint
    adapters: dict[str, int | None]  # served model name -> lora task id (None: the base)
    stats: dict[str, ModelStats]
    _ids: itertools.count = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def method(self) -> str:
        return self.scheduler.method.name

    def submit(self, model: str, request: GenerationRequest) -> Future[StepOutput]:
        """Queue ``request`` for served model ``model``; the future gets its last response."""
        request = self._for(model, request)
        done: Future[StepOutput] = Future()

        def sink(output: StepOutput) -> None:
            if output.finished:
                if output.error is None:
                    self._record(model, output)
                done.set_result(output)

        self.scheduler.submit(request, sink)
        return done

    def stream(self, model: str, request: GenerationRequest, deliver: Callable[[StepOutput], None]) -> None:
        """Queue ``request`` for ``model`` streamed (Triton's decoupled mode): ``deliver`` gets each
        verification step's accepted tokens as the scheduler accepts them, on the scheduler's thread,
        the last response ``finished``. A ``deliver`` that raises cancels the request (the client is
        gone), as does :meth:`cancel`."""
        request = dataclasses.replace(self._for(model, request), streaming=True)
        generated = 0

        def sink(output: StepOutput) -> None:
            nonlocal generated
            generated += len(output.tokens)
            if output.finished and output.error is None and output.reason != FinishReason.CANCELLED:
                self._record(model, output, generated)
            deliver(output)

        self.scheduler.submit(request, sink)

    def _for(self, model: str, request: GenerationRequest) -> GenerationRequest:
        """``request`` as served model ``model`` runs it: a fine-tune's adapter applied (its task id)."""
        task_id = self.adapters[model]
        return request if task_id is None else dataclasses.replace(request, lora=LoraRequest(task_id))

    def cancel(self, request_id: str) -> bool:
        """Stop a queued or running request (a streaming client that went away)."""
        return self.scheduler.cancel(request_id)

    def request_id(self) -> str:
        with self._lock:
            return f"cmpl-{next(self._ids)}"

    def _record(self, model: str, output: StepOutput, generated: int | None = None) -> None:
        with self._lock:
            stats = self.stats.setdefault(model, ModelStats())
            stats.requests += 1
            stats.completion_tokens += len(output.tokens) if generated is None else generated
            metrics = output.metrics
            stats.spec.draft_tokens += metrics.total_draft_tokens
            stats.spec.accepted_tokens += metrics.total_accepted_draft_tokens
            stats.spec.verification_steps += max(metrics.forward_steps - 1, 0)

    def stop(self) -> None:
        self.scheduler.stop()


def served_names(variant: VariantPlan) -> dict[str, int | None]:
    """The model names the deployment answers to: the variant (the base) and its LoRA group's fine-tunes."""
    members = lora_members(variant.stage("package"))
    return {variant.name: None, **{name: task for name, task in sorted(members.items()) if name != variant.name}}


def load_standin(variant: VariantPlan, scratch: Path, say: Any = print) -> StandinRuntime:
    """Load the variant's built deployment into the reference backend (``scratch``: an empty folder)."""
    from transformers import AutoTokenizer

    checkpoint = variant.stage("checkpoint").output
    converted = scratch / "checkpoint"
    converted.mkdir()
    params = {
        "tp": variant.tp,
        "pp": variant.pp,
        "dtype": variant.build.dtype,
        "speculative": jsonable(dataclasses.asdict(variant.speculative)),
        "kv_cache_fp8": variant.quant.kv_cache_fp8,
    }
    say(f"[{variant.name}] stand-in: converting {checkpoint} for the reference backend")
    convert.run(variant, StagePlan("convert", converted, {"model": checkpoint}, params), converted)
    engine = load_engine(variant, converted, scratch)
    spec = variant.speculative
    drafter = checkpoint / DRAFTER_FOLDER if spec.eagle3 is not None else None  # deployed beside the model
    settings = MethodSettings(ngram=spec.ngram, eagle3=spec.eagle3, eagle3_drafter=drafter)
    method, warnings = make_method(engine, settings, spec.method)
    for warning in warnings:
        say(f"[{variant.name}] stand-in: {warning}")
    cache = None
    if engine.lora is not None:
        adapters = scratch / "lora"
        dtype = ADAPTER_NUMPY_DTYPE[variant.build.dtype]
        for folder in sorted(variant.stage("lora").output.iterdir()):
            if folder.is_dir() and folder.name.isdigit():
                convert_adapter(folder, dtype).save(adapters / folder.name)
        cache = LoraCache(sum(f.stat().st_size for f in adapters.rglob("*.npy")) * 2 + (1 << 20))
        loaded, warnings = prefetch(cache, adapters, engine.config.model, engine.lora)
        say(f"[{variant.name}] stand-in: {len(loaded)} adapters loaded")
    scheduler = Scheduler(engine, method, lora_cache=cache, target=variant.target)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    scheduler.start()
    return StandinRuntime(variant, scheduler, tokenizer, served_names(variant), {})
