"""Multi-LoRA serving in the reference engine: adapters applied unmerged, three adapters and the base
in flight together, each request's greedy output equal to its adapter's merged model (PEFT's
merge_and_unload, converted and served alone); TensorRT-LLM's LoRA cache semantics and messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.lora.convert import convert_adapter
from pipeline.runtime.model.engine import Engine
from pipeline.runtime.model.lora import LoraCache, LoraWeights
from pipeline.runtime.request import GenerationRequest, LoraRequest
from pipeline.runtime.serving.scheduler import Scheduler
from tests.lora.helpers import make_adapter
from tests.runtime.fixtures import make_hf_model, write_engine

peft = pytest.importorskip("peft")

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {  # task id -> PEFT options: different ranks and target modules, so the gather pads
    11: {"r": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]},
    12: {"r": 8, "target_modules": ALL},
    13: {"r": 2, "lora_alpha": 6, "use_rslora": True, "target_modules": ["k_proj", "o_proj", "up_proj", "gate_proj"]},
}
LORA_BUILD = {
    "max_batch_size": 32,
    "plugin_config": {"tokens_per_block": 32, "paged_kv_cache": True, "lora_plugin": "float32"},
    "lora_config": {
        "max_lora_rank": 8,
        "lora_target_modules": ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate"],
    },
}
PROMPTS = [[1, 5, 9, 13, 2, 7], [3, 4], [40, 41, 42, 43, 44, 45, 46, 47], [8, 8, 8], [20, 30, 40, 50, 60]]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def fleet(module_tmp):
    """The base engine with the LoRA plugin, the adapters in the runtime format, and each adapter's
    merged engine (PEFT's merge_and_unload saved, then converted like any checkpoint)."""
    from transformers import LlamaForCausalLM

    root = module_tmp("lora")
    hf = make_hf_model(root / "hf")
    base = LlamaForCausalLM.from_pretrained(hf).eval()
    runtime, merged = {}, {}
    for task_id, options in ADAPTERS.items():
        peft_model = make_adapter(base, root / f"adapter-{task_id}", seed=task_id, **options)
        peft_model.merge_and_unload().save_pretrained(root / f"merged-{task_id}")
        merged[task_id] = Engine.load(write_engine(root / f"merged-{task_id}", root / f"engine-merged-{task_id}"))
        runtime[task_id] = convert_adapter(root / f"adapter-{task_id}")
    shared = Engine.load(write_engine(hf, root / "engine-lora", **LORA_BUILD))
    plain = Engine.load(write_engine(hf, root / "engine-plain"))
    return shared, plain, runtime, merged


def run(scheduler: Scheduler, requests: list[GenerationRequest]) -> dict[str, object]:
    out: dict[str, object] = {}

    def sink(o, rid):
        if o.finished:
            out[rid] = o.error if o.error else o.tokens

    for request in requests:
        scheduler.submit(request, lambda o, rid=request.request_id: sink(o, rid))
    scheduler.run_until_idle()
    return out


def request(rid: str, prompt: list[int], lora: LoraRequest | None) -> GenerationRequest:
    return GenerationRequest(rid, tuple(prompt), NEW_TOKENS, exclude_input_in_output=True, lora=lora)


def alone(engine: Engine, prompt: list[int]) -> list[int]:
    out = run(Scheduler(engine), [request("x", prompt, None)])
    return out["x"]  # type: ignore[return-value]


def test_mixed_batch_equals_each_merged_model(fleet):
    shared, plain, runtime, merged = fleet
    steps: list[int] = []
    scheduler = Scheduler(shared, on_step=lambda stats: steps.append(stats.batch_size))
    requests, expected = [], {}
    for i, prompt in enumerate(PROMPTS):
        for task_id in (None, *ADAPTERS):  # every prompt through the base and the three adapters
            rid = f"{i}-{task_id}"
            lora = None
            if task_id is not None:  # the first request of a task id brings its weights, the rest the id
                first = not any(r.lora and r.lora.task_id == task_id for r in requests)
                w = runtime[task_id]
                lora = LoraRequest(task_id, w.weights, w.config) if first else LoraRequest(task_id)
            requests.append(request(rid, prompt, lora))
            expected[rid] = alone(plain if task_id is None else merged[task_id], prompt)
    got = run(scheduler, requests)
    assert got == expected
    assert max(steps) == len(requests)  # all 20 requests (4 models x 5 prompts) shared every step
    # The adapters do change the text: otherwise equality would prove nothing.
    for task_id in ADAPTERS:
        assert any(expected[f"{i}-{task_id}"] != expected[f"{i}-None"] for i in range(len(PROMPTS)))


def test_unknown_task_id_gets_tensorrt_llms_error(fleet):
    shared, *_ = fleet
    got = run(Scheduler(shared), [request("a", [1, 2, 3], LoraRequest(99))])
    assert got == {"a": "LoRA task 99 not found in cache. Please send LoRA weights with request"}


def test_request_checks_have_tensorrt_llms_messages(fleet):
    shared, _, runtime, _ = fleet
    w = runtime[12]
    over_rank = w.config.copy()
    over_rank[0, 0, 2] = 16  # TensorRT-LLM checks the row's length first: give it room for rank 16
    wide = np.pad(w.weights, ((0, 0), (0, 0), (0, 16 * (64 + 64))))
    bad_layer = w.config.copy()
    bad_layer[0, 0, 1] = 5
    cases = {
        "rank": (
            LoraRequest(1, wide, over_rank),
            "Invalid low_rank (16). low_rank must be smaller than mMaxLowRank (8)",
        ),
        "layer": (LoraRequest(2, w.weights, bad_layer), "Expected layerId to be in the range [0, numModelLayers)"),
        "pair": (
            LoraRequest(3, w.weights, None),
            "Request for LoRA inference must have both lora_weights and lora_keys",
        ),
        "short": (LoraRequest(4, w.weights[:, :, :100], w.config), "lora_weights has to few values for attn_q"),
    }
    got = run(Scheduler(shared), [request(k, [1, 2], lora) for k, (lora, _) in cases.items()])
    assert got == {k: message for k, (_, message) in cases.items()}


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 65504.0])
def test_request_weights_with_nan_inf_or_float16_overflow_are_refused_naming_the_row(fleet, value):
    """TensorRT-LLM serves such weights (the answers come out empty); a tenant's corrupt adapter is refused
    in one line naming its row, layer and module, and the other requests of the batch go on."""
    shared, _, runtime, _ = fleet
    w = runtime[12]
    corrupt = w.weights.copy()
    corrupt[0, 1, 3] = value
    got = run(
        Scheduler(shared), [request("bad", [1, 2], LoraRequest(5, corrupt, w.config)), request("ok", [1, 2], None)]
    )
    message = got["bad"]
    assert isinstance(message, str) and message.startswith(f"lora_weights row 1 (layer {w.config[0, 1, 1]}, ")
    assert "lora_A" in message and "corrupt" in message  # column 3 of the row lies in its lora_A
    assert isinstance(got["ok"], list) and got["ok"]  # the other request of the batch was served


