"""Which spec an output folder belongs to: outputs of different specs never share a folder.

Two specs may name a variant alike (``base`` in both fleet specs), and both would build
``engines/base``; the second run found "engine does not match the plan" and its suggested
``--force`` destroyed the first spec's engine. So each output root (the engines folder, the Triton
repository folder) keeps ``.specdeploy-owners.json``: folder name -> the spec that writes it (its
name and file). Before a run writes anything, every folder its plan writes is claimed; a folder
another spec owns is refused (exit 4) naming both specs and what to do. A folder with no owner
yet (outputs of an earlier version, or new) is claimed quietly.

Example: ``specs/smollm2-fleet.yaml`` built, then ``specs/smollm2-lora-fleet.yaml``::

    engines/base belongs to spec smollm2-fleet (specs/smollm2-fleet.yaml); smollm2-lora-fleet
    (specs/smollm2-lora-fleet.yaml) would write it too: give this spec another --engines-dir, or
    rename the variant (to hand the folder over, remove its entry from engines/.specdeploy-owners.json)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.errors import HostFilesystemError
from pipeline.plan.types import Plan, StagePlan

OWNERS_FILE = ".specdeploy-owners.json"


def _folder(stage: StagePlan) -> tuple[Path, str]:
    """(output root, the folder under it that ``stage`` writes into)."""
    if stage.name == "package":  # triton_repo/<variant> itself
        return stage.output.parent, stage.output.name
    return stage.output.parent.parent, stage.output.parent.name  # engines/<variant>/<stage>


def folders(plan: Plan, only: set[str] | None = None, stages: set[str] | None = None) -> dict[Path, set[str]]:
    """Every output root the plan writes into, with the folders under it (``only``: these variants';
    ``stages``: these stages' only)."""
    found: dict[Path, set[str]] = {}
    for variant in plan.variants:
        if only and variant.name not in only:
            continue
        for stage in variant.stages:
            if stages is None or stage.name in stages:
                root, name = _folder(stage)
                found.setdefault(root, set()).add(name)
    if plan.repository is not None and not only and stages is None:
        found.setdefault(plan.repository.output.parent, set()).add(plan.repository.output.name)
    return found


def _read(root: Path) -> dict[str, dict[str, str]]:
    """The root's owners; {} when it has no file yet. A file that is not an owners table is refused: read
    as empty, it would let any spec claim (and replace) every folder under the root."""
    path = root / OWNERS_FILE
    try:
        owners = json.loads(path.read_text())
    except OSError:  # none yet, or unreadable here (another user's read-only mount: nothing is written either)
        return {}
    except ValueError:
        owners = None
    if not isinstance(owners, dict):
        raise HostFilesystemError(
            f"{path}: not the table of which spec owns each folder (damaged?); check the folders under "
            f"{root} belong to one spec each, then remove the file to start it over"
        )
    return owners


def claim_outputs(plan: Plan, only: set[str] | None = None, stages: set[str] | None = None) -> None:
    """Claim every folder ``plan`` writes for its spec (``stages``: only these stages'); HostFilesystemError
    naming both specs for a folder another spec owns, before anything is written."""
    me = {"spec": plan.spec_name, "file": str(plan.spec_file)}
    claims = folders(plan, only, stages)
    clashes = []
    for root, names in sorted(claims.items()):
        owners = _read(root)
        for name in sorted(names):
            owner = _foreign(owners.get(name), plan.spec_name)
            if owner is not None:
                clashes.append(
                    f"{root / name} belongs to spec {owner}; {plan.spec_name} ({plan.spec_file}) would write it too"
                )
    if clashes:
        raise HostFilesystemError(
            "; ".join(clashes) + ": give this spec other output folders (--engines-dir, --triton-repo), or rename "
            f"the variant (to hand a folder over, remove its entry from {OWNERS_FILE} in its root)"
        )
    for root, names in claims.items():
        owners = _read(root)
        if all(owners.get(name) == me for name in names):
            continue
        owners.update({name: me for name in names})
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = root / f".{OWNERS_FILE}.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(owners, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, root / OWNERS_FILE)
        except OSError:
            pass  # a read-only root (a verification job): nothing will be written there either


def foreign_owner(folder: Path, spec_name: str) -> str | None:
    """The spec (``name (file)``) that owns ``folder`` when it is not ``spec_name``; None otherwise."""
    return _foreign(_read(folder.parent).get(folder.name), spec_name)


def _foreign(owner: object, spec_name: str) -> str | None:
    """``owner`` (a folder's entry in its root's owners table) as ``name (file)`` when it is another spec."""
    if isinstance(owner, dict) and owner.get("spec") not in (None, spec_name):
        return f"{owner['spec']} ({owner.get('file', '?')})"
    return None
