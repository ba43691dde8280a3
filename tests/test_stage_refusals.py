"""Every refusal a stage raises has a plan-time twin, or a written reason why it cannot have one.

A stage that refuses its input after minutes of GPU time, on a condition the spec and the input
headers already decide (method x quantization, KV cache dtype x method, parallelism x architecture,
heads x base model, adapters x engine, ...), is a refusal ``validate`` should have made first, at
the spec's file:line. This module enumerates, with ``ast``, every ``raise InputError / StageError /
StageUnavailable`` in a function of the stage modules (:data:`STAGE_MODULES`) and holds each to one
verdict in :data:`VERDICTS`:

* ``twin(name)``: ``validate`` refuses the same condition (exit 2, located at ``spec.yaml:LINE``);
  :data:`TWINS` holds the case, run by :func:`test_twin_is_refused_by_validate`. Where validate runs
  the stage's own header checks (``check_checkpoint``, ``open_checked_adapter``, ``read_calibration``,
  in pipeline/plan/preflight.py), a whole function may share one case: the case shows that function's
  refusals reach the user at the spec's line;
* ``needs_values(why)``: decided only by the tensors' values or a file's bytes;
* ``host(why)``: decided by this host or an earlier stage's output;
* ``internal(why)``: the pipeline's check of its own arguments, which a valid plan never triggers
  (the reason names the spec rule that constrains them);
* ``gap(what)``: decidable from the spec and headers, not yet refused by ``validate``.

A key is ``path:function`` (every raise of that function) or ``path:function:message head`` (one
raise; it wins over its function's key). The message head is the literal text of the message with
``{}`` for each placeholder, so keys survive moved lines. A new raise without a verdict fails
:func:`test_every_stage_refusal_has_a_verdict`; a verdict that names no raise fails
:func:`test_no_verdict_is_stale`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.heads.export import MEDUSA_FORMAT, MEDUSA_RESBLOCKS
from tests.checkpoint.conftest import eagle_drafter_dir, make_adapter, random_llama
from tests.conftest import TINY_LLAMA_CONFIG
from tests.preflight_fixtures import model  # noqa: F401  (a fixture, used by getfixturevalue)

REPO = Path(__file__).resolve().parents[1]
STAGE_MODULES = (
    "pipeline/checkpoint/*.py",
    "pipeline/quantize/*.py",
    "pipeline/stages/*.py",
    "pipeline/lora/convert.py",
    "pipeline/heads/*.py",
    "pipeline/trtllm/build_command.py",
)
REFUSALS = {"InputError", "StageError", "StageUnavailable"}
HEAD_CHARS = 50


# --- verdicts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    kind: str  # twin | needs_values | host | internal | gap
    why: str  # the twin's name, or the reason


def twin(name: str) -> Verdict:
    return Verdict("twin", name)


def needs_values(why: str) -> Verdict:
    return Verdict("needs_values", why)


def host(why: str) -> Verdict:
    return Verdict("host", why)


def internal(why: str) -> Verdict:
    return Verdict("internal", why)


def gap(what: str) -> Verdict:
    return Verdict("gap", what)


CORRUPT = needs_values("a corrupt or truncated file: its bytes, not the spec, decide")
RUNNER_TEMP = internal("the stage runner passes a fresh empty temp folder (pipeline/stages/runner.py)")

CK, Q, ST, H = "pipeline/checkpoint/", "pipeline/quantize/", "pipeline/stages/", "pipeline/heads/"
VERDICTS: dict[str, Verdict] = {
    # pipeline/checkpoint/convert.py
    CK + "convert.py:convert_checkpoint": RUNNER_TEMP,
    CK + "convert.py:_check_arguments:dtype {} is not supported": internal("model.dtype: a Literal of the schema"),
    CK + "convert.py:_check_arguments:{} must be a positive integer": internal("parallel.tp/pp: Field(ge=1)"),
    CK + "convert.py:_check_arguments:choose Medusa or EAGLE": internal("_choose_method picks one method a variant"),
    # pipeline/checkpoint/heads.py (validate's check_checkpoint runs load_medusa/load_eagle on the headers)
    CK + "heads.py:load_pickle_state_dict": needs_values("a pickle's contents are known only by unpickling it"),
    CK + "heads.py:_expect_shape": twin("medusa-heads-of-another-base"),
    CK + "heads.py:_src": twin("medusa-heads-of-another-base"),
    CK + "heads.py:_medusa_input": twin("medusa-heads-of-another-base"),
    CK + "heads.py:_medusa_input:{}: Medusa head folder does not exist": host("the heads are not on this host yet"),
    CK + "heads.py:load_medusa": twin("medusa-heads-of-another-base"),
    CK + "heads.py:load_medusa:medusa max_draft_len must be positive": internal("max_draft_len: Field(ge=1)"),
    CK + "heads.py:_scalar": needs_values("an FP8 head's scale tensor holds a shape the header shows, read with it"),
    CK + "heads.py:load_eagle": twin("eagle-drafter-layer-numbering"),
    CK + "heads.py:load_eagle:eagle max_draft_len {} exceeds": twin("eagle-max-draft-len"),
    CK + "heads.py:load_eagle:eagle {} must be positive": internal("EAGLE settings: Field(ge=1) in the schema"),
    CK + "heads.py:load_eagle:{}: EAGLE drafter folder does not exist": host("the drafter is not on this host yet"),
    CK + "heads.py:load_eagle:{}: missing (EAGLE drafter": twin("eagle-drafter-without-config"),
    CK + "heads.py:load_eagle:{}: EAGLE drafter LlamaConfig must be": twin("eagle-config-not-an-object"),
    CK + "heads.py:load_eagle:{}: no model.safetensors or pytorch": twin("eagle-drafter-without-weights"),
    CK + "heads.py:load_eagle:{}: drafter hidden_size": twin("eagle-drafter-hidden"),
    CK + "heads.py:load_eagle:{}: drafter vocab_size": twin("eagle-drafter-vocab"),
    CK + "heads.py:load_eagle:{}: no layers.N.* tensors": twin("eagle-drafter-without-layers"),
    CK + "heads.py:load_eagle.take": twin("eagle-drafter-layer-numbering"),
    # pipeline/checkpoint/hf_reader.py (validate's check_checkpoint opens the checkpoint as convert does)
    CK + "hf_reader.py:_load_json": twin("model-without-config"),
    CK + "hf_reader.py:_detect_fp8:{}: not a ModelOpt": twin("hf-quant-config-not-modelopt"),
    CK + "hf_reader.py:_detect_fp8:{}: quant_method {}": twin("input-quantized-with-awq"),
    CK + "hf_reader.py:_detect_fp8:{}: quant_algo {}": twin("hf-quant-config-int4"),
    CK + "hf_reader.py:_detect_fp8:{}: kv_cache_quant_algo {}": twin("hf-quant-config-int8-kv"),
    CK + "hf_reader.py:_weight_files:{}: no model.safetensors or": host(
        "the weights are not here yet (plan from config)"
    ),
    CK + "hf_reader.py:_weight_files:{}: only pickle weights": twin("pickle-only-base"),
    CK + "hf_reader.py:_weight_files:{}: no weight_map": CORRUPT,
    CK + "hf_reader.py:open_hf_checkpoint": CORRUPT,  # shards missing, overlapping or disagreeing with the index
    CK + "hf_reader.py:open_hf_checkpoint:{}: not a directory": host("the model folder is not on this host"),
    CK + "hf_reader.py:open_hf_checkpoint:{}: not a JSON object": twin("config-not-an-object"),
    CK + "hf_reader.py:open_hf_checkpoint:{} is float8 but": twin("float8-tensor-without-quant-config"),
    CK + "hf_reader.py:open_hf_checkpoint:{} has dtype {}": twin("integer-tensor-in-checkpoint"),
    CK + "hf_reader.py:HFCheckpoint.ref": twin("checkpoint-missing-tensor"),
    CK + "hf_reader.py:HFCheckpoint.scalar": needs_values("the FP8 scales' values"),
    # pipeline/checkpoint/layout.py
    CK + "layout.py:build_plan:{}: pp={} exceeds": twin("pp-exceeds-layers"),
    CK + "layout.py:build_plan:{}: kv_cache_fp8 needs": twin("kv-fp8-export-without-kv-scales"),
    CK + "layout.py:build_plan:{}: hidden_size {} is not divisible": twin("eagle-tp-not-dividing-hidden"),
    CK + "layout.py:build_plan:EAGLE needs pp=1": twin("eagle-with-pp"),
    CK + "layout.py:build_plan:kv_cache_fp8 with EAGLE": twin("eagle-with-fp8-kv-cache"),
    CK + "layout.py:_check_unused": twin("checkpoint-unexpected-tensor"),
    CK + "layout.py:_Builder.tensor": twin("checkpoint-wrong-shape"),
    CK + "layout.py:_Builder.linear": twin("fp8-export-with-16-bit-linears"),
    CK + "layout.py:_Builder.kv_scale": needs_values("an incomplete export: its files lack the KV scales it promises"),
    # pipeline/checkpoint/lora.py (validate's open_checked_adapter reads each adapter as the merge does)
    CK + "lora.py:_open_weights": needs_values("a pickled adapter's contents are known only by unpickling it"),
    CK + "lora.py:_open_weights:{}: no adapter_model.safetensors": twin("adapter-without-weights"),
    CK + "lora.py:open_adapter": twin("adapter-rank-disagrees"),
    CK + "lora.py:open_adapter:adapter_folder_problem": twin("adapter-not-a-folder"),
    CK + "lora.py:check_against_base": twin("adapter-targets-a-module-the-base-lacks"),
    CK + "lora.py:check_adapter_values": needs_values("NaN/Inf in the adapter's tensors"),
    CK + "lora.py:_check_change": needs_values("the size of the merged update"),
    CK + "lora.py:_require_finite_result": needs_values("the merged tensor overflows"),
    # pipeline/checkpoint/merge.py
    CK + "merge.py:merge_adapters": RUNNER_TEMP,
    CK + "merge.py:merge_adapters:merge needs at least one": internal(
        "a merge stage is planned only with model.adapter"
    ),
    CK + "merge.py:open_checked_adapter": twin("adapters-on-an-fp8-base"),
    # pipeline/checkpoint/reference_forward.py, safetensors_io.py, sharding.py, trtllm_writer.py, values.py
    CK + "reference_forward.py:ReferenceModel.load": host("reads the convert stage's output"),
    CK + "safetensors_io.py:_parse_header": CORRUPT,
    CK + "safetensors_io.py:_parse_header.no_duplicates": CORRUPT,
    CK + "safetensors_io.py:_metadata": CORRUPT,
    CK + "safetensors_io.py:_entry": CORRUPT,
    CK + "safetensors_io.py:SafetensorsFile._parse": CORRUPT,
    CK + "safetensors_io.py:SafetensorsFile.meta": internal("callers ask only for names the header listed"),
    CK + "safetensors_io.py:SafetensorsFile.fileno": host("the file cannot be opened on this host"),
    CK + "safetensors_io.py:SafetensorsFile.read_rows": CORRUPT,
    CK + "safetensors_io.py:StateDictSource.meta": internal("callers ask only for names the header listed"),
    CK + "safetensors_io.py:StreamWriter.copy_range": host("the input shrank while it was being copied"),
    CK + "sharding.py:chunk": twin("tp-not-dividing-intermediate-size"),  # o_proj: heads; heads' linears: hidden
    CK + "sharding.py:check_heads:{}: num_attention_heads": twin("tp-not-dividing-attention-heads"),
    CK + "sharding.py:check_heads:{}: num_key_value_heads": twin("tp-not-dividing-kv-heads"),
    CK + "sharding.py:check_heads:{}: tp={} is not a multiple": twin("tp-not-dividing-kv-heads"),
    CK + "trtllm_writer.py:_check_finite": needs_values("NaN/Inf in the converted tensors"),
    CK + "values.py:require_finite": needs_values("NaN/Inf in the weights"),
    # pipeline/quantize/
    Q + "calibration.py:read_calibration": twin("calibration-file-without-samples"),
    Q + "calibration.py:read_calibration:{}: calibration file not found": twin("calibration-file-missing"),
    Q + "calibration.py:read_calibration:{}: calibration data must be": twin("calibration-file-of-another-kind"),
    Q + "calibration.py:_parse_jsonl": twin("calibration-line-not-json"),
    Q + "calibration.py:_sample_from_record": twin("calibration-record-without-text"),
    Q + "calibration.py:tokenize_samples": needs_values("what the tokenizer makes of the samples"),
    Q + "checks.py:verify_fp8_export": host("checks what ModelOpt wrote, the quantize step's own output"),
    Q + "checks.py:verify_fp8_export.need": host("checks what ModelOpt wrote, the quantize step's own output"),
    Q + "checks.py:_check_scale_values": needs_values("the calibrated scales' values"),
    Q + "checks.py:require_plain_checkpoint:{}: model folder not found": host("the weights are not on this host"),
    Q + "checks.py:require_plain_checkpoint:{}: no config.json": twin("model-without-config"),
    Q + "checks.py:require_plain_checkpoint:{}: already a ModelOpt": internal("a ModelOpt FP8 input is prequantized"),
    Q + "checks.py:require_plain_checkpoint:{}: already quantized": twin("input-quantized-with-awq"),
    Q + "fp8.py:quantize_fp8": host("ModelOpt, transformers and the GPUs of this host"),
    Q + "fp8.py:quantize_fp8:export dtype": twin("fp8-with-float32"),
    Q + "fp8.py:quantize_fp8:calibration size": internal("calibration.size: Field(ge=1), max_seq_len: Field(ge=8)"),
    Q + "fp8.py:quantize_fp8:{}: no tokenizer files": twin("model-without-tokenizer"),
    Q + "fp8.py:quantize_fp8:{}: already holds .safetensors": RUNNER_TEMP,
    Q + "fp8.py:quantize_fp8:{}: {} tensors (e.g. '{}') are not": twin("checkpoint-unexpected-tensor"),
    Q + "fp8.py:quantize_fp8:{}: {} weights missing": twin("checkpoint-missing-tensor"),
    Q + "fp8.py:quantize_fp8:{}: ModelOpt quantized no Linear": internal("the plan takes Llama checkpoints only"),
    Q + "fp8.py:_calibrated_quantizers": needs_values("which quantizers the calibration data reached"),
    Q + "fp8.py:_finish_export_folder": internal("quantize_fp8 refuses a model without tokenizer files first"),
    Q + "hf.py:read_json:{}: cannot read JSON": twin("config-not-json"),
    Q + "hf.py:read_json:{}: expected a JSON object": twin("config-not-an-object"),
    Q + "placement.py:check_device_map": host("the GPU memory of this host"),
    # pipeline/stages/
    ST + "build.py:run": host("TensorRT-LLM is not installed on this host"),
    ST + "build.py:read_checkpoint": host("reads the convert stage's output"),
    ST + "build.py:_build_reference": internal("the reference engine is built from the plan's own numbers"),
    ST + "build.py:_build_tensorrt": host("trtllm-build's exit code and what it wrote"),
    ST + "build.py:_build_tensorrt:refusing to run an argv": internal(
        "validate checks build.extra_flags (extra-flags)"
    ),
    ST + "convert.py:_convert": internal("_choose_method gives Medusa/EAGLE variants a heads folder"),
    ST + "execute.py:require_inputs": host("the input folders are not on this host"),
    ST + "runner.py:fingerprint_mode": host("an environment variable of this host"),
    # pipeline/lora/convert.py (serving.lora shared: pipeline/lora/group.py refuses these from adapter_config.json)
    "pipeline/lora/convert.py:_module": twin("shared-lora-outside-the-plugin-modules"),
    "pipeline/lora/convert.py:_convert:{}: a full copy of a base tensor": twin("shared-lora-with-modules-to-save"),
    "pipeline/lora/convert.py:_convert:{}: DoRA": twin("shared-lora-with-dora"),
    "pipeline/lora/convert.py:_convert:{}: the adapter has no LoRA": twin("shared-lora-targeting-no-projection"),
    "pipeline/lora/convert.py:_convert:{}: scaled by lora_alpha / r it is not finite in {": needs_values(
        "NaN, Inf or float16 overflow in the adapter's tensors"
    ),
    # pipeline/heads/
    H + "expand.py:compact_medusa_layout": twin("compact-medusa-heads-misnumbered"),
    H + "expand.py:compact_medusa_layout:{}: not a readable": CORRUPT,
    H + "expand.py:base_lm_head": twin("checkpoint-missing-tensor"),
    H + "expand.py:expand_medusa:{}: not a {} folder": internal("called only for heads read as specdeploy-compact"),
    H + "expand.py:expand_medusa:{}: lm_head {} does not fit": twin("compact-medusa-heads-of-another-base"),
    H + "expand.py:expand_medusa:'; '.join(problems)": needs_values("the manifest's sha256 of the heads' bytes"),
    H + "fixed_text.py:read_texts": needs_values("the training text's contents"),
    H + "fixed_text.py:read_texts:{}: training text not found": twin("heads-training-data-missing"),
    H + "fixed_text.py:fixed_text_data": needs_values("how many tokens the training text makes"),
    H + "eagle3.py:convert:{}: not an EAGLE-3 drafter ModelOpt can continue t": internal(
        "read_eagle3 holds heads.eagle3.path to ModelOpt's export names at plan time; this guards a ModelOpt "
        "whose module names differ"
    ),
    H + "eagle3.py:train_eagle3:EAGLE-3 training: no training sequence with an ans": needs_values(
        "the lengths of the target's own self-distilled answers"
    ),
    H + "refresh.py:_device": host("a CUDA GPU on this host"),
    H + "refresh.py:_check_init:{}: missing;": twin("heads-training-init-missing"),
    H + "refresh.py:_check_init:{}: hidden size": twin("eagle-drafter-hidden"),  # Medusa: no plan-time twin
    H + "refresh.py:_check_init:{}: init: base needs specdeploy": twin("heads-training-init-not-compact"),
    H + "refresh.py:refresh_heads": internal("heads: has medusa and eagle keys only"),
    # pipeline/trtllm/build_command.py
    "pipeline/trtllm/build_command.py:extra_flag_args": twin("unknown-extra-flag"),
}


# --- the stage modules' refusals -----------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    path: str
    function: str  # qualified: Class.method, outer.inner
    head: str
    line: int

    @property
    def key(self) -> str:
        return f"{self.path}:{self.function}:{self.head}"


def message_head(call: ast.Call) -> str:
    """The literal text of the first argument, ``{}`` for each placeholder; code for anything else."""
    if not call.args:
        return ""
    arg = call.args[0]
    if isinstance(arg, ast.JoinedStr):
        text = "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in arg.values)
    elif isinstance(arg, ast.Constant):
        text = str(arg.value)
    else:
        text = ast.unparse(arg)
    return text[:HEAD_CHARS]


class _RaiseFinder(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path, self.scope, self.found = path, [], []

    def _scoped(self, node: ast.AST, name: str) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node, node.name)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._scoped(node, node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id in REFUSALS and self.scope:
            self.found.append(Refusal(self.path, ".".join(self.scope), message_head(exc), node.lineno))


def stage_refusals() -> list[Refusal]:
    found: list[Refusal] = []
    for pattern in STAGE_MODULES:
        for file in sorted(REPO.glob(pattern)):
            finder = _RaiseFinder(file.relative_to(REPO).as_posix())
            finder.visit(ast.parse(file.read_text()))
            found += finder.found
    return found


def keys_of(refusal: Refusal) -> list[str]:
    """The VERDICTS keys that name ``refusal``: its own (a head prefix), else its function's."""
    function = f"{refusal.path}:{refusal.function}"
    own = [k for k in VERDICTS if k.startswith(function + ":") and refusal.head.startswith(k[len(function) + 1 :])]
    return own or ([function] if function in VERDICTS else [])


