"""The Triton contract page, read off :mod:`pipeline.triton.contract`.

Per model of the repository: every input and output tensor of NVIDIA's TensorRT-LLM 1.2.1
``inflight_batcher_llm`` templates (data type, dims without the batch dimension, optional,
reshape, ragged batching), the ensemble's wiring, the data types chosen for the templates'
variables, and the tensors specdeploy adds.
"""

from __future__ import annotations

from pipeline.docs_gen.markdown import GENERATED_NOTE, code, paragraph, rst_to_markdown, table
from pipeline.triton import backend_reads, contract
from pipeline.triton.contract import Tensor

ENSEMBLE_STEPS = (
    ("preprocessing", contract.PREPROCESSING_STEP_INPUTS, contract.PREPROCESSING_STEP_OUTPUTS),
    ("tensorrt_llm", contract.TENSORRT_LLM_STEP_INPUTS, contract.TENSORRT_LLM_STEP_OUTPUTS),
    ("postprocessing", contract.POSTPROCESSING_STEP_INPUTS, contract.POSTPROCESSING_STEP_OUTPUTS),
)


def _names(names: frozenset[str]) -> str:
    return " and ".join(code(n) for n in sorted(names, reverse=True))


def dims(tensor: Tensor) -> str:
    return "[" + ", ".join(str(d) for d in tensor.dims) + "]"


def data_type(tensor: Tensor) -> str:
    resolved = contract.data_type(tensor)
    return code(resolved) if resolved == tensor.data_type else f"{code(resolved)} ({code(tensor.data_type)})"


def reshape(tensor: Tensor) -> str:
    if tensor.reshape is None:
        return ""
    return "[" + ", ".join(str(d) for d in tensor.reshape) + "]"


def _inputs(tensors: tuple[Tensor, ...]) -> str:
    rows = [
        [
            code(t.name),
            data_type(t),
            dims(t),
            "yes" if t.optional else "**required**",
            reshape(t),
            "yes" if t.ragged else "",
        ]
        for t in tensors
    ]
    return table(["input", "data type", "dims", "optional", "reshape", "ragged batch"], rows)


def _outputs(tensors: tuple[Tensor, ...]) -> str:
    return table(["output", "data type", "dims"], [[code(t.name), data_type(t), dims(t)] for t in tensors])


def _extensions(model: str) -> list[str]:
    rows = []
    for extension in contract.EXTENSIONS.get(model, ()):
        when = "Lookahead models only" if extension.lookahead_only else "always"
        rows += [[code(t.name), "input", data_type(t), dims(t), when] for t in extension.inputs]
        rows += [[code(t.name), "output", data_type(t), dims(t), when] for t in extension.outputs]
    if not rows:
        return []
    return ["", "Added by specdeploy:", "", table(["tensor", "kind", "data type", "dims", "declared"], rows)]


def render() -> str:
    # The module's own account: what the contract is, where it comes from, what it was checked against.
    blocks = [b for b in (contract.__doc__ or "").strip().split("\n\n")]
    intro = paragraph(rst_to_markdown("\n\n".join(blocks[:2] + [b for b in blocks if b.startswith("Checked")])))
    out = [
        GENERATED_NOTE.format(source="`pipeline/triton/contract.py`"),
        "",
        "# Triton contract",
        "",
        intro,
        "",
        "Dims exclude the batch dimension (every model has `max_batch_size` > 0). A reshape of `[]` is "
        "`reshape: { shape: [ ] }`: sent as `[batch, 1]`, seen by the model as `[batch]`. Data types that "
        "NVIDIA's templates leave to a template variable are shown as the type specdeploy emits, with the "
        "variable after it:",
        "",
        table(["template variable", "emitted as"], [[code(k), code(v)] for k, v in contract.VARIABLE_TYPES.items()]),
        "",
        "`${lora_weights_data_type}` is specdeploy's, where NVIDIA's templates fix `TYPE_FP16`: TensorRT-LLM "
        "1.2.1 takes LoRA weights only in the engine's dtype, so the repository of a float32 engine declares "
        "`FP32` (and the lora stage writes its adapters so), every other one `FP16` as NVIDIA's.",
        "",
        f"One narrowing: the models of a LoRA engine withhold {_names(contract.CLIENT_ADAPTER_INPUTS)} (a "
        "client's own adapter) unless its variant sets `serving.lora_client_adapters: true`, and a shared "
        'fine-tune\'s models always do: Triton refuses such a request ("unexpected inference input") before '
        "any backend sees it, so the deployed fine-tunes' prefetched adapters cannot be evicted by what "
        "clients send. Clients reach a deployed fine-tune by its `lora_task_id` or its own model name.",
        "",
        "How the CPU reference backend answers these tensors, and what it refuses, is under "
        "[The Triton contract on CPU](../concepts/reference-backend.md#the-triton-contract-on-cpu).",
    ]
    for model, (inputs, outputs) in contract.CONTRACT.items():
        out += ["", f"## `{model}` {{#{model}}}", "", _inputs(inputs), "", _outputs(outputs)]
        out += _extensions(model)
    out += [
        "",
        "## The ensemble's steps {#ensemble-steps}",
        "",
        "How the ensemble wires its steps, as NVIDIA's `ensemble/config.pbtxt` maps them: each step's model "
        "tensor and the ensemble tensor it reads or writes (names starting with `_` are internal to the ensemble).",
    ]
    for model, step_inputs, step_outputs in ENSEMBLE_STEPS:
        rows = [[code(k), "input", code(v)] for k, v in step_inputs.items()]
        rows += [[code(k), "output", code(v)] for k, v in step_outputs.items()]
        out += ["", f"Step `{model}`:", "", table(["model tensor", "kind", "ensemble tensor"], rows)]
    out += _parameters()
    return "\n".join(out).rstrip() + "\n"


def _parameters() -> list[str]:
    """The tensorrt_llm model's parameters: what NVIDIA's C++ backend reads, from backend_reads.json."""
    table_ = backend_reads.load_table()
    source = table_.source
    doc = (backend_reads.__doc__ or "").strip().split("\n\n")
    rows = []
    for read in table_.reads:
        need = backend_reads.CONDITIONS[read.condition][0]
        need = f"**required** {need}" if read.required else "optional (a default)"
        if read.key in backend_reads.REFUSED_KEYS:
            need = "refused"
        values = ", ".join(code(v) for v in read.choices or ()) + (' (`""`: not set)' if read.placeholder else "")
        rows.append([code(read.key), code(read.type), need, values, f"`{read.file}:{read.line}`"])
    return [
        "",
        "## The `tensorrt_llm` model's parameters {#parameters}",
        "",
        rst_to_markdown("\n\n".join(doc[1:4])),
        "",
        f"Read at {source['repository']} `{source['path']}` @ {source['commit']} by "
        "`scripts/extract_backend_reads.py`; "
        "`tests/triton/test_backend_reads.py` holds every repository the shipped specs give to this table "
        "(`specdeploy build SPEC --dry-run --repository DIR` writes them).",
        "",
        table(["key", "C++ type", "read", "values it acts on", "where"], rows),
    ]
