"""`plan --json` of every shipped spec, as the golden files in ``tests/golden/plans/`` hold it.

The plan is made with the output roots relative to an empty working folder (so nothing a
``make engine`` left in the checkout, such as the embedded model's cache, changes it) and the
checkout's path written as ``<repo>``. ``python -m tests.golden.plans`` rewrites the golden files
after a change that is meant to change a plan; the test then shows the change in review.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted((REPO / "specs").glob("*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "plans"


def plan_json(spec: Path, workdir: Path) -> object:
    """``specdeploy plan SPEC --json`` run in ``workdir``, with the checkout's path as ``<repo>``."""
    from pipeline.commands.plan import plan_with_commands
    from pipeline.plan.preflight import checked_plan
    from pipeline.plan.types import OutputRoots
    from pipeline.spec.document import load_spec

    here = Path.cwd()
    os.chdir(workdir)
    try:
        plan = checked_plan(load_spec(spec), OutputRoots(Path("engines"), Path("triton_repo"), Path(".cache")))
        text = json.dumps(plan_with_commands(plan), sort_keys=True)
    finally:
        os.chdir(here)
    return json.loads(text.replace(str(REPO), "<repo>"))


def golden_path(spec: Path) -> Path:
    return GOLDEN / f"{spec.stem}.json.gz"


def read_golden(spec: Path) -> object:
    return json.loads(gzip.decompress(golden_path(spec).read_bytes()))


def write_golden(spec: Path, data: object) -> None:
    text = json.dumps(data, indent=1, sort_keys=True).encode()
    golden_path(spec).write_bytes(gzip.compress(text, mtime=0))


def main() -> int:
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    for spec in SPECS:
        with tempfile.TemporaryDirectory() as work:
            write_golden(spec, plan_json(spec, Path(work)))
        print(golden_path(spec).relative_to(REPO), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
