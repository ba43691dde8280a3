"""A spec's Triton model repositories written on any host, without engines, for review before GPU time.

``specdeploy build SPEC --dry-run --repository DIR`` writes into DIR what the package stages will
write under ``triton_repo/`` on the GPU host, from the same plan and the same code:
``DIR/<variant>/`` for every variant and, for a spec of several variants that fit one server,
``DIR/<spec>/``. Every config.pbtxt, the Python models' model.py and the repository manifests
are byte for byte the package stage's, so a release pipeline can diff them against the last
release, and a test (or NVIDIA's ``fill_template.py``-style checks) can read them.

Two things come from the weights, and are only there when they are on this host: the tokenizer
copies under ``preprocessing/tokenizer`` and ``postprocessing/tokenizer``, and the chat template
the preprocessing config carries (``specdeploy_chat_template``). ``DIR/specdeploy-review.json``
says which variants have them. The engines are not checked (there are none here): the package
stage checks each against the plan on the GPU host.

On a target without engines (``pytorch``) ``DIR/<variant>/`` holds what its package stage writes:
``extra_llm_api_options.yaml`` and ``serve.json`` (:mod:`pipeline.llm_api.deployment`).

DIR is specdeploy's: it must be absent, empty, or an earlier review (it holds
``specdeploy-review.json``); anything else there is refused (exit 4), never deleted. The whole
folder is written aside and renamed into place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline import targets
from pipeline.fleet.placement import sharing_problem
from pipeline.io.atomic import check_replaceable, remove_path, replace_folder
from pipeline.llm_api.deployment import emit_deployment
from pipeline.plan.types import Plan, VariantPlan
from pipeline.triton.repository import TOKENIZER_REQUIRED, emit_repository
from pipeline.triton.spec_repository import emit_spec_repository

MARKER = "specdeploy-review.json"


def tokenizer_on_this_host(variant: VariantPlan) -> Path | None:
    """The folder the package stage copies the tokenizer from, when it holds one here."""
    folder = Path(variant.stage("package").inputs["tokenizer"])
    return folder if any((folder / name).is_file() for name in TOKENIZER_REQUIRED) else None


def write_review(plan: Plan, out: Path, variants: list[VariantPlan]) -> dict:
    """Write the repositories of ``variants`` (and, when every variant is asked for, the whole-spec
    repository) into ``out``; the summary that ``MARKER`` holds."""
    out = Path(out)
    check_replaceable(out, "--repository", lambda folder: (folder / MARKER).is_file())  # an earlier review
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.review-{os.getpid()}"
    if os.path.lexists(tmp):
        remove_path(tmp)
    tmp.mkdir()
    summary: dict = {"spec": str(plan.spec_file), "repositories": []}
    try:
        for variant in variants:
            package = variant.stage("package")
            if not targets.definition(variant.target).builds_engines:  # the LLM API's files (target pytorch)
                (tmp / package.output.name).mkdir()
                emit_deployment(variant, package, tmp / package.output.name)
                summary["repositories"].append(
                    {"name": package.output.name, "variant": variant.name, "tokenizer": None}
                )
                continue
            tokenizer = tokenizer_on_this_host(variant)
            emit_repository(
                variant,
                tmp / package.output.name,
                engine_dir=variant.stage("build").output,
                tokenizer_dir=tokenizer,
                check_engine_config=False,
                lora_task_id=package.params.get("lora_task_id"),
            )
            summary["repositories"].append(
                {"name": package.output.name, "variant": variant.name, "tokenizer": tokenizer is not None}
            )
        whole = len(variants) == len(plan.variants) and plan.repository is not None
        if whole and plan.repository is not None and sharing_problem(plan) is None:
            name = plan.repository.output.name
            emit_spec_repository(plan, tmp / name, packaged_root=tmp, check_engines=False)
            summary["repositories"].append({"name": name, "variant": None, "tokenizer": None})
        (tmp / MARKER).write_text(json.dumps(summary, indent=2) + "\n")
        replace_folder(tmp, out)
    finally:
        if os.path.lexists(tmp):
            remove_path(tmp)
    return summary