REFUSAL_LIST = stage_refusals()


def test_the_enumeration_finds_the_stages_refusals():
    assert len(REFUSAL_LIST) > 150
    assert any(r.key.startswith(CK + "layout.py:build_plan:EAGLE needs pp=1") for r in REFUSAL_LIST)


def test_every_stage_refusal_has_a_verdict():
    missing = [f"{r.key} (line {r.line})" for r in REFUSAL_LIST if not keys_of(r)]
    assert not missing, "refusals without a verdict in VERDICTS:\n" + "\n".join(missing)


def test_each_refusal_has_one_verdict():
    ambiguous = [f"{r.key}: {keys}" for r in REFUSAL_LIST if len(keys := keys_of(r)) > 1]
    assert not ambiguous, "\n".join(ambiguous)


def test_no_verdict_is_stale():
    used = {key for r in REFUSAL_LIST for key in keys_of(r)}
    assert not set(VERDICTS) - used, f"verdicts that name no raise: {sorted(set(VERDICTS) - used)}"


def test_every_twin_has_a_case_and_every_case_a_refusal():
    named = {v.why for v in VERDICTS.values() if v.kind == "twin"}
    assert named - set(TWINS) == set(), "twins without a case in TWINS"
    assert set(TWINS) - named == set(), "TWINS cases no verdict names"


