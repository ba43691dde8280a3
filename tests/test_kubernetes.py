"""The Kubernetes manifests (pipeline/release/kubernetes.py) against the Kubernetes 1.30 API schema.

Deployment and Service are checked with kubernetes-validate (the API's OpenAPI schemas, shipped in
the package, strict: unknown fields are errors). The PodMonitor is a prometheus-operator CRD that
kubernetes-validate does not know, and kustomization.yaml is not an API object: both are checked
field by field here, against what the Deployment they select declares.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pipeline.errors import InputError
from pipeline.plan.planner import make_plan
from pipeline.plan.types import OutputRoots, Plan
from pipeline.release.kubernetes import DEPLOY_FOLDER, FILES, in_pod, write_deploy
from pipeline.spec.document import load_spec
from pipeline.triton.launch_gpu import gpu_spec_launch_argv
from tests.conftest import REPO

KUBERNETES = "1.30"  # the oldest release kubernetes-validate ships with gRPC probes GA (1.27+)
SPECS = REPO / "specs"
DUO = """\
name: duo
model: {path: /nonexistent/llama-1b, preset: llama-3.2-1b}
gpu: {type: h100-sxm-80gb, count: 2}
build: {max_batch_size: 8, max_input_len: 512, max_seq_len: 1024, max_num_tokens: 4096}
deploy: {namespace: llm, volume_claim: fleet-models, image: registry.example/triton:26.04, replicas: 3,
         mount_path: /mnt/release}
variants:
  - name: chat_a
  - name: chat.b
