"""Conformance: every input and output of the contract table against a real tritonserver on the reference backend.

For each method (none, medusa, eagle, lookahead) a tiny Llama (the tiny word tokenizer's vocabulary) goes
through the pipeline's stages; its repository is served decoupled and, from the same engine, not
decoupled: one server per configuration, one at a time. The client (tests/triton/conformance.py) is
written from NVIDIA's documented request format and driven by pipeline/triton/contract.py, so a tensor
added to the table is sent and checked here without editing this file:

* every input of ``ensemble``, ``tensorrt_llm`` and ``tensorrt_llm_bls`` sent at once, at TensorRT-LLM's
  default, with every ``return_*`` flag on and every output requested, answers exactly what a request
  of the required inputs alone answers, streaming and not, and returns every output of the table with
  its declared type and rank (but the ones TensorRT-LLM sends only in cases that cannot arise here);
* ``preprocessing`` and ``postprocessing`` likewise with every input;
* the inputs the reference backend refuses get a one-line error naming the tensor, and the server
  answers the next request;
* the semantics behind the tensors: beam search (``none`` engines are built with max_beam_width 2) or
  TensorRT-LLM's refusal, context logits (``none`` engines are built with gather_context_logits) or the
  refusal, batch_index / sequence_index of split requests, stop words.

NVIDIA's own ``inflight_batcher_llm_client.py`` and ``end_to_end_grpc_client.py`` with ``--beam-width 2``
run against the ``none`` servers too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conformance import DEFAULTS, NUMPY, VARIABLES, Reply, default_value, infer, tensors
from triton_fixtures import (
    NVIDIA_CLIENTS,
    SPECIALS,
    WORDS,
    build_with_stages,
    plan_spec,
    run_client,
    serve_repository,
    tiny_llama,
)

from pipeline.triton import contract
from pipeline.triton.launch_cpu import reference_backend_available
from pipeline.triton.repository import emit_repository

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.skipif(not reference_backend_available(), reason="the reference backend is not in this checkout"),
]
PROMPT = "the quick brown fox"
TOKENS = 6
END_ID, PAD_ID = 2, 1  # the tiny tokenizer's </s> and <pad>
VOCAB = len(SPECIALS) + len(WORDS)
BUILD = "build: {max_batch_size: 4, max_input_len: 32, max_seq_len: 128, max_num_tokens: 256%s}\n"
METHOD_SPEC = {
    "none": "speculative: {method: none}\n" + BUILD % ", max_beam_width: 2, extra_flags: {gather_context_logits: true}",
    "lookahead": "speculative: {method: lookahead, lookahead: {window: 3, ngram: 2, verification_set: 2}}\n"
    + BUILD % "",
    "medusa": "heads: {medusa: {path: HEADS/medusa, num_heads: 3}}\n"
    "speculative: {method: medusa, medusa: {choices: cpu_small_10_depth_3}}\n" + BUILD % "",
    "eagle": "heads: {eagle: {path: HEADS/eagle}}\n"
    "speculative: {method: eagle, eagle: {choices: cpu_small_10_depth_3}}\n" + BUILD % "",
}
SERVED = ("ensemble", "tensorrt_llm", "tensorrt_llm_bls")
# What the reference backend refuses when a request sets it (LoRA, prompt tables, multimodal, draft-target,
# guided decoding): (model, tensor) -> a value that sets it.
REFUSED = {
    ("tensorrt_llm", "draft_input_ids"): np.array([5, 6], np.int32),
    ("tensorrt_llm", "prompt_embedding_table"): np.ones((2, 64), np.float16),
    # LoRA: these engines have no LoRA plugin (tests/lora serves one that has)
    ("tensorrt_llm", "lora_task_id"): np.array([[3]], np.uint64),
    ("tensorrt_llm", "lora_weights"): np.ones((1, 8), np.float32),  # float32 engines declare FP32
    ("tensorrt_llm", "lora_config"): np.ones((1, 3), np.int32),
    ("tensorrt_llm", "encoder_input_features"): np.ones((2, 4), np.float16),
    ("tensorrt_llm", "guided_decoding_guide"): np.array([b"{}"], object),
}
# Outputs TensorRT-LLM sends only in a case these requests never are: disaggregated serving.
NEVER_HERE = {"context_phase_params"}
# NVIDIA's postprocessing returns one string per sequence, flat ([num_beams], no batch dim): clients
# read text_output[0].
FLAT = {"text_output", "OUTPUT"}
# preprocessing's multimodal outputs: declared so the config matches NVIDIA's, never produced for text.
MULTIMODAL = {
    "PIXEL_VALUES",
    "ASPECT_RATIO_IDS",
    "ASPECT_RATIO_MASK",
    "CROSS_ATTENTION_MASK",
    "IMAGE_SIZES",
    "IS_VIDEO_INPUT",
    "ATTENTION_MASK",
    "IMAGE_GRID_THW",
    "VISION_INPUT_ID",
}


def _heads(root: Path, model: Path) -> Path:
    """Medusa heads and an EAGLE drafter fitted to the tiny model (the runtime tests' builders)."""
    import json

    from pipeline.runtime.model.engine import Engine
    from tests.runtime import fixtures as rf

    engine = Engine.load(rf.write_engine(model, root / "data-engine"))
    corpus = rf.make_corpus(engine, rf.random_prompts(16, VOCAB, seed=3), 24)
    rf.write_medusa_heads(root / "heads" / "medusa", corpus)
    rf.write_eagle_drafter(root / "heads" / "eagle", json.loads((model / "config.json").read_text()), corpus)
    return root / "heads"


@pytest.fixture(scope="module")
def tiny(module_tmp) -> tuple[Path, Path]:
    root = module_tmp("conformance")
    model = tiny_llama(root / "model")
    return model, _heads(root, model)


@pytest.fixture(scope="module")
def repositories(tiny, module_tmp) -> dict[tuple[str, bool], Path]:
    model, heads = tiny
    repos = {}
    for method, text in METHOD_SPEC.items():
        folder = module_tmp(method)
        plans = {}
        for decoupled in (True, False):
            spec = folder / f"spec-{decoupled}.yaml"
            spec.write_text(
                f"name: conf-{method}\nmodel: {{path: {model}, dtype: float32}}\n"
                + text.replace("HEADS", str(heads))
                + f"serving: {{decoupled: {str(decoupled).lower()}}}\ntarget: reference\n"
            )
            plans[decoupled] = plan_spec(spec, folder / str(decoupled)).variants[0]
        repos[method, True] = build_with_stages(plans[True])
        package = plans[True].stage("package")
        emit_repository(
            plans[False],
            folder / "offline-repo",
            engine_dir=package.inputs["engine"],
            tokenizer_dir=package.inputs["tokenizer"],
        )
        repos[method, False] = folder / "offline-repo"
    return repos


CONFIGS = [(method, decoupled) for method in METHOD_SPEC for decoupled in (True, False)]


def only(predicate: Callable[[str, bool], bool]) -> Callable[[Callable], Callable]:
    """Run a test on the (method, decoupled) servers it applies to, not on every one with a skip."""

    def mark(test: Callable) -> Callable:
        test.configs = [config for config in CONFIGS if predicate(*config)]  # type: ignore[attr-defined]
        return test

    return mark


def pytest_generate_tests(metafunc):
    """Parametrize ``served`` per test: every config, or the ones its ``only`` names (module-scoped, so
    tests on the same config share one server)."""
    if "served" in metafunc.fixturenames:
        configs = getattr(metafunc.function, "configs", CONFIGS)
        ids = [f"{method}-{'decoupled' if decoupled else 'offline'}" for method, decoupled in configs]
        metafunc.parametrize("served", configs, ids=ids, indirect=True, scope="module")


@pytest.fixture(scope="module")
def served(request, repositories, module_tmp):
    method, decoupled = request.param
    repo = repositories[method, decoupled]
    log = module_tmp("logs") / f"{method}-{decoupled}.log"

    server = serve_repository(repo, log, models=(*SERVED, "preprocessing", "postprocessing"))
    try:
        yield method, decoupled, server, repo
    finally:
        server.stop()


def _prompt_ids(repo: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(repo / "preprocessing" / "tokenizer")).encode(PROMPT)


def _context(method: str, decoupled: bool, stream: bool) -> dict:
    lookahead = (3, 2, 2) if method == "lookahead" else None  # the server's (W, N, G): METHOD_SPEC
    return {"end_id": END_ID, "pad_id": PAD_ID, "vocab": VOCAB, "stream": stream, "lookahead": lookahead}


def required(model: str, ids: list[int]) -> dict[str, object]:
    """The required inputs of a model, filled for the prompt."""
    values = {
        "text_input": np.array([PROMPT.encode()], object),
        "max_tokens": np.array([TOKENS], np.int32),
        "input_ids": np.array(ids, np.int32),
        "input_lengths": np.array([len(ids)], np.int32),
        "request_output_len": np.array([TOKENS], np.int32),
    }
    declared, _ = tensors(model)
    # input_ids is optional in the table (encoder-decoder requests send encoder features instead).
    return {name: values[name] for name, t in declared.items() if not t.optional or name == "input_ids"}


def _flags(gather: bool) -> dict[str, bool]:
    names = [n for n in contract.TENSORRT_LLM_STEP_INPUTS if n.startswith("return_")]
    return {name: name != "return_context_logits" or gather for name in names}


def full_request(model: str, ids: list[int], ctx: dict, gather: bool) -> dict[str, object]:
    """Every input of the table at its default, the return flags on: a request that asks for everything."""
    declared, _ = tensors(model)
    values: dict[str, object] = {name: default_value(t, ctx) for name, t in declared.items()}
    values = {name: value for name, value in values.items() if value is not None}
    values.update(required(model, ids))
    for name, on in _flags(gather).items():
        if name in declared:
            values[name] = np.array([on])
    for name, _ in REFUSED:  # "not set": an empty tensor (zero-size free dims), which default_value gives
        assert name not in values or np.asarray(values[name]).size == 0, name
    return values


def _tokens(model: str, reply: Reply, stream: bool, prompt_len: int) -> list:
    """What a reply says: the text (ensemble, BLS) or generated ids (tensorrt_llm), streamed pieces joined."""
    assert reply.error is None, reply.error
    if model == "tensorrt_llm":
        ids = [int(t) for r in reply.responses for t in r["output_ids"][0, 0, : int(r["sequence_length"][0, 0])]]
        return ids
    texts = [r["text_output"].reshape(-1)[0] for r in reply.responses]
    return [b"".join(texts)] if stream else texts


def check_outputs(model: str, reply: Reply, absent: set[str]) -> None:
    """Every table output of ``model`` but ``absent`` is in every response, with its type and rank."""
    _, outputs = tensors(model)
    for response in reply.responses:
        missing = sorted(set(outputs) - absent - set(response))
        assert not missing, f"{model}: outputs {missing} not returned"
        for name, array in response.items():
            if name not in outputs:
                continue  # specdeploy's extensions
            want = contract.data_type(outputs[name], VARIABLES)
            assert array.dtype == NUMPY[want], (model, name, array.dtype)
            rank = len(outputs[name].dims) + (name not in FLAT)
            assert array.ndim == rank, (model, name, array.shape)


@pytest.mark.parametrize("model", SERVED)
def test_every_input_and_output(served, model):
    every_input_and_output(served, model, stream=False)


@only(lambda method, decoupled: decoupled)  # streaming needs the decoupled policy (TensorRT-LLM's rule)
@pytest.mark.parametrize("model", SERVED)
def test_every_input_and_output_streamed(served, model):
    every_input_and_output(served, model, stream=True)


def every_input_and_output(served, model: str, stream: bool) -> None:
    method, decoupled, server, repo = served
    ids = _prompt_ids(repo)
    ctx = _context(method, decoupled, stream)
    gather = method == "none"
    minimal = required(model, ids)
    stream_key = {"tensorrt_llm": "streaming"}.get(model, "stream")
    minimal[stream_key] = np.array([stream])
    minimal["exclude_input_in_output"] = np.array([True])  # the same in both: the model's parameter may differ
    _, outputs = tensors(model)
    baseline = infer(server.grpc_url, model, minimal, [], decoupled)
    everything = {**full_request(model, ids, ctx, gather), "exclude_input_in_output": np.array([True])}
    full = infer(server.grpc_url, model, everything, list(outputs), decoupled)
    assert _tokens(model, full, stream, len(ids)) == _tokens(model, baseline, stream, len(ids))
    absent = set(NEVER_HERE) | (set() if gather else {"context_logits"})
    check_outputs(model, full, absent)  # streaming too: context logits come with every response, as TensorRT-LLM
    last = full.last
    if gather:
        assert last["context_logits"].shape[-1] == VOCAB
    assert last["generation_logits"].shape[-1] == VOCAB and last["cum_log_probs"].shape[:2] == (1, 1)
    assert int(last["kv_cache_alloc_total_blocks"].reshape(-1)[0]) >= 1
    if method != "none" and model == "tensorrt_llm":
        assert int(last["total_draft_tokens"].reshape(-1)[0]) > 0 or stream


@only(lambda method, decoupled: (method, decoupled) == ("none", True))  # they do not depend on the method
def test_pre_and_postprocessing_take_every_input(served):
    method, decoupled, server, repo = served
    declared, outputs = tensors("preprocessing")
    values = {name: default_value(t, _context(method, decoupled, False)) for name, t in declared.items()}
    values = {name: value for name, value in values.items() if value is not None}
    values.update({"QUERY": np.array([PROMPT.encode()], object), "REQUEST_OUTPUT_LEN": np.array([TOKENS], np.int32)})
    reply = infer(server.grpc_url, "preprocessing", values, list(outputs), decoupled=False)
    assert reply.error is None, reply.error
    check_outputs("preprocessing", reply, MULTIMODAL)
    assert reply.last["INPUT_ID"][0].tolist() == _prompt_ids(repo)
    tokens = np.array([[_prompt_ids(repo), _prompt_ids(repo)[:2] + [PAD_ID, PAD_ID]]], np.int32)[0]
    post = {"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([tokens.shape[1], 2], np.int32)}
    reply = infer(server.grpc_url, "postprocessing", post, ["OUTPUT"], decoupled=False)
    check_outputs("postprocessing", reply, set())
    assert [t.decode().strip() for t in reply.last["OUTPUT"]] == [PROMPT, " ".join(PROMPT.split()[:2])]


def test_refused_inputs_name_the_tensor_and_the_server_carries_on(served):
    method, decoupled, server, repo = served
    ids = _prompt_ids(repo)
    baseline = infer(server.grpc_url, "tensorrt_llm", required("tensorrt_llm", ids), [], decoupled)
    for (model, name), value in REFUSED.items():
        reply = infer(server.grpc_url, model, {**required(model, ids), name: value}, [], decoupled)
        assert reply.error is not None and name in reply.error, (name, reply.error)
    if not decoupled:
        streaming = {**required("tensorrt_llm", ids), "streaming": np.array([True])}
        reply = infer(server.grpc_url, "tensorrt_llm", streaming, [], decoupled)
        assert reply.error and "decoupled mode" in reply.error
    again = infer(server.grpc_url, "tensorrt_llm", required("tensorrt_llm", ids), [], decoupled)
    assert _tokens("tensorrt_llm", again, False, 0) == _tokens("tensorrt_llm", baseline, False, 0)


def test_beam_search_and_context_logits_or_their_refusals(served):
    method, decoupled, server, repo = served
    ids = _prompt_ids(repo)
    beams = {**required("ensemble", ids), "beam_width": np.array([2], np.int32)}
    reply = infer(server.grpc_url, "ensemble", beams, ["text_output", "cum_log_probs"], decoupled)
    context = {**required("tensorrt_llm", ids), "return_context_logits": np.array([True])}
    logits = infer(server.grpc_url, "tensorrt_llm", context, ["context_logits", "output_ids"], decoupled)
    if method != "none":
        name = {"medusa": "Medusa", "eagle": "Eagle", "lookahead": "Lookahead"}[method]
        assert reply.error and f"Decoding mode is {name}, but beamWidth != 1 (2 != 1)" in reply.error
        assert logits.error and "gather_context_logits" in logits.error
        return
    assert reply.error is None, reply.error
    texts = reply.last["text_output"]
    assert texts.shape == (2,) and texts[0] != texts[1]
    two = {**required("tensorrt_llm", ids), "beam_width": np.array([2], np.int32), "return_log_probs": np.array([True])}
    cum = infer(server.grpc_url, "tensorrt_llm", two, ["cum_log_probs", "output_ids", "sequence_length"], decoupled)
    assert cum.error is None and cum.last["output_ids"].shape[:2] == (1, 2)
    assert cum.last["cum_log_probs"][0, 0] >= cum.last["cum_log_probs"][0, 1]
    assert logits.error is None and logits.last["context_logits"].shape == (1, len(ids), VOCAB)
    _beam_search_combinations(decoupled, server, ids, cum.last)


def _beam_search_combinations(decoupled: bool, server, ids: list[int], two: dict) -> None:
    """Beam search with stop words, generation logits, num_return_sequences, through the BLS, and
    context logits in every streaming response."""
    url, plain = server.grpc_url, {**required("tensorrt_llm", ids), "exclude_input_in_output": np.array([True])}
    beams = {**plain, "beam_width": np.array([2], np.int32)}
    row, with_prompt = two["output_ids"][0, 0], int(two["sequence_length"][0, 0]) > TOKENS
    first = int(row[len(ids)] if with_prompt else row[0])  # the best beam's first token
    stop = {**beams, "stop_words_list": np.array([[ids[-1], first], [2, -1]], np.int32)}
    stopped = infer(url, "tensorrt_llm", stop, ["output_ids", "sequence_length"], decoupled)
    assert stopped.error is None and stopped.last["output_ids"][0, 0, :1].tolist() == [first]
    assert int(stopped.last["sequence_length"][0, 0]) == 1  # (last prompt token, first) ended it at once
    gen = {**beams, "return_generation_logits": np.array([True])}
    logits = infer(url, "tensorrt_llm", gen, ["generation_logits", "sequence_length"], decoupled)
    assert logits.error is None and logits.last["generation_logits"].shape == (1, 2, TOKENS, VOCAB)
    one = {**beams, "num_return_sequences": np.array([1], np.int32)}
    best = infer(url, "tensorrt_llm", one, ["output_ids", "sequence_index"], decoupled)
    assert best.error is None and len(best.responses) == 1 and best.last["output_ids"].shape[:2] == (1, 1)
    bls = {**required("tensorrt_llm_bls", ids), "beam_width": np.array([2], np.int32)}
    bls["num_return_sequences"] = np.array([1], np.int32)  # NVIDIA's BLS does not pass it on: both beams
    bls["return_log_probs"] = np.array([True])
    texts = infer(url, "tensorrt_llm_bls", bls, ["text_output", "cum_log_probs"], decoupled)
    assert texts.error is None and texts.last["text_output"].shape == (2,)
    assert texts.last["cum_log_probs"].shape == (1, 2)
    if decoupled:
        streamed = {**plain, "streaming": np.array([True]), "return_context_logits": np.array([True])}
        every = infer(url, "tensorrt_llm", streamed, ["output_ids", "context_logits"], decoupled)
        assert every.error is None and len(every.responses) == TOKENS
        assert all(r["context_logits"].shape == (1, len(ids), VOCAB) for r in every.responses)


def test_split_requests_carry_batch_and_sequence_index(served):
    method, decoupled, server, repo = served
    ids = _prompt_ids(repo)
    two = {**required("ensemble", ids), "num_return_sequences": np.array([2], np.int32)}
    reply = infer(server.grpc_url, "ensemble", two, ["text_output", "sequence_index", "batch_index"], decoupled)
    if not decoupled:
        assert reply.error and "decoupled" in reply.error
        return
    assert reply.error is None, reply.error
    assert sorted(int(r["sequence_index"].reshape(-1)[0]) for r in reply.responses) == [0, 1]
    assert len({r["text_output"].reshape(-1)[0] for r in reply.responses}) == 1  # greedy: the same twice
    # A [2, L] batch straight to tensorrt_llm: one response per row, tagged (TensorRT-LLM's split).
    batch = np.array([ids, ids[:2] + [PAD_ID] * (len(ids) - 2)], np.int32)
    extra = {
        "input_ids": ("INT32", batch),
        "input_lengths": ("INT32", np.array([[len(ids)], [2]], np.int32)),
        "request_output_len": ("INT32", np.array([[TOKENS], [TOKENS]], np.int32)),
    }
    reply = infer(server.grpc_url, "tensorrt_llm", {}, ["output_ids", "batch_index"], decoupled, extra_inputs=extra)
    assert reply.error is None, reply.error
    assert sorted(int(r["batch_index"].reshape(-1)[0]) for r in reply.responses) == [0, 1]


def test_stop_words_end_the_answer(served):
    method, decoupled, server, repo = served
    ids = _prompt_ids(repo)
    plain = infer(server.grpc_url, "tensorrt_llm", required("tensorrt_llm", ids), [], decoupled)
    answer = _tokens("tensorrt_llm", plain, False, len(ids))
    word = answer[2]
    cut = answer.index(word) + 1
    stop = {**required("tensorrt_llm", ids), "stop_words_list": np.array([[word], [1]], np.int32)}
    got = _tokens("tensorrt_llm", infer(server.grpc_url, "tensorrt_llm", stop, [], decoupled), False, len(ids))
    assert got == answer[:cut]


def test_defaults_table_names_only_contract_tensors():
    names = {t.name for inputs, _ in contract.CONTRACT.values() for t in inputs}
    assert set(DEFAULTS) <= names and {name for _, name in REFUSED} <= names


# -- NVIDIA's clients with --beam-width 2 --------------------------------------------------------------------


@only(lambda method, decoupled: method == "none")  # beam search needs a method none engine
def test_nvidia_clients_get_two_beams(served, tmp_path):
    method, decoupled, server, repo = served
    if not decoupled:
        done = run_client(
            NVIDIA_CLIENTS / "inflight_batcher_llm_client.py",
            server.grpc_url,
            "--tokenizer-dir",
            str(repo / "preprocessing" / "tokenizer"),
            "--text",
            PROMPT,
            "--request-output-len",
            str(TOKENS),
            "--beam-width",
            "2",
            "--return-log-probs",
            "--return-generation-logits",
            "--exclude-input-in-output",
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        beams = re.findall(r"Output beam (\d): (.*)", done.stdout)
        assert [b for b, _ in beams] == ["0", "1"] and beams[0][1] != beams[1][1], done.stdout
        assert "cum_log_probs:" in done.stdout
        assert f"generation_logits.shape: (2, {TOKENS}, {VOCAB})" in done.stdout, done.stdout  # per beam
        return
    args = ("-p", PROMPT, "-o", str(TOKENS), "--beam-width", "2")
    done = run_client(NVIDIA_CLIENTS / "end_to_end_grpc_client.py", server.grpc_url, *args, cwd=tmp_path)
    assert done.returncode == 0 and "Received an error from server" not in done.stdout, done.stdout
    two = {**required("ensemble", _prompt_ids(repo)), "beam_width": np.array([2], np.int32)}
    beam = infer(server.grpc_url, "ensemble", two, ["text_output"], decoupled)
    best = beam.last["text_output"][0].decode()  # the client prints text_output[0]: the best beam
    assert best.strip() and f"{best}\n" in done.stdout, done.stdout