def test_reasons_are_written():
    assert all(
        v.kind in ("twin", "needs_values", "host", "internal", "gap") and v.why.strip() for v in VERDICTS.values()
    )


# --- the twins: validate refuses each at the spec's line -----------------------------------------

HF_CONFIG = TINY_LLAMA_CONFIG | {"max_position_embeddings": 4096}
MODELOPT_FP8 = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}
ADAPTER = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
PRESET = "name: p\nmodel: {preset: llama-3.1-8b}\n"
TINY = "name: p\nmodel: {path: model, dtype: float32}\ntarget: reference\n"  # the `model` fixture's folder
SHARED_LORA = (
    "name: p\nmodel: {path: /models/llama, preset: llama-3.1-8b, dtype: float16}\nserving: {lora: shared}\n"
    "variants:\n  - name: base\n  - name: ft\n    model: {adapter: a}  # <-\n"
)


@dataclass(frozen=True)
class Twin:
    """``spec``: the spec text, the line validate must name marked ``# <-``; ``expect``: in that error.
    ``files(folder)`` writes the inputs beside the spec; ``model``: a tiny Llama with weights and
    tokenizer at ``folder/model`` first (tests/preflight_fixtures.py)."""

    spec: str
    expect: str
    files: Callable[[Path], None] | None = None
    model: bool = False


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def config_model(**changes: object) -> Callable[[Path], None]:
    """A model folder holding config.json alone (plans without weights), HF_CONFIG with ``changes``."""

    def write(folder: Path) -> None:
        write_json(folder / "m" / "config.json", HF_CONFIG | changes)

    return write


