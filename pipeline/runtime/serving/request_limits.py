"""Per-request values checked against the engine: the vocabulary and the sequence limit.

TensorRT-LLM's executor refuses an ``end_id`` outside [-1, vocab) (``LlmRequest::validate``:
"EndId (%d) is not within acceptable range [-1, %d)."); -1 means "no end token". It does not look at
``pad_id``, stop words or bad words, but values outside the vocabulary there are mistakes, never
requests: a token id the model cannot produce never matches, and a stop word longer than
``max_seq_len`` can never be completed. Each problem names the input and the value the client sent.

>>> from pipeline.runtime.request import GenerationRequest
>>> request_problem(GenerationRequest("r", (1, 2), 4, end_id=-3), vocab=100, max_seq_len=64)
'end_id -3 is not within acceptable range [-1, 100) (the vocabulary)'
>>> request_problem(GenerationRequest("r", (1, 2), 4, pad_id=10**7), vocab=100, max_seq_len=64)
'pad_id 10000000 is outside the vocabulary [0, 100)'
>>> request_problem(GenerationRequest("r", (1, 2), 4, stop_words=((5,) * 65,)), vocab=100, max_seq_len=64)
"stop_words_list: word 0 has 65 tokens, more than the engine's max_seq_len 64: it could never match"
"""

from __future__ import annotations

from pipeline.runtime.request import GenerationRequest


def request_problem(request: GenerationRequest, vocab: int, max_seq_len: int) -> str | None:
    """The first value of ``request`` outside the engine's vocabulary or sequence limit, or None."""
    if request.end_id is not None and not -1 <= request.end_id < vocab:
        return f"end_id {request.end_id} is not within acceptable range [-1, {vocab}) (the vocabulary)"
    if request.pad_id is not None and not 0 <= request.pad_id < vocab:
        return f"pad_id {request.pad_id} is outside the vocabulary [0, {vocab})"
    for what, words in (("stop_words_list", request.stop_words), ("bad_words_list", request.sampling.bad_words)):
        problem = words_problem(what, words, vocab, max_seq_len)
        if problem is not None:
            return problem
    return None


def words_problem(what: str, words: tuple[tuple[int, ...], ...], vocab: int, max_seq_len: int) -> str | None:
    """A word longer than a sequence can be, or a token id outside [0, vocab).

    >>> words_problem("bad_words_list", ((3, 4), (7, 250)), vocab=200, max_seq_len=64)
    'bad_words_list: word 1 has token id 250, outside the vocabulary [0, 200)'
    >>> words_problem("stop_words_list", ((3, 4),), vocab=200, max_seq_len=64) is None
    True
    """
    for index, word in enumerate(words):
        if len(word) > max_seq_len:
            return (
                f"{what}: word {index} has {len(word)} tokens, more than the engine's max_seq_len "
                f"{max_seq_len}: it could never match"
            )
        bad = next((token for token in word if not 0 <= token < vocab), None)
        if bad is not None:
            return f"{what}: word {index} has token id {bad}, outside the vocabulary [0, {vocab})"
    return None
