"""specdeploy preprocessing: text -> token ids for the ``tensorrt_llm`` model (a Triton Python model).

Copied into ``<repo>/preprocessing/1/model.py`` by the package stage, with the helper it shares with
postprocessing beside it (``specdeploy_tokenizer.py``: parameters, the tokenizer). It imports only numpy,
transformers and Triton's utilities (never ``pipeline``), so the repository also runs in a
stock Triton + TensorRT-LLM container. Parameters (config.pbtxt):

* ``tokenizer_dir``: relative to this model's folder (``tokenizer``) or absolute;
* ``add_special_tokens``: BOS etc., as the tokenizer defines them;
* ``max_input_len``: the engine's limit; longer prompts get a clear error here instead of a
  failure deep in the backend;
* ``lookahead_window_size`` / ``_ngram_size`` / ``_verification_set_size`` (Lookahead models):
  the server's (W, N, G). A request's own values must not exceed them (TensorRT-LLM's rule);
  missing ones are filled so every request carries all three (tensorrtllm_backend#711);
* ``lora_task_id`` (a shared LoRA fine-tune behind Triton's ensemble, ``serving.ensemble: triton``;
  the Python ensemble sets the id itself): ``OUT_LORA_TASK_ID`` carries it to
  the group's ``tensorrt_llm`` model, unless the request sent its own ``lora_task_id``.

Stop/bad words use TensorRT-LLM's ``[batch, 2, L]`` layout: row 0 the concatenated token ids,
row 1 the end offset of each word, padded with 0 / -1 (no words: ``[[0], [-1]]``).

Outputs as NVIDIA's preprocessing returns them, so manual pipelines written for it work:
``DECODER_INPUT_ID`` / ``REQUEST_DECODER_INPUT_LEN`` always (the tokenized ``DECODER_QUERY``, else
one pad id with length 1), ``EMBEDDING_BIAS`` always ([batch, 0] without bias words, else one
vocabulary-sized row per request: each word's tokens get its weight), ``OUT_PROMPT_TABLE_EXTRA_IDS``
when ``PROMPT_TABLE_EXTRA_ID`` is sent. Multimodal inputs are refused: the engine is a text model.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from specdeploy_tokenizer import load_tokenizer, parameter  # beside this file (the module docstring)

MULTIMODAL_INPUTS = ("IMAGE_BYTES", "IMAGE_URL", "IMAGES", "VIDEO_BYTES")
LOOKAHEAD = (
    ("LOOKAHEAD_WINDOW_SIZE", "lookahead_window_size"),
    ("LOOKAHEAD_NGRAM_SIZE", "lookahead_ngram_size"),
    ("LOOKAHEAD_VERIFICATION_SET_SIZE", "lookahead_verification_set_size"),
)


class RequestError(ValueError):
    """A problem with one request; it becomes that request's error response."""