def together(*writers: Callable[[Path], None]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        for writer in writers:
            writer(folder)

    return write


def file(name: str, data: object) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        if isinstance(data, str):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(data)
        else:
            write_json(folder / name, data)

    return write


def edit_weights(edit: Callable[[dict[str, torch.Tensor]], None], name: str = "model/model.safetensors"):
    """Rewrite a safetensors file of the inputs through ``edit(tensors)``."""

    def write(folder: Path) -> None:
        tensors = load_file(folder / name)
        edit(tensors)
        save_file(tensors, folder / name)

    return write


def drafter(hidden: int = 64, vocab: int = 96, **config: object) -> Callable[[Path], None]:
    """An EAGLE-1 drafter at folder/eagle (tests/checkpoint/conftest.py), its config.json edited."""

    def write(folder: Path) -> None:
        heads = eagle_drafter_dir(folder, hidden=hidden, vocab=vocab)
        write_json(heads / "config.json", json.loads((heads / "config.json").read_text()) | config)

    return write


def renamed_layer(tensors: dict[str, torch.Tensor]) -> None:
    for name in [n for n in tensors if n.startswith("layers.0.")]:
        tensors["layers.1." + name.removeprefix("layers.0.")] = tensors.pop(name)


def without_layers(tensors: dict[str, torch.Tensor]) -> None:
    for name in [n for n in tensors if n.startswith("layers.")]:
        del tensors[name]


def medusa_heads(hidden: int) -> Callable[[Path], None]:
    """FasterDecoding Medusa heads (3 heads of 1 ResBlock) of the given hidden size, vocabulary 96."""

    def write(folder: Path) -> None:
        (folder / "medusa").mkdir()
        tensors = {}
        for h in range(3):
            tensors[f"{h}.0.linear.weight"] = torch.zeros(hidden, hidden)
            tensors[f"{h}.0.linear.bias"] = torch.zeros(hidden)
            tensors[f"{h}.1.weight"] = torch.zeros(96, hidden)
        save_file(tensors, folder / "medusa" / "medusa_lm_head.safetensors")
        write_json(folder / "medusa" / "config.json", {"medusa_num_heads": 3, "medusa_num_layers": 1})

    return write


def compact_medusa(hidden: int, heads: tuple[int, ...] = (0, 1, 2)) -> Callable[[Path], None]:
    """specdeploy's compact Medusa heads (ResBlocks only; the lm_heads come from the base)."""

    def write(folder: Path) -> None:
        (folder / "medusa").mkdir()
        tensors = {}
        for h in heads:
            tensors[f"{h}.0.linear.weight"] = torch.zeros(hidden, hidden)
            tensors[f"{h}.0.linear.bias"] = torch.zeros(hidden)
        save_file(tensors, folder / "medusa" / MEDUSA_RESBLOCKS)
        config = {"medusa_num_heads": len(heads), "specdeploy": {"weights": MEDUSA_RESBLOCKS, "format": MEDUSA_FORMAT}}
        write_json(folder / "medusa" / "config.json", config)

    return write


def adapter_on_tiny(**config: object) -> Callable[[Path], None]:
    """A PEFT adapter of the tiny model at folder/a, its adapter_config.json edited."""

    def write(folder: Path) -> None:
        make_adapter(random_llama(0), folder / "a")
        path = folder / "a" / "adapter_config.json"
        write_json(path, json.loads(path.read_text()) | config)

    return write


def pickle_only(folder: Path) -> None:
    (folder / "model" / "model.safetensors").unlink()
    (folder / "model" / "pytorch_model.bin").write_bytes(b"not read: the name is enough")


def no_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / "model" / name).unlink()