def test_plain_engine_refuses_lora_requests(fleet):
    _, plain, runtime, _ = fleet
    w = runtime[11]
    got = run(Scheduler(plain), [request("a", [1, 2], LoraRequest(11, w.weights, w.config))])
    assert "built without the LoRA plugin" in str(got["a"])


def test_cache_evicts_least_recently_used_done_tasks(fleet):
    shared, _, runtime, _ = fleet
    model, settings = shared.config.model, shared.lora
    parsed = {t: LoraWeights.parse(t, r.weights, r.config, model, settings) for t, r in runtime.items()}
    cache = LoraCache(capacity_bytes=parsed[11].nbytes + parsed[12].nbytes)
    cache.acquire(11, parsed[11])
    cache.put(parsed[12])
    cache.release(11)
    cache.acquire(12)  # 12 in flight; 11 done and least recently used
    cache.put(parsed[13])  # needs room: 11 goes, 12 stays
    assert 11 not in cache and 12 in cache and 13 in cache
    with pytest.raises(InputError, match="LoRA task 11 not found in cache"):
        cache.acquire(11)
    small = LoraCache(capacity_bytes=parsed[12].nbytes)
    small.acquire(12, parsed[12])  # in flight: cannot be evicted
    with pytest.raises(
        InputError,
        match=r"PEFT Cache is full. Could not store taskId=11 \(Cache is full. There are no done tasks to evict\)",
    ):
        small.put(parsed[11])


