"""Load generator: N concurrent streaming clients, bounded in request count and in time.

Latency definitions (per token, because a speculative step delivers several tokens at once):

* time to first token (TTFT): request sent -> first response carrying a token;
* inter-token latency (ITL): each response after the first spreads its gap since the previous
  response evenly over the tokens it carries, so a step accepting 3 tokens after 30 ms counts
  as three 10 ms tokens;
* tokens/s: all output tokens / wall time from the first send to the last answer;
* batch mix: the share of decode steps by how many requests were decoding at once. The concurrency
  is only the most there can be: a request decodes from its first response to its last, and a slot
  is empty while its next request is sent and prefilled, or once its last request is done while
  others still decode (:func:`batch_mix`). A cost model that prices the run prices it at this mix.

Several models (``models``: e.g. every fine-tune of a LoRA fleet by its own name) share the load:
request i goes to ``models[i % len(models)]``, so each gets the same number of requests, and the
summary has their figures apart (``per_model``) beside the total.
"""

from __future__ import annotations

import json
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.client.stream import ClientError, GenerationRequest, TritonClient
from pipeline.errors import InputError

MAX_ERRORS_KEPT = 5


@dataclass
class RequestRecord:
    index: int
    started: float  # seconds since the run began
    ok: bool = False
    error: str | None = None
    tokens: int = 0
    ttft: float | None = None
    total: float | None = None
    steps: list[tuple[float, int]] = field(default_factory=list)  # (seconds since send, tokens)
    perf: dict[str, float] = field(default_factory=dict)
    model: str = ""  # the model name it was sent to


@dataclass
class LoadRun:
    concurrency: int
    wall_seconds: float
    records: list[RequestRecord]


