"""What NVIDIA's C++ ``tensorrtllm`` backend reads from a ``tensorrt_llm`` model's parameters.

``pipeline/triton/backend_reads.json`` is extracted mechanically from the backend's sources by
``scripts/extract_backend_reads.py`` (its ``source`` names the repository, path and commit): one row
per ``GetParameter<T>("key")`` in ``model_instance_state.cc`` and ``model_state.cc``, with its C++
type, whether a missing key ends the model's load (``required``), the condition it is read under,
and for strings the values the backend acts on. The table is read at the last commit of
triton-inference-server/tensorrtllm_backend that holds the sources (May 2025); after it they live in
NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src/``, whose reads were compared one by one
with the table: ``model_instance_state.cc`` @ c8c6df08bd0ead54cd47f7973e1e425c28a174cd (the same reads)
and @ 0c8de69a1ca6213eebb20a51873890ff128666c2 (``tensorrt_llm/version.py`` 1.2.0rc8 at that commit:
the same reads, ``enable_trt_overlap`` now applied rather than ignored, still optional);
``model_state.cc`` @ 5cdd69218f8815d6c8c101ca1facf2ec4ac4b622 (the same file).

How the backend treats a value (``model_state.cc``, ``GetParameter`` specialisations):

- a key that is absent throws ``Cannot find parameter with name: KEY``: a required read outside any
  ``try`` (``tokenizer_dir``, ``xgrammar_tokenizer_info_path``, ``guided_decoding_backend``,
  ``gpt_model_type``) then fails every model instance's creation;
- strings are taken as written; the guided-decoding keys treat ``""`` and the unfilled template text
  ``${key}`` as "not set";
- integers go through ``std::stoi`` / ``std::stoul``, floats ``std::stof``, booleans accept
  ``true/True/TRUE/1`` and ``false/False/FALSE/0``; a value that does not parse throws, and an
  optional read's ``catch`` then quietly uses the default: so a malformed value is a silent
  misconfiguration, which :func:`parameter_problems` refuses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TABLE_FILE = Path(__file__).with_name("backend_reads.json")

# Keys the backend reads only to refuse them: worker_path is "no longer supported".
REFUSED_KEYS = frozenset({"worker_path"})
# Keys NVIDIA's template sets that Triton itself reads, not the backend: Triton's Python backend
# (``triton_backend: python``, the template's other flavour) keeps input tensors on the CPU.
TRITON_KEYS = frozenset({"FORCE_CPU_ONLY_INPUT_TENSORS"})

# The C++ conditions a read is made under, in terms of the parameters themselves: (what it says, a
# check of the parameters). A condition the table gains that is not here fails loudly (KeyError)
# rather than being skipped.
CONDITIONS: dict[str | None, tuple[str, Callable[[dict[str, str]], bool]]] = {
    None: ("always", lambda params: True),
    "decodingMode && decodingMode->isLookahead()": (
        "when `decoding_mode` is `lookahead`",
        lambda params: params.get("decoding_mode") == "lookahead",
    ),
}

BOOLEANS = ("true", "True", "TRUE", "1", "false", "False", "FALSE", "0")
_INT = re.compile(r"-?\d+")
_UINT = re.compile(r"\d+")
_FLOAT = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_CSV_INTS = re.compile(r"\s*-?\d+\s*(,\s*-?\d+\s*)*")
_CHOICES = re.compile(r"\s*\{\s*\d+(\s*,\s*\d+)*\s*\}(\s*,\s*\{\s*\d+(\s*,\s*\d+)*\s*\})*\s*")

# C++ type -> (what it must look like, a check of the string).
_FORMATS: dict[str, tuple[str, re.Pattern[str] | tuple[str, ...]]] = {
    "int32_t": ("an integer", _INT),
    "int": ("an integer", _INT),
    "SizeType32": ("an integer", _INT),
    "uint32_t": ("a non-negative integer", _UINT),
    "size_t": ("a non-negative integer", _UINT),
    "float": ("a number", _FLOAT),
    "bool": ("true or false", BOOLEANS),
    "std::vector<int32_t>": ("comma-separated integers", _CSV_INTS),
    "executor::MedusaChoices": ("choices like {0, 0}, {0, 1}", _CHOICES),
    "executor::EagleChoices": ("choices like {0, 0}, {0, 1}", _CHOICES),
}


@dataclass(frozen=True)
class Read:
    key: str
    type: str  # the C++ type GetParameter is called with
    file: str
    line: int
    function: str
    required: bool  # a missing key ends the load (when ``condition`` holds)
    condition: str | None
    placeholder: bool  # "" and "${key}" mean "not set"
    choices: tuple[str, ...] | None  # a string's values the backend acts on

    def where(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True)
class Table:
    source: dict[str, object]
    reads: tuple[Read, ...]

    @property
    def keys(self) -> frozenset[str]:
        """Every key the backend reads and acts on (and the ones Triton reads for it)."""
        return frozenset(read.key for read in self.reads) - REFUSED_KEYS | TRITON_KEYS

    def required(self, params: dict[str, str]) -> list[Read]:
        """The reads that must find their key in ``params`` (the conditions evaluated on them)."""
        return [read for read in self.reads if read.required and CONDITIONS[read.condition][1](params)]


@lru_cache(maxsize=1)
def load_table() -> Table:
    data = json.loads(TABLE_FILE.read_text())
    reads = tuple(
        Read(**{**row, "choices": tuple(row["choices"]) if row.get("choices") else None}) for row in data["reads"]
    )
    return Table(data["source"], reads)


def value_problem(read: Read, value: str) -> str | None:
    """None when the backend parses ``value`` as the read's type and acts on it, else what it must be."""
    if read.type == "std::string":
        if read.placeholder and value == "":
            return None
        if read.choices and value not in read.choices:
            return f"one of {', '.join(read.choices)}"
        if read.key == "gpu_device_ids":  # model_state.cc: ';' between instances, ',' between ranks
            ok = all(_CSV_INTS.fullmatch(part) for part in value.split(";"))
            return None if ok else "comma-separated GPU ids, instances separated by ';'"
        return None
    what, check = _FORMATS[read.type]
    ok = value in check if isinstance(check, tuple) else check.fullmatch(value) is not None
    return None if ok else what


def parameter_problems(params: dict[str, str], extra_keys: frozenset[str] = frozenset()) -> list[str]:
    """Every way ``params`` would fail or silently misconfigure the C++ backend: a key it does not
    read (``extra_keys`` excepted: the CPU reference backend's own), a key it requires missing, a
    value that does not parse as the backend reads it."""
    table = load_table()
    problems = [f"{key}: not read by the TensorRT-LLM backend" for key in sorted(set(params) - table.keys - extra_keys)]
    problems += [
        f"{read.key}: missing; the backend requires it ({read.where()})"
        for read in table.required(params)
        if read.key not in params
    ]
    for read in table.reads:
        if read.key in params and read.key not in REFUSED_KEYS:
            wrong = value_problem(read, params[read.key])
            if wrong is not None:
                problems.append(f"{read.key}: {params[read.key]!r} is not {wrong} ({read.where()})")
    if not params.get("gpt_model_path") and not params.get("encoder_model_path"):
        # model_instance_state.cc: "Both encoder and decoder model paths are empty"
        problems.append("gpt_model_path: empty; the backend needs the engine's folder")
    return problems