EAGLE_ON_CONFIG = "name: p\nmodel: {path: m}\nheads: {eagle: {path: eagle}}  # <-\ntarget: reference\n"
MEDUSA_ON_TINY = TINY + "speculative: {method: medusa, medusa: {choices: chain_3}}\nheads: {medusa: {path: medusa}}\n"

TWINS: dict[str, Twin] = {
    # parallelism x architecture x method
    "tp-not-dividing-attention-heads": Twin(PRESET + "parallel: {tp: 3}  # <-\n", "does not divide the 32 attention"),
    "tp-not-dividing-kv-heads": Twin(
        "name: p\nmodel: {path: m}\nparallel: {tp: 2}  # <-\n",
        "does not divide the 3 KV heads",
        config_model(num_attention_heads=6, num_key_value_heads=3, head_dim=16, hidden_size=96),
    ),
    "tp-not-dividing-intermediate-size": Twin(
        "name: p\nmodel: {path: m}\nparallel: {tp: 4}  # <-\n",
        "does not divide intermediate_size 130",
        config_model(intermediate_size=130),
    ),
    "pp-exceeds-layers": Twin(PRESET + "parallel: {pp: 33}  # <-\n", "pp 33 exceeds the 32 layers"),
    "eagle-with-pp": Twin(
        PRESET + "heads: {eagle: {path: /nowhere}}\nparallel: {pp: 2}  # <-\n", "EAGLE does not support pipeline"
    ),
    "eagle-with-fp8-kv-cache": Twin(
        PRESET + "heads: {eagle: {path: /nowhere}}\nquantization: {weights: fp8, kv_cache: fp8}  # <-\n",
        "an FP8 KV cache with EAGLE is not supported",
    ),
    "eagle-tp-not-dividing-hidden": Twin(
        "name: p\nmodel: {path: m}\nheads: {eagle: {path: /nowhere}}\nparallel: {tp: 3}  # <-\ntarget: reference\n",
        "tp 3 does not divide hidden_size 64",
        config_model(num_attention_heads=3, num_key_value_heads=1, head_dim=32, intermediate_size=192),
    ),
    "eagle-max-draft-len": Twin(PRESET + "speculative: {eagle: {max_draft_len: 300}}  # <-\n", "must be <= 256"),
    # quantization x input x method
    "fp8-with-float32": Twin(
        "name: p\nmodel: {preset: llama-3.1-8b, dtype: float32}  # <-\nquantization: {weights: fp8}\n",
        "float32 with quantization.weights: fp8",
    ),
    "input-quantized-with-awq": Twin(
        "name: p\nmodel: {path: m}  # <-\nquantization: {weights: fp8}\n",
        "quant_method 'awq' is not supported",
        config_model(quantization_config={"quant_method": "awq"}),
    ),
    "hf-quant-config-not-modelopt": Twin(
        "name: p\nmodel: {path: m}  # <-\n",
        "not a ModelOpt quantization config",
        together(config_model(), file("m/hf_quant_config.json", MODELOPT_FP8 | {"producer": {"name": "other"}})),
    ),
    "hf-quant-config-int4": Twin(
        "name: p\nmodel: {path: m}  # <-\n",
        "quant_algo 'W4A16_AWQ' is not supported",
        together(
            config_model(), file("m/hf_quant_config.json", MODELOPT_FP8 | {"quantization": {"quant_algo": "W4A16_AWQ"}})
        ),
    ),
    "hf-quant-config-int8-kv": Twin(
        "name: p\nmodel: {path: m}  # <-\n",
        "kv_cache_quant_algo 'INT8' is not supported",
        together(
            config_model(),
            file(
                "m/hf_quant_config.json",
                MODELOPT_FP8 | {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "INT8"}},
            ),
        ),
    ),
    "kv-fp8-export-without-kv-scales": Twin(
        "name: p\nmodel: {path: m}\nquantization: {weights: fp8, kv_cache: fp8}  # <-\n",
        "an FP8 export without FP8 KV-cache scales",
        together(config_model(), file("m/hf_quant_config.json", MODELOPT_FP8)),
    ),
    "fp8-export-with-16-bit-linears": Twin(
        TINY.replace("model: {path: model, dtype: float32}", "model: {path: model, dtype: float32}  # <-"),
        "is not float8 in an FP8 checkpoint",
        file("model/hf_quant_config.json", MODELOPT_FP8),
        model=True,
    ),
    "calibration-file-missing": Twin(
        PRESET + "quantization: {weights: fp8, calibration: {data: missing.txt}}  # <-\n", "calibration file not found"
    ),
    "calibration-file-of-another-kind": Twin(
        PRESET + "quantization: {weights: fp8, calibration: {data: calib.csv}}  # <-\n",
        "must be a .txt or .jsonl file",
        file("calib.csv", "a,b\n"),
    ),
    "calibration-file-without-samples": Twin(
        PRESET + "quantization: {weights: fp8, calibration: {data: calib.txt}}  # <-\n",
        "has no samples",
        file("calib.txt", "\n\n"),
    ),
    "calibration-line-not-json": Twin(
        PRESET + "quantization: {weights: fp8, calibration: {data: calib.jsonl}}  # <-\n",
        "not valid JSON",
        file("calib.jsonl", '{"text": "fine"}\n{oops\n'),
    ),
    "calibration-record-without-text": Twin(
        PRESET + "quantization: {weights: fp8, calibration: {data: calib.jsonl}}  # <-\n",
        "needs a 'text' string or a 'messages' list",
        file("calib.jsonl", '{"prompt": "no text key"}\n'),
    ),
    # the model's files
    "model-without-config": Twin("name: p\nmodel: {path: m}  # <-\n", "no config.json there", file("m/README", "")),
    "config-not-json": Twin("name: p\nmodel: {path: m}  # <-\n", "m/config.json", file("m/config.json", "{oops")),
    "config-not-an-object": Twin("name: p\nmodel: {path: m}  # <-\n", "JSON object", file("m/config.json", "[]")),
    "model-without-tokenizer": Twin(
        TINY.replace("dtype: float32}", "dtype: float32}  # <-"), "no tokenizer", no_tokenizer, model=True
    ),
    "pickle-only-base": Twin(
        TINY.replace("dtype: float32}", "dtype: float32}  # <-"), "only pickle weights", pickle_only, model=True
    ),
    "checkpoint-missing-tensor": Twin(
        TINY.replace("dtype: float32}", "dtype: float32}  # <-"),
        "model.norm.weight is missing",
        edit_weights(lambda t: t.pop("model.norm.weight")),
        model=True,
    ),
    "checkpoint-unexpected-tensor": Twin(
        TINY.replace("dtype: float32}", "dtype: float32}  # <-"),
        "unexpected tensor",
        edit_weights(lambda t: t.update({"model.extra.weight": torch.zeros(4)})),
        model=True,
    ),
    "checkpoint-wrong-shape": Twin(
        TINY.replace("dtype: float32}", "dtype: float32}  # <-"),
        "does not match config.json",
        edit_weights(lambda t: t.update({"model.norm.weight": torch.zeros(32)})),
        model=True,
    ),
    "integer-tensor-in-checkpoint": Twin(
        TINY.replace("dtype: float32}", "dtype: float32}  # <-"),
        "expected float32/float16/bfloat16",
        edit_weights(lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.int32)})),
        model=True,
    ),
    "float8-tensor-without-quant-config": Twin(
        TINY.replace("dtype: float32}", "dtype: float32}  # <-"),
        "no ModelOpt quantization config",
        edit_weights(lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.float8_e4m3fn)})),
        model=True,
    ),
    # heads x base model
    "medusa-heads-of-another-base": Twin(
        MEDUSA_ON_TINY.replace("heads: {medusa: {path: medusa}}", "heads: {medusa: {path: medusa}}  # <-"),
        "trained for a different base model",
        medusa_heads(hidden=32),
        model=True,
    ),
    "compact-medusa-heads-of-another-base": Twin(
        MEDUSA_ON_TINY.replace("heads: {medusa: {path: medusa}}", "heads: {medusa: {path: medusa}}  # <-"),
        "trained for a different base model",
        compact_medusa(hidden=32),
        model=True,
    ),
    "compact-medusa-heads-misnumbered": Twin(
        MEDUSA_ON_TINY.replace("heads: {medusa: {path: medusa}}", "heads: {medusa: {path: medusa}}  # <-"),
        "not numbered 0..2",
        compact_medusa(hidden=64, heads=(0, 1, 3)),
        model=True,
    ),
    "eagle-drafter-without-config": Twin(
        EAGLE_ON_CONFIG, "needs the drafter's LlamaConfig", together(config_model(), file("eagle/README", ""))
    ),
    "eagle-config-not-an-object": Twin(
        EAGLE_ON_CONFIG, "expected a JSON object", together(config_model(), file("eagle/config.json", "[]"))
    ),
    "eagle-drafter-without-weights": Twin(
        EAGLE_ON_CONFIG, "no EAGLE weights", together(config_model(), file("eagle/config.json", {"hidden_size": 64}))
    ),
    "eagle-drafter-hidden": Twin(
        EAGLE_ON_CONFIG, "EAGLE hidden size 32 does not match", together(config_model(), drafter(hidden=32))
    ),
    "eagle-drafter-vocab": Twin(
        EAGLE_ON_CONFIG, "drafter vocab_size 96 does not match", together(config_model(), drafter(vocab=96))
    ),
    "eagle-drafter-without-layers": Twin(
        EAGLE_ON_CONFIG,
        "has 0 drafter layers",
        together(config_model(vocab_size=96), drafter(), edit_weights(without_layers, "eagle/model.safetensors")),
    ),
    "eagle-drafter-layer-numbering": Twin(
        TINY + "heads: {eagle: {path: eagle}}  # <-\n",
        "drafter layer indices [1] are not 0..0",
        together(drafter(), edit_weights(renamed_layer, "eagle/model.safetensors")),
        model=True,
    ),
    "heads-training-data-missing": Twin(
        PRESET + "heads:\n  medusa:\n    num_heads: 2\n    train: {init: random, data: missing.txt}  # <-\n",
        "missing.txt: not found",
    ),
    "heads-training-init-missing": Twin(
        PRESET + "heads:\n  medusa:\n    path: heads  # <-\n    num_heads: 2\n    train: {init: base}\n",
        "no heads there to warm-start from",
    ),
    "heads-training-init-not-compact": Twin(  # FasterDecoding's folder: init: base trains from compact heads only
        TINY + "heads:\n  medusa:\n    path: medusa\n    train: {init: base}  # <-\n",
        "init: base needs specdeploy's compact Medusa heads",
        medusa_heads(hidden=64),
        model=True,
    ),
    # adapters x base x engine
    "adapter-not-a-folder": Twin(
        "name: p\nmodel: {path: m, adapter: nowhere}  # <-\n", "adapter folder not found", config_model()
    ),
    "adapter-without-weights": Twin(
        "name: p\nmodel: {path: m, adapter: a}  # <-\n",
        "no adapter_model.safetensors or adapter_model.bin",
        together(config_model(), file("a/adapter_config.json", ADAPTER)),
    ),
    "adapters-on-an-fp8-base": Twin(
        "name: p\nmodel: {path: m, adapter: a}  # <-\ntarget: reference\n",
        "is an FP8 checkpoint; merge adapters into the unquantized base",
        together(
            config_model(),
            file("m/hf_quant_config.json", MODELOPT_FP8),
            file("a/adapter_config.json", ADAPTER),
            file("a/adapter_model.safetensors", ""),
        ),
    ),
    "adapter-rank-disagrees": Twin(
        TINY.replace("dtype: float32}", "dtype: float32, adapter: a}  # <-"),
        "rank does not match r=2",
        adapter_on_tiny(r=2),
        model=True,
    ),
    "adapter-targets-a-module-the-base-lacks": Twin(
        TINY.replace("dtype: float32}", "dtype: float32, adapter: a}  # <-"),
        "is absent from the base model",
        adapter_on_tiny(target_modules=["q_proj", "v_proj", "down_proj", "c_attn"]),
        model=True,
    ),
    "shared-lora-with-dora": Twin(
        SHARED_LORA, "DoRA (use_dora)", file("a/adapter_config.json", ADAPTER | {"use_dora": True})
    ),
    "shared-lora-with-modules-to-save": Twin(
        SHARED_LORA,
        "modules_to_save ['lm_head']",
        file("a/adapter_config.json", ADAPTER | {"modules_to_save": ["lm_head"]}),
    ),
    "shared-lora-outside-the-plugin-modules": Twin(
        SHARED_LORA,
        "['embed_tokens'] are not LoRA plugin modules",
        file("a/adapter_config.json", ADAPTER | {"target_modules": ["embed_tokens"]}),
    ),
    "shared-lora-targeting-no-projection": Twin(
        SHARED_LORA,
        "targets none of the decoder projections",
        file("a/adapter_config.json", ADAPTER | {"target_modules": "nothing.*"}),
    ),
    # the build's flags
    "unknown-extra-flag": Twin(PRESET + "build:\n  extra_flags: {bogus_flag: 1}  # <-\n", "not a trtllm-build"),
}


@pytest.fixture
def inputs_for(request, tmp_path):
    """Write a twin's inputs into tmp_path (where the cli fixture's spec lives)."""

    def write(case: Twin) -> None:
        if case.model:
            request.getfixturevalue("model")  # tests/preflight_fixtures.py: tmp_path/model
        if case.files is not None:
            case.files(tmp_path)

    return write


@pytest.mark.parametrize("name", sorted(TWINS))
def test_twin_is_refused_by_validate(name, cli, write_spec, inputs_for):
    case = TWINS[name]
    marked = [i for i, line in enumerate(case.spec.splitlines(), 1) if line.endswith("# <-")]
    assert len(marked) == 1, "mark the line validate must name with '# <-'"
    inputs_for(case)
    rc, _, err = cli("validate", str(write_spec(case.spec)))
    errors = [line for line in err.splitlines() if line.startswith("error: ") or re.match(r"\S+spec\.yaml:\d+", line)]
    assert rc == 2, err
    hits = [line for line in errors if case.expect in line]
    assert hits, err
    assert any(re.search(rf"spec\.yaml:{marked[0]}:\d+ ", line) for line in hits), err