def load_prompts(path: Path) -> list[str]:
    """Plain text (one prompt per non-empty line), JSONL ({"prompt": ...} or {"text": ...}), or a JSON list."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read prompts ({exc.strerror})") from None
    if Path(path).suffix in (".json", ".jsonl"):
        try:
            items = (
                json.loads(text)
                if Path(path).suffix == ".json"
                else [json.loads(line) for line in text.splitlines() if line.strip()]
            )
        except ValueError as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from None
        prompts = [item if isinstance(item, str) else str(item.get("prompt", item.get("text", ""))) for item in items]
    else:
        prompts = text.splitlines()
    prompts = [prompt for prompt in prompts if prompt.strip()]
    if not prompts:
        raise InputError(f"{path}: no prompts")
    return prompts


def run_load(
    url: str,
    models: str | Sequence[str],
    prompts: list[str],
    *,
    concurrency: int,
    requests: int,
    make_request: Callable[[str], GenerationRequest],
    time_limit: float = 600.0,
) -> LoadRun:
    """``requests`` requests over ``concurrency`` clients, prompts and ``models`` taken round-robin; stops at
    the time limit. ``url`` ``http://HOST:PORT``: an OpenAI-compatible server (``/v1/completions``)."""
    if concurrency < 1 or requests < 1:
        raise InputError("--concurrency and --requests must be >= 1")
    names = [models] if isinstance(models, str) else list(models)
    if not names or any(not name for name in names):
        raise InputError("give at least one model name (--model NAME, or --models A,B,C)")
    openai = url.startswith(("http://", "https://"))
    records: list[RequestRecord] = []
    lock = threading.Lock()
    start = time.perf_counter()
    deadline = time.monotonic() + time_limit

    def worker() -> None:
        with ExitStack() as stack:
            clients: dict[str, TritonClient] = {}  # one stream per model this worker has asked
            while True:
                with lock:
                    if len(records) >= requests or time.monotonic() >= deadline:
                        return
                    index = len(records)
                    record = RequestRecord(index, time.perf_counter() - start, model=names[index % len(names)])
                    records.append(record)
                request = make_request(prompts[(record.index // len(names)) % len(prompts)])
                if openai:  # an OpenAI-compatible server: one whole answer per request
                    _send_openai(url, record, request, max(1.0, deadline - time.monotonic()))
                    continue
                if record.model not in clients:
                    clients[record.model] = stack.enter_context(TritonClient(url, record.model))
                try:
                    result = clients[record.model].generate(request, timeout=max(1.0, deadline - time.monotonic()))
                except ClientError as exc:
                    record.error = str(exc)
                    continue
                record.ok, record.tokens, record.perf = True, result.tokens, dict(result.perf)
                record.ttft, record.total = result.first_token_seconds, result.total_seconds
                record.steps = [(piece.seconds, piece.tokens) for piece in result.pieces if piece.tokens]

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return LoadRun(concurrency, time.perf_counter() - start, records)


def _send_openai(url: str, record: RequestRecord, request: GenerationRequest, timeout: float) -> None:
    """One completion from an OpenAI-compatible server (trtllm-serve or its stand-in), streamed: its first
    token and each decode step's chunk are timed as they arrive (:func:`openai_steps`)."""
    from pipeline.client.openai_http import complete

    try:
        answer = complete(
            url,
            record.model,
            request.prompt,
            chat=False,
            system=None,
            timeout=timeout,
            max_tokens=request.max_tokens,
            temperature=0.0 if request.temperature is None else request.temperature,
            top_p=request.top_p,
            seed=request.seed,
        )
    except ClientError as exc:
        record.error = str(exc)
        return
    record.ok, record.tokens = True, answer.completion_tokens
    record.ttft, record.total = answer.first_token_seconds or answer.seconds, answer.seconds
    record.steps = openai_steps(answer.deltas, answer.completion_tokens)


def openai_steps(deltas: tuple[float, ...], tokens: int) -> list[tuple[float, int]]:
    """(seconds, tokens) per streamed chunk of an OpenAI-compatible answer, one chunk a decode step: its
    chunks carry text, not token counts, so the first (the prefill's token) counts 1 and the answer's
    other tokens are spread over the later chunks, the earlier ones taking the remainder. Mean
    inter-token latency is exact; its percentiles are over these spread counts.

        >>> openai_steps((0.5, 0.7, 0.8), 6)
        [(0.5, 1), (0.7, 3), (0.8, 2)]
    """
    if not deltas:
        return []
    if len(deltas) == 1:
        return [(deltas[0], tokens)]
    later = len(deltas) - 1
    share, extra = divmod(max(tokens - 1, 0), later)
    return [(deltas[0], 1)] + [(t, share + (i < extra)) for i, t in enumerate(deltas[1:])]


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p90/p99/mean in milliseconds (``scale``); None when there is nothing to measure."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    array = np.asarray(values, dtype=float) * scale
    return {
        "p50": float(np.percentile(array, 50)),
        "p90": float(np.percentile(array, 90)),
        "p99": float(np.percentile(array, 99)),
        "mean": float(array.mean()),
    }


def inter_token_latencies(record: RequestRecord) -> list[float]:
    gaps = []
    for (before, _), (after, count) in zip(record.steps, record.steps[1:]):
        if count:
            gaps.extend([(after - before) / count] * count)
    return gaps


def batch_mix(records: Sequence[RequestRecord]) -> dict[int, float]:
    """The share of the decode steps that ran with each number of requests decoding, from the streamed
    responses: a request decodes from its first response (its prefill's token) to its last, each later
    response is one of its decode steps, and a step that k requests shared answered each of them, so
    it counts 1/k for each. A response is taken to share its step with every request decoding at its
    arrival, within a quarter of the run's median gap between responses (the step's responses reach
    the clients a little apart). Empty when no request streamed more than one response.

    Request A answers at 0 s (its prefill), then 1, 2, 3, 4 and 5 s; request B at 0, then 1, 2 and 3 s:
    the steps at 1, 2 and 3 s had both (6 responses of 1/2: 3 steps), those at 4 and 5 s A alone (2
    steps), so the mix is {1: 0.4, 2: 0.6}, a mean of 1.6 requests a step at concurrency 2.
    """
    streamed = [r for r in records if r.ok and len(r.steps) > 1]
    if not streamed:
        return {}
    gaps = sorted(b - a for r in streamed for (a, _), (b, _) in zip(r.steps, r.steps[1:]))
    slack = gaps[len(gaps) // 2] / 4
    firsts = sorted(r.started + r.steps[0][0] - slack for r in streamed)
    lasts = sorted(r.started + r.steps[-1][0] + slack for r in streamed)
    steps: dict[int, float] = {}
    for r in streamed:
        for seconds, _ in r.steps[1:]:
            at = r.started + seconds
            k = bisect_right(firsts, at) - bisect_left(lasts, at)  # begun by then, less those ended before
            steps[k] = steps.get(k, 0.0) + 1 / k
    total = sum(steps.values())
    return {k: n / total for k, n in sorted(steps.items())}


def summarize(run: LoadRun) -> dict[str, Any]:
    """The run's figures; with several models, also ``per_model``: each one's requests, tokens, tokens/s
    (its tokens over the run's wall time: the models' figures add up to the total) and latencies."""
    body = _figures(run, run.records)
    models = sorted({r.model for r in run.records})
    if len(models) > 1:
        body["per_model"] = {m: _figures(run, [r for r in run.records if r.model == m]) for m in models}
    return body


def _figures(run: LoadRun, records: list[RequestRecord]) -> dict[str, Any]:
    done = [r for r in records if r.ok]
    tokens = sum(r.tokens for r in done)
    accepted = sum(r.perf.get("total_accepted_draft_tokens", 0) for r in done)
    drafted = sum(r.perf.get("total_draft_tokens", 0) for r in done)
    steps = sum(r.tokens - 1 for r in done if r.tokens > 1) - accepted  # see GenerationResult.mean_acceptance_length
    has_perf = any("total_draft_tokens" in r.perf for r in done)
    return {
        "concurrency": run.concurrency,
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "errors": [r.error for r in records if r.error][:MAX_ERRORS_KEPT],
        "wall_seconds": run.wall_seconds,
        "output_tokens": tokens,
        "tokens_per_second": tokens / run.wall_seconds if run.wall_seconds > 0 else 0.0,
        "requests_per_second": len(done) / run.wall_seconds if run.wall_seconds > 0 else 0.0,
        "batch_mix": {str(k): share for k, share in batch_mix(records).items()},
        "ttft_ms": percentiles([r.ttft for r in done if r.ttft is not None]),
        "itl_ms": percentiles([gap for r in done for gap in inter_token_latencies(r)]),
        "latency_ms": percentiles([r.total for r in done if r.total is not None]),
        "acceptance": {
            "accepted_draft_tokens": int(accepted),
            "draft_tokens": int(drafted),
            "acceptance_rate": accepted / drafted if has_perf and drafted else None,
            "mean_acceptance_length": (
                sum(r.tokens - 1 for r in done if r.tokens > 1) / steps if has_perf and steps > 0 else None
            ),
        },
    }


def write_report(run: LoadRun, summary: dict[str, Any], out: Path, extra: dict[str, Any] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    body = dict(extra or {}) | summary | {"records": [asdict(record) for record in run.records]}
    path = out / "bench.json"
    path.write_text(json.dumps(body, indent=2) + "\n")
    plot(run, summary, out / "bench.png")
    return path


def plot(run: LoadRun, summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt

    done = [r for r in run.records if r.ok]
    fig, (ttft, itl, timeline) = plt.subplots(1, 3, figsize=(15, 4))
    ttft.hist([r.ttft * 1000 for r in done if r.ttft is not None], bins=20, color="tab:blue")
    ttft.set(title="time to first token", xlabel="ms", ylabel="requests")
    itl.hist([gap * 1000 for r in done for gap in inter_token_latencies(r)], bins=30, color="tab:orange")
    itl.set(title="inter-token latency", xlabel="ms", ylabel="tokens")
    events = sorted((r.started + at, count) for r in done for at, count in r.steps)
    if events:
        times, counts = zip(*events)
        timeline.plot(times, np.cumsum(counts), color="tab:green")
    timeline.set(
        title=f"output tokens ({summary['tokens_per_second']:.1f} tok/s, concurrency {run.concurrency})",
        xlabel="s",
        ylabel="tokens",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