def test_prefetched_fine_tunes_survive_a_flood_of_client_adapters(fleet):
    """The deployed fine-tunes (prefetched, pinned) stay servable whatever clients send: a flood of new
    task ids evicts only client-sent adapters; with client adapters off, a new task id is refused."""
    shared, _, runtime, _ = fleet
    model, settings = shared.config.model, shared.lora
    parsed = {t: LoraWeights.parse(t, r.weights, r.config, model, settings) for t, r in runtime.items()}
    cache = LoraCache(capacity_bytes=parsed[11].nbytes + parsed[12].nbytes)
    cache.put(parsed[11], pinned=True)  # as prefetch() stores a deployed fine-tune
    for task in range(100, 300):  # ~200 requests, each with a throwaway adapter of its own
        throwaway = LoraWeights.parse(task, runtime[12].weights, runtime[12].config, model, settings)
        cache.release(cache.acquire(task, throwaway).task_id)
    assert 11 in cache and cache.acquire(11) is parsed[11]
    closed = LoraCache(capacity_bytes=10 * parsed[11].nbytes, client_adapters=False)
    closed.put(parsed[11], pinned=True)
    with pytest.raises(InputError, match="LoRA task 12 is not one of this server's fine-tunes"):
        closed.acquire(12, parsed[12])
    assert closed.acquire(11, parsed[11]) is parsed[11]  # its own id with weights: the cached ones, as TensorRT-LLM
    # An unknown id alone: TensorRT-LLM's words, and what this server does take.
    with pytest.raises(
        InputError, match=r"not found in cache\. .* \(this server takes none from clients; its fine-tunes: 11\)"
    ):
        closed.acquire(13)


def test_converted_layout_is_hf_lora_converts(tmp_path):
    """Rows are (module id, layer, r), A [r, in] then scale * B [out, r] flattened (hf_lora_convert.py)."""
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(make_hf_model(tmp_path / "hf")).eval()
    peft_model = make_adapter(base, tmp_path / "a", seed=3, r=4, lora_alpha=8, target_modules=["v_proj", "gate_proj"])
    lora = convert_adapter(tmp_path / "a")
    assert lora.config.tolist() == [[[3, 0, 4], [5, 0, 4], [3, 1, 4], [5, 1, 4]]]  # attn_v, mlp_h_to_4h per layer
    state = peft_model.state_dict()
    a = state["base_model.model.model.layers.1.mlp.gate_proj.lora_A.default.weight"]
    b = state["base_model.model.model.layers.1.mlp.gate_proj.lora_B.default.weight"]
    row = lora.weights[0, 3]
    np.testing.assert_array_equal(row[: a.numel()], a.flatten().numpy())
    np.testing.assert_allclose(row[a.numel() : a.numel() + b.numel()], (b * 2.0).flatten().numpy(), rtol=1e-6)
    assert lora.weights.shape == (1, 4, 4 * 64 + 4 * 128)  # gate_proj's row is the longest; v_proj's is padded


def test_prefetch_dir_loads_task_folders_like_tensorrt_llm(fleet, tmp_path):
    """<dir>/<task id>/model.lora_{weights,config}.npy; folders not named by digits are skipped with
    TensorRT-LLM's warning; the prefetched adapters answer requests that send the id alone."""
    from pipeline.runtime.model.lora import prefetch

    shared, _, runtime, merged = fleet
    runtime[11].save(tmp_path / "11")
    runtime[12].save(tmp_path / "code-ft")
    cache = LoraCache(capacity_bytes=1 << 30)
    loaded, warnings = prefetch(cache, tmp_path, shared.config.model, shared.lora)
    assert loaded == [11] and 11 in cache
    assert warnings == ["lora task name code-ft is invalid, skipping to load lora weight from this folder."]
    got = run(Scheduler(shared, lora_cache=cache), [request("a", PROMPTS[0], LoraRequest(11))])
    assert got == {"a": alone(merged[11], PROMPTS[0])}


def test_triton_inputs_become_lora_requests():
    from pipeline.runtime.triton.io import BackendParams, parse_request

    base = {"input_ids": np.array([[1, 2, 3]], np.int32), "request_output_len": np.array([[4]], np.int32)}
    weights, config = np.ones((1, 2, 8), np.float16), np.array([[[1, 0, 1], [3, 0, 1]]], np.int32)

    def parse(**tensors):
        values = {**base, **tensors}
        return parse_request(values.get, "r", BackendParams(engine_dir=Path(".")))

    assert parse().lora is None
    assert parse(lora_task_id=np.array([[7]], np.uint64)).lora.task_id == 7
    sent = parse(lora_task_id=np.array([[7]], np.uint64), lora_weights=weights[0], lora_config=config).lora
    assert sent.weights.shape == (1, 2, 8) and sent.config.shape == (1, 2, 3)  # batch of one restored
    with pytest.raises(InputError, match="lora_weights/lora_config without lora_task_id: lora_task_id must be set"):
        parse(lora_weights=weights, lora_config=config)
    with pytest.raises(InputError, match="must have both lora_weights and lora_keys"):
        parse(lora_task_id=np.array([[7]], np.uint64), lora_weights=weights)