"""


def plan_of(spec: Path, tmp_path: Path) -> Plan:
    return make_plan(load_spec(spec), OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache"))


def written(plan: Plan, tmp_path: Path, whole_spec: bool) -> dict[str, list[dict]]:
    folder, notes = write_deploy(plan, tmp_path / "engines", whole_spec)
    assert folder == tmp_path / "engines" / plan.spec_name / DEPLOY_FOLDER and not notes
    assert sorted(p.name for p in folder.iterdir()) == sorted((*FILES, "kustomization.yaml"))
    return {p.name: list(yaml.safe_load_all(p.read_text())) for p in folder.iterdir()}


def check_valid(files: dict[str, list[dict]]) -> None:
    """Every object valid for KUBERNETES; the PodMonitors and the kustomization checked by hand."""
    for name in ("deployment.yaml", "service.yaml", "networkpolicy.yaml"):
        for document in files[name]:
            assert kubernetes_validate.validate(document, KUBERNETES, strict=True) == KUBERNETES
    (kustomization,) = files["kustomization.yaml"]
    assert kustomization == {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": files["deployment.yaml"][0]["metadata"]["namespace"],
        "resources": list(FILES),
    }
    for deployment, service, monitor, policy in zip(*(files[name] for name in FILES), strict=True):
        pod = deployment["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert service["spec"]["selector"].items() <= labels.items()
        (container,) = pod["spec"]["containers"]
        port_names = {port["name"] for port in container["ports"]}
        assert {port["targetPort"] for port in service["spec"]["ports"]} <= port_names
        # Connections in on the served and scraped ports only.
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = policy["spec"]["ingress"]
        assert {p["port"] for p in rule["ports"]} == {p["containerPort"] for p in container["ports"]}
        # PodMonitor (monitoring.coreos.com/v1): the fields its CRD requires and what they select.
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
        assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
        assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
        assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s"}
        assert "metrics" in port_names


def test_one_variant_deployment_has_the_plans_gpus_memory_probes_and_volume(tmp_path):
    plan = plan_of(SPECS / "llama70b-eagle.yaml", tmp_path)
    (variant,) = plan.variants
    files = written(plan, tmp_path, whole_spec=False)
    check_valid(files)
    (deployment,) = files["deployment.yaml"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["metadata"]["namespace"] == "default" and deployment["spec"]["replicas"] == 1
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == variant.world_size == 4
    assert variant.serve_resources is not None
    assert resources["requests"]["memory"] == f"{math.ceil(variant.serve_resources.host_memory_gib * 1024)}Mi"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
    ]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}  # docker run --shm-size=2g
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "specdeploy-models", "readOnly": True}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["dshm"]["mountPath"] == "/dev/shm" and mounts["models"]["mountPath"] == "/models"
    grpc = variant.serving.grpc_port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # gRPC health: HTTP stays off
        assert container[probe]["grpc"] == {"port": grpc}
    assert "--allow-http=false" in container["args"] and "--grpc-address=0.0.0.0" in container["args"]
    assert f"--model-repository=/models/triton_repo/{variant.name}" in container["args"]
    assert container["args"].count("-n") == 4  # one tritonserver per rank, all in this pod
    (service,) = files["service.yaml"]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "grpc": grpc,
        "metrics": variant.serving.metrics_port,
    }


def test_container_args_are_the_serve_command_build_dry_run_prints(cli, tmp_path):
    spec = SPECS / "llama8b-fleet.yaml"  # four variants that cannot share GPUs: one Deployment each
    plan = plan_of(spec, tmp_path)
    files = written(plan, tmp_path, whole_spec=False)
    check_valid(files)
    rc, out, _ = cli("build", str(spec), "--dry-run")
    assert rc == 0
    lines = out.splitlines()
    printed = [shlex.split(lines[i + 1]) for i, line in enumerate(lines) if line.startswith("# serve in Kubernetes")]
    deployments = files["deployment.yaml"]
    assert [d["metadata"]["name"] for d in deployments] == [v.name for v in plan.variants]
    assert printed == [d["spec"]["template"]["spec"]["containers"][0]["args"] for d in deployments]


def test_whole_spec_repository_runs_in_one_pod_with_the_deploy_section(cli, write_spec, tmp_path):
    spec = write_spec(DUO)
    plan = plan_of(spec, tmp_path)
    files = written(plan, tmp_path, whole_spec=True)
    check_valid(files)
    (deployment,) = files["deployment.yaml"]
    assert deployment["metadata"] == {
        "name": "duo",
        "namespace": "llm",
        "labels": {
            "app.kubernetes.io/name": "specdeploy",
            "app.kubernetes.io/instance": "duo",
            "app.kubernetes.io/part-of": "duo",
        },
    }
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/triton:26.04"
    # The launcher's own argv for the whole-spec repository, under the deployment's mount path.
    first = in_pod(plan.variants[0])
    assert container["args"] == gpu_spec_launch_argv(plan, first, Path("/mnt/release/triton_repo/duo"))
    assert container["args"][:3] == ["env", "TRTLLM_ORCHESTRATOR=1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1"]
    rc, out, _ = cli("build", str(spec), "--dry-run")
    lines = out.splitlines()
    assert rc == 0 and shlex.split(lines[lines.index("# serve the whole spec in Kubernetes") + 1]) == container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2  # the placement puts a variant per GPU
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "fleet-models"
    assert files["kustomization.yaml"][0]["namespace"] == "llm"


def test_deploy_section_is_checked_where_it_is_written(write_spec, tmp_path):
    bad = DUO.replace("namespace: llm", "namespace: Prod_NS").replace("mount_path: /mnt/release", "mount_path: mnt")
    with pytest.raises(InputError) as error:
        load_spec(write_spec(bad))
    lines = str(error.value).splitlines()
    assert any(":5:" in line and "deploy.namespace" in line for line in lines), lines
    assert any("deploy.mount_path" in line and "absolute" in line for line in lines), lines


def test_variants_must_share_one_deploy_section(write_spec, tmp_path):
    spec = write_spec(DUO.replace("  - name: chat.b", "  - name: chat.b\n    deploy: {replicas: 1}"))
    with pytest.raises(InputError) as error:  # at plan time, before anything is built
        plan_of(spec, tmp_path)
    assert str(error.value) == (
        f"{spec}:10:5 variants[1].deploy: differs from variant chat_a's; a spec deploys to one namespace and "
        "volume claim: set deploy: once, at the top of the spec [variant chat.b]"
    )


def test_reference_variants_get_no_deployment(tmp_path):
    plan = plan_of(SPECS / "smollm2-lookahead.yaml", tmp_path)
    folder, notes = write_deploy(plan, tmp_path / "engines", whole_spec=False)
    assert folder is None and not (tmp_path / "engines").exists()
    assert notes == ["smollm2-lookahead: target reference (the CPU reference backend) has no GPU deployment"]


def test_a_second_write_replaces_the_folder_whole(write_spec, tmp_path):
    write_deploy(plan_of(write_spec(DUO), tmp_path), tmp_path / "engines", whole_spec=True)
    (tmp_path / "engines" / "duo" / DEPLOY_FOLDER / "stale.yaml").write_text("kind: Old\n")
    plan = plan_of(write_spec(DUO.replace("replicas: 3", "replicas: 5")), tmp_path)
    files = written(plan, tmp_path, whole_spec=True)  # also: only the four files are there
    assert files["deployment.yaml"][0]["spec"]["replicas"] == 5
    assert [p.name for p in (tmp_path / "engines" / "duo").iterdir() if p.name.startswith(".")] == []


def test_engine_writes_deploy_beside_the_release_manifest(cli, write_spec, tmp_path, monkeypatch):
    """`specdeploy engine` on a tensorrt spec (the stand-in trtllm-build of tests/standins.py)."""
    from tests.quantize.conftest import build_tiny_llama
    from tests.standins import fake_tensorrt_llm

    bin_dir, site = fake_tensorrt_llm(tmp_path / "standin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.syspath_prepend(str(site))
    model = build_tiny_llama(tmp_path / "model")
    spec = write_spec(
        f"name: tiny-gpu\nmodel: {{path: {model}, dtype: float32}}\nspeculative: {{method: lookahead}}\n"
        "build: {max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}\n"
        "gpu: {type: l4, count: 1}\n"
    )
    rc, out, err = cli("engine", str(spec))
    assert rc == 0, out + err
    folder = tmp_path / "engines" / "tiny-gpu" / DEPLOY_FOLDER
    assert f"deploy: {folder} (kubectl apply -k {folder})" in out
    files = {p.name: list(yaml.safe_load_all(p.read_text())) for p in folder.iterdir()}
    check_valid(files)
    args = files["deployment.yaml"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--model-repository=/models/triton_repo/tiny-gpu" in args
    config = (tmp_path / "triton_repo" / "tiny-gpu" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert '"/models/engines/tiny-gpu/engine"' in config and str(tmp_path) not in config


# The "restricted" Pod Security Standard's controls (kubernetes.io/docs/concepts/security/
# pod-security-standards, v1.30), as the admission controller checks a pod template: no policy checker
# on PyPI installs here without downgrading this project's dependencies, so the list is written out.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict) -> list[str]:
    problems = []
    pod_context = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    for volume in pod.get("volumes", []):
        if not set(volume) - {"name"} <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}")
    if pod_context.get("sysctls"):
        problems.append("sysctls")
    for container in pod["containers"]:
        context = container.get("securityContext", {})
        name = container["name"]
        if context.get("privileged") or context.get("windowsOptions", {}).get("hostProcess"):
            problems.append(f"{name}: privileged")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{name}: hostPort")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        if "ALL" not in context.get("capabilities", {}).get("drop", []):
            problems.append(f"{name}: capabilities must drop ALL")
        if set(context.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities added")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount")
    return problems


@pytest.mark.parametrize("spec", ["llama70b-eagle.yaml", "llama8b-lora-fleet.yaml"])
def test_pods_meet_the_restricted_pod_security_standard(spec, tmp_path):
    plan = plan_of(SPECS / spec, tmp_path)
    files = written(plan, tmp_path, whole_spec=plan.repository is not None)
    check_valid(files)
    for deployment in files["deployment.yaml"]:
        pod = deployment["spec"]["template"]["spec"]
        assert restricted_violations(pod) == []
        (container,) = pod["containers"]
        # Beyond the standard: nothing of the image is writable, no token, limits from the plan.
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["runAsUser"] == 1000 and pod["automountServiceAccountToken"] is False
        mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
        assert {"/tmp", "/dev/shm"} <= mounts and {"name": "HOME", "value": "/tmp"} in container["env"]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert int(limits["memory"].removesuffix("Mi")) >= int(requests["memory"].removesuffix("Mi")) > 0
        assert int(requests["cpu"]) == 2 * requests["nvidia.com/gpu"]


def test_the_checker_finds_what_the_standard_forbids():
    pod = {"containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False}}]}
    assert restricted_violations(pod) == [
        "c: capabilities must drop ALL",
        "c: runAsNonRoot",
        "c: seccompProfile",
    ]
    pod = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}], "containers": [{"name": "c"}]}
    assert restricted_violations(pod)[:3] == ["hostNetwork", "volume h", "c: allowPrivilegeEscalation must be false"]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("mount_path", "/dev/shm", "/dev"),  # a duplicate mountPath the API server rejects
        ("mount_path", "/etc", "/etc"),  # shadows the image
        ("mount_path", "/usr/local/models", "/usr"),
        ("mount_path", "/tmp", "scratch volume"),  # the pod's scratch emptyDir
        ("mount_path", '"/mo\\ndels"', "control characters"),
        ("mount_path", "/" + "m" * 300, "at most 256"),
        ("image", "Not An Image", "is not an image reference"),
        ("image", "registry.example/triton@sha256:abc", "is not an image reference"),  # a digest is 64 hex
        ("run_as_user", "0", ">= 1"),  # root is never the server's user
        ("namespace", "my_ns", "lowercase letters, digits and '-'"),  # not a folder name's rule
        ("volume_claim", "My.Claim", "lowercase letters, digits, '-' and '.'"),
    ],
)
def test_deploy_values_are_checked_as_what_they_are(field, value, says, write_spec):
    deploy = {"namespace": "llm", "image": "registry.example/triton:26.04", "mount_path": "/models", field: value}
    line = "deploy: {" + ", ".join(f"{key}: {text}" for key, text in deploy.items()) + "}"
    spec = DUO.replace("         mount_path: /mnt/release}\n", "").replace(DUO.splitlines()[4], line)
    with pytest.raises(InputError) as error:
        load_spec(write_spec(spec))
    (line,) = [line for line in str(error.value).splitlines() if f"deploy.{field}" in line]
    assert says in line and "folder name" not in line, line


def test_a_colon_in_mount_path_is_deployed_as_written(write_spec, tmp_path):
    # Kubernetes' ValidateVolumeMounts checks a mountPath for being empty, unique and clear of volumeDevices
    # only (pkg/apis/core/validation/validation.go @ 000f2605; its ':' refusal went with Windows containers,
    # kubernetes/kubernetes#31707); containerd and CRI-O take the ':' as part of the folder's name.
    plan = make_plan(
        load_spec(write_spec(DUO.replace("mount_path: /mnt/release", 'mount_path: "/mnt/re:lease"'))),
        OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache"),
    )
    files = written(plan, tmp_path, whole_spec=True)
    check_valid(files)
    mounts = {
        m["mountPath"]
        for d in files["deployment.yaml"]
        for m in d["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert "/mnt/re:lease" in mounts


def test_an_image_pinned_by_digest_is_deployed_as_written(write_spec, tmp_path):
    image = "registry.example:5000/nvidia/tritonserver:26.04-trtllm-python-py3@sha256:" + "0123456789abcdef" * 4
    plan = make_plan(
        load_spec(write_spec(DUO.replace("registry.example/triton:26.04", image))),
        OutputRoots(tmp_path / "engines", tmp_path / "triton_repo", tmp_path / "cache"),
    )
    files = written(plan, tmp_path, whole_spec=True)
    check_valid(files)
    assert {d["spec"]["template"]["spec"]["containers"][0]["image"] for d in files["deployment.yaml"]} == {image}


FRONT_IMAGE = "registry.example/specdeploy-front:0.1.0"


def with_front_image(plan: Plan, image: str | None) -> Plan:
    """The plan as if its spec's deploy: section set front_image (the shipped spec's paths stay resolvable)."""
    variants = [
        dataclasses.replace(v, deploy=v.deploy.model_copy(update={"front_image": image})) for v in plan.variants
    ]
    return dataclasses.replace(plan, variants=tuple(variants))


def test_a_pytorch_lora_group_s_pod_runs_the_front_beside_trtllm_serve(tmp_path):
    """With deploy.front_image: clients reach each fine-tune by model name through the front, and
    trtllm-serve listens on the pod's loopback only, so no client reaches it past the front."""
    plan = with_front_image(plan_of(SPECS / "llama8b-lora-fleet-pytorch.yaml", tmp_path), FRONT_IMAGE)
    folder, notes = write_deploy(plan, tmp_path / "engines", whole_spec=False)
    assert all("through the front" in note for note in notes) and notes
    deployments = {d["metadata"]["name"]: d for d in yaml.safe_load_all((folder / "deployment.yaml").read_text())}
    services = {d["metadata"]["name"]: d for d in yaml.safe_load_all((folder / "service.yaml").read_text())}
    for document in (*deployments.values(), *services.values()):
        assert kubernetes_validate.validate(document, KUBERNETES, strict=True) == KUBERNETES
    for name, deployment in deployments.items():  # a merged fine-tune's own server has no front
        pod = deployment["spec"]["template"]["spec"]
        assert restricted_violations(pod) == []
        assert [c["name"] for c in pod["containers"]] == (
            ["tritonserver", "front"] if name == "base" else ["tritonserver"]
        )
    server, front = deployments["base"]["spec"]["template"]["spec"]["containers"]
    service = services["base"]
    args = server["args"]
    assert args[0] == "trtllm-serve" and args[args.index("--host") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == "18000" and "ports" not in server
    assert server["livenessProbe"]["exec"]["command"][:2] == ["python3", "-c"]
    assert "http://127.0.0.1:18000/health" in server["livenessProbe"]["exec"]["command"][2]
    base = plan.variants[0]
    port = base.serving.http_port
    assert front["image"] == FRONT_IMAGE
    assert front["args"] == [
        "python",
        "-m",
        "pipeline.llm_api.front",
        f"/models/triton_repo/{base.name}/serve.json",
        "--base",
        base.name,
        "--upstream",
        "http://127.0.0.1:18000",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    assert front["readinessProbe"]["httpGet"] == {"path": "/health", "port": port}
    assert front["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in front["volumeMounts"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(port, "http")]
    assert {p["name"] for p in front["ports"]} == {"http"}


def test_without_a_front_image_the_fine_tunes_are_reached_by_lora_request(tmp_path):
    plan = plan_of(SPECS / "llama8b-lora-fleet-pytorch.yaml", tmp_path)
    folder, notes = write_deploy(plan, tmp_path / "engines", whole_spec=False)
    deployments = {d["metadata"]["name"]: d for d in yaml.safe_load_all((folder / "deployment.yaml").read_text())}
    (server,) = deployments["base"]["spec"]["template"]["spec"]["containers"]
    assert server["args"][server["args"].index("--host") + 1] == "0.0.0.0"
    assert any("set deploy.front_image to reach them by model name" in note for note in notes), notes


def test_a_front_image_without_a_pytorch_lora_group_is_said_to_be_unused(tmp_path):
    plan = with_front_image(plan_of(SPECS / "llama70b-eagle.yaml", tmp_path), FRONT_IMAGE)
    folder, notes = write_deploy(plan, tmp_path / "engines", whole_spec=False)
    assert notes == ["deploy.front_image is unused: no LoRA group of target pytorch runs here"]
    (deployment,) = yaml.safe_load_all((folder / "deployment.yaml").read_text())
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["tritonserver"]