def word_list(tokenizer, rows: list[list[str]]) -> np.ndarray:
    """Per batch row, words -> [2, L] (ids, end offsets); rows padded to one L."""
    flat: list[list[int]] = []
    ends: list[list[int]] = []
    for words in rows:
        ids: list[int] = []
        offsets: list[int] = []
        for word in words:
            tokens = tokenizer.encode(word, add_special_tokens=False) if word else []
            if tokens:
                ids.extend(tokens)
                offsets.append(len(ids))
        flat.append(ids)
        ends.append(offsets)
    width = max([1] + [len(ids) for ids in flat])
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for row, (ids, offsets) in enumerate(zip(flat, ends)):
        out[row, 0, : len(ids)] = ids
        out[row, 1, : len(offsets)] = offsets
    return out


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.tokenizer = load_tokenizer(args["model_repository"], config)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.add_special_tokens = parameter(config, "add_special_tokens", "true").lower() in ("true", "1", "yes")
        self.max_input_len = int(parameter(config, "max_input_len", "0"))
        # No eos token: -1 never matches, so generation runs to max_tokens (TensorRT-LLM's convention).
        eos = self.tokenizer.eos_token_id
        self.end_id = -1 if eos is None else int(eos)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else max(self.end_id, 0)
        values = [parameter(config, key) or "" for _, key in LOOKAHEAD]
        self.lookahead = tuple(int(v) for v in values) if all(values) else None
        # A shared LoRA fine-tune's preprocessing: its task id, for the group's tensorrt_llm model.
        task = parameter(config, "lora_task_id")
        self.lora_task_id = int(task) if task else None

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._process(request)))
            except RequestError as exc:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))))
        return responses

    def _process(self, request) -> list:
        for name in MULTIMODAL_INPUTS:  # an empty tensor is not set (as the BLS model reads it)
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None and tensor.as_numpy().size:
                raise RequestError(f"input {name}: multimodal requests are not supported, the engine is a text model")
        queries = _input(request, "QUERY")
        batch = queries.shape[0]
        prompts = [_text(item) for item in queries.reshape(batch, -1)[:, 0]]
        output_len = _input(request, "REQUEST_OUTPUT_LEN").reshape(batch, -1)[:, :1].astype(np.int32)
        if (output_len < 1).any():
            # A JSON integer sent over HTTP arrives cut to its low 32 bits (tritonserver casts it to
            # the declared INT32 before any model runs): 2**40 arrives as 0.
            raise RequestError(
                f"max_tokens must be >= 1 (got {int(output_len.min())}; over HTTP, tritonserver keeps only the "
                "low 32 bits of a JSON integer, so a value of 2**31 or more arrives changed)"
            )
        ids = [self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens) for text in prompts]
        for row in ids:
            if not row:
                raise RequestError("text_input is empty: it has no tokens")
            if self.max_input_len and len(row) > self.max_input_len:
                raise RequestError(
                    f"prompt too long: {len(row)} tokens, the engine's max_input_len is {self.max_input_len}"
                )
        end_id = _optional_ids(request, "END_ID", batch, self.end_id)
        pad_id = _optional_ids(request, "PAD_ID", batch, self.pad_id)
        input_ids = _padded(ids, pad_id)
        decoder = pb_utils.get_input_tensor_by_name(request, "DECODER_QUERY")
        if decoder is not None:
            decoder_ids = [
                self.tokenizer.encode(_text(item), add_special_tokens=self.add_special_tokens)
                for item in decoder.as_numpy().reshape(batch, -1)[:, 0]
            ]
        else:  # NVIDIA's convention for a request without one: a single pad id
            decoder_ids = [[int(pad_id[row, 0])] for row in range(batch)]
        tensors = [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(row)] for row in ids], dtype=np.int32)),
            pb_utils.Tensor("DECODER_INPUT_ID", _padded(decoder_ids, pad_id)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.array([[len(row)] for row in decoder_ids], np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len),
            pb_utils.Tensor("BAD_WORDS_IDS", word_list(self.tokenizer, _words(request, "BAD_WORDS_DICT", batch))),
            pb_utils.Tensor("STOP_WORDS_IDS", word_list(self.tokenizer, _words(request, "STOP_WORDS_DICT", batch))),
            pb_utils.Tensor("EMBEDDING_BIAS", self._embedding_bias(request, batch)),
            pb_utils.Tensor("OUT_END_ID", end_id),
            pb_utils.Tensor("OUT_PAD_ID", pad_id),
        ]
        extra = pb_utils.get_input_tensor_by_name(request, "PROMPT_TABLE_EXTRA_ID")
        if extra is not None:  # a text model has no prompt-table ids (ids >= vocabulary size): all 0
            tensors.append(pb_utils.Tensor("OUT_PROMPT_TABLE_EXTRA_IDS", np.zeros(input_ids.shape, np.uint64)))
        if self.lookahead is not None:
            tensors.extend(self._lookahead(request, batch))
        if self.lora_task_id is not None:
            sent = pb_utils.get_input_tensor_by_name(request, "LORA_TASK_ID")
            task = sent.as_numpy().reshape(batch, -1)[:, :1] if sent is not None and sent.as_numpy().size else None
            default = np.full((batch, 1), self.lora_task_id, dtype=np.uint64)
            tensors.append(pb_utils.Tensor("OUT_LORA_TASK_ID", default if task is None else task.astype(np.uint64)))
        return tensors

    def _embedding_bias(self, request, batch: int) -> np.ndarray:
        words = pb_utils.get_input_tensor_by_name(request, "EMBEDDING_BIAS_WORDS")
        weights = pb_utils.get_input_tensor_by_name(request, "EMBEDDING_BIAS_WEIGHTS")
        if words is None and weights is None:
            return np.empty((batch, 0), dtype=np.float32)
        if words is None or weights is None:
            raise RequestError("send both embedding_bias_words and embedding_bias_weights, or neither")
        words, weights = words.as_numpy().reshape(batch, -1), weights.as_numpy().reshape(batch, -1)
        if words.shape != weights.shape:
            raise RequestError(
                f"embedding_bias_words has {words.shape[1]} words but embedding_bias_weights {weights.shape[1]} weights"
            )
        bias = np.zeros((batch, len(self.tokenizer)), dtype=np.float32)
        for row in range(batch):
            for word, weight in zip(words[row], weights[row]):
                for token in self.tokenizer.encode(_text(word), add_special_tokens=False):
                    bias[row, token] += float(weight)
        return bias

    def _lookahead(self, request, batch: int) -> list:
        assert self.lookahead is not None  # called for Lookahead models only
        tensors = []
        for (name, key), limit in zip(LOOKAHEAD, self.lookahead):
            values = _optional_ids(request, name, batch, limit)
            if (values < 1).any() or (values > limit).any():
                raise RequestError(f"{key} must be between 1 and the server's {limit} (got {values.ravel().tolist()})")
            tensors.append(pb_utils.Tensor(f"OUT_{name}", values))
        return tensors


def _padded(rows: list[list[int]], pad_id: np.ndarray) -> np.ndarray:
    """[batch, longest]: each row's ids, then its pad id."""
    out = np.zeros((len(rows), max(len(row) for row in rows)), dtype=np.int32)
    for index, tokens in enumerate(rows):
        out[index, :] = pad_id[index, 0]
        out[index, : len(tokens)] = tokens
    return out


def _input(request, name: str) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise RequestError(f"missing input {name}")
    return tensor.as_numpy()


def _text(item) -> str:
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError("text_input is not valid UTF-8") from None
    return str(item)


def _optional_ids(request, name: str, batch: int, default: int) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return np.full((batch, 1), default, dtype=np.int32)
    return tensor.as_numpy().reshape(batch, -1)[:, :1].astype(np.int32)


def _words(request, name: str, batch: int) -> list[list[str]]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return [[] for _ in range(batch)]
    return [[_text(item) for item in row] for row in tensor.as_numpy().reshape(batch, -1)]
