"""The Kubernetes manifests pass Checkov's Kubernetes policies (``checkov --framework kubernetes``), but for
the few the deployment departs from on purpose, each with its reason.

Checkov (bridgecrewio/checkov, from PyPI) runs from its own virtual environment, ``.venv-policy``
(``make policy-tools``; ``make test`` installs it), because its pins conflict with specdeploy's. The
manifests are written as a user who sets the ``deploy:`` section for production would have them: a
namespace of their own and images pinned by digest (the defaults are ``default`` and a tag, which
Checkov's CKV_K8S_21 and CKV_K8S_43 flag, as they should).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, Plan
from pipeline.release.kubernetes import write_deploy
from pipeline.spec.document import load_spec
from tests.conftest import REPO

CHECKOV = REPO / ".venv-policy" / "bin" / "checkov"
DIGEST = "@sha256:" + "0123456789abcdef" * 4
# The policies the manifests do not meet, on purpose.
ACCEPTED = {
    "CKV_K8S_11": "no CPU limit: CFS throttling stalls a latency-bound server; CPUs are requested (2 per GPU)",
    "CKV_K8S_40": "uid 1000 is triton-server, the unprivileged user of NVIDIA's image (deploy.run_as_user)",
}
SPECS = ("llama70b-eagle.yaml", "llama8b-lora-fleet.yaml", "llama8b-lora-fleet-pytorch.yaml")

pytestmark = pytest.mark.skipif(not CHECKOV.exists(), reason="checkov is not installed: make policy-tools")


def production(plan: Plan) -> Plan:
    """The plan with a deploy: section as production sets it: its namespace, images pinned by digest, the front."""
    update = {
        "namespace": "llm-serving",
        "image": f"registry.example/tritonserver{DIGEST}",
        "front_image": f"registry.example/specdeploy-front{DIGEST}",
    }
    variants = tuple(dataclasses.replace(v, deploy=v.deploy.model_copy(update=update)) for v in plan.variants)
    return dataclasses.replace(plan, variants=variants)


def failed_checks(folder: Path) -> list[dict]:
    done = subprocess.run(
        [str(CHECKOV), "-d", str(folder), "--framework", "kubernetes", "--output", "json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: some check failed
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    return [check for report in reports for check in report.get("results", {}).get("failed_checks", [])]


@pytest.mark.parametrize("spec", SPECS)
def test_the_manifests_pass_checkovs_kubernetes_policies(spec, tmp_path):
    plan = make_plan(
        load_spec(REPO / "specs" / spec),
        OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache"),
    )
    folder, _ = write_deploy(production(plan), tmp_path / "engines", whole_spec=plan.repository is not None)
    assert folder is not None
    failed = failed_checks(folder)
    unexpected = sorted(
        {f"{c['check_id']} {c['check_name']} ({c['resource']})" for c in failed if c["check_id"] not in ACCEPTED}
    )
    assert unexpected == [], "\n".join(unexpected)


def test_the_checker_finds_what_the_policies_forbid(tmp_path):
    """Checkov runs and reports: a pod with none of the hardening fails the checks the manifests pass."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare", "namespace": "llm-serving"},
        "spec": {"containers": [{"name": "c", "image": "registry.example/triton:latest"}]},
    }
    (tmp_path / "pod.yaml").write_text(json.dumps(pod))
    ids = {check["check_id"] for check in failed_checks(tmp_path)}
    assert {"CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_28", "CKV_K8S_43"} <= ids, ids
