"""Kubernetes manifests that run a packaged repository in NVIDIA's Triton TensorRT-LLM container.

``specdeploy engine`` writes them into ``engines/<spec>/deploy/`` (:func:`write_deploy`), beside the
release manifest, once every variant is packaged; ``kubectl apply -k engines/<spec>/deploy/`` applies:

* ``deployment.yaml``: one Deployment per served repository (the whole-spec repository when the
  spec has one, else each variant's of target ``tensorrt``), ``deploy.replicas`` pods, each one
  whole server: ``nvidia.com/gpu`` = its GPUs (tp x pp, or every GPU the fleet placement uses),
  node affinity on GPU feature discovery's ``nvidia.com/gpu.product`` for the plan's GPU type,
  a memory request of the plan's serve resources (limit 1.25x it), two CPUs requested per GPU,
  the "restricted" Pod Security Standard (non-root as ``deploy.run_as_user``, read-only root file
  system with ``/tmp`` an emptyDir, no privilege escalation or capabilities, the runtime's seccomp
  profile, no service-account token), ``/dev/shm`` a 2 GiB in-memory emptyDir (the
  README's ``docker run --shm-size=2g``), the claim ``deploy.volume_claim`` mounted read-only at
  ``deploy.mount_path`` (``engines/`` and ``triton_repo/`` under it), and startup, readiness and
  liveness probes over gRPC health (``grpc.health.v1``, which tritonserver serves on its gRPC port;
  Kubernetes' native gRPC probes are GA since 1.27), so HTTP stays off;
* ``service.yaml``: a ClusterIP Service with the gRPC and metrics ports;
* ``podmonitor.yaml``: a prometheus-operator PodMonitor scraping ``/metrics``;
* ``networkpolicy.yaml``: a NetworkPolicy per server letting connections in on its serving and metrics
  ports only (egress is left open: a cluster's DNS and registries differ);

On the PyTorch-backend target the container runs ``trtllm-serve`` (:func:`pipeline.llm_api.deployment.
launch_argv`): its HTTP port in the Service, HTTP probes on ``/health``, no PodMonitor, and one server
per LoRA group (its fine-tunes are reached by their ``lora_request``, listed in its ``serve.json``).
With ``deploy.front_image`` a LoRA group's pod runs the name-routing front (:mod:`pipeline.llm_api.front`)
as a second container on the Service's port, and trtllm-serve on the pod's loopback
(:data:`FRONT_UPSTREAM_PORT`), probed there by the image's own Python: every fine-tune is then reached
by its ``model`` name, and no client reaches trtllm-serve past the front.
* ``kustomization.yaml``: the others, in ``deploy.namespace``.

The container runs exactly :mod:`pipeline.triton.launch_gpu`'s argv (what ``specdeploy build
--dry-run`` prints as the Kubernetes serve command, :func:`launch_argv`), bound to all of the pod's
addresses, as ``args``: the image's own entrypoint (NVIDIA's, which sets up CUDA forward
compatibility) runs it. A server whose ranks span several pods (one MPI world over nodes, a
StatefulSet) is out of scope: every rank runs in one pod. Nothing here talks to a cluster.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from pipeline import targets
from pipeline.errors import InputError
from pipeline.fleet.placement import place_fleet
from pipeline.io.atomic import remove_path, replace_folder
from pipeline.llm_api.deployment import HEALTH_PATH, SERVE_FILE, lora_members
from pipeline.llm_api.deployment import launch_argv as llm_api_launch_argv
from pipeline.plan.types import Plan, VariantPlan
from pipeline.spec.deploy import DeploySpec
from pipeline.triton.launch_gpu import gpu_launch_argv, gpu_spec_launch_argv

DEPLOY_FOLDER = "deploy"  # engines/<spec>/deploy/
POD_ADDRESS = "0.0.0.0"  # in a pod the server must answer on the pod's IP, not only on loopback
SHM_SIZE = "2Gi"  # the README's docker run --shm-size=2g
FILES = ("deployment.yaml", "service.yaml", "podmonitor.yaml", "networkpolicy.yaml")
# GPU feature discovery labels nodes with the NVML product name, spaces as dashes
# (NVIDIA/k8s-device-plugin, gpu-feature-discovery: nvidia.com/gpu.product); one GPU type can
# report several names (SXM and PCIe boards, driver spellings). Check yours with
# `kubectl get nodes -L nvidia.com/gpu.product`.
GPU_PRODUCTS: dict[str, tuple[str, ...]] = {
    "a10g": ("NVIDIA-A10G",),
    "a100-40gb": ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
    "a100-80gb": ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
    "l4": ("NVIDIA-L4",),
    "l40s": ("NVIDIA-L40S",),
    "rtx-4090": ("NVIDIA-GeForce-RTX-4090",),
    "rtx-6000-ada": ("NVIDIA-RTX-6000-Ada-Generation",),
    "h100-pcie-80gb": ("NVIDIA-H100-PCIe",),
    "h100-sxm-80gb": ("NVIDIA-H100-80GB-HBM3",),
    "h100-nvl-94gb": ("NVIDIA-H100-NVL",),
    "h200-141gb": ("NVIDIA-H200",),
    "gh200-96gb": ("NVIDIA-GH200-480GB",),
    "b200-180gb": ("NVIDIA-B200",),
}
# Kubernetes Pod Security Standards, "restricted" profile (kubernetes.io/docs/concepts/security/
# pod-security-standards): non-root, no privilege escalation, every capability dropped, the runtime's
# seccomp profile. The server runs as the image's own unprivileged user, triton-server (uid 1000 in
# NVIDIA's Triton containers; Triton's "Secure Deployment Considerations" guide), so mpirun's
# --allow-run-as-root is never used. The root file system is read-only: what the server writes
# (MPI's session folder, the Python models' stubs, caches under $HOME) goes to /tmp, an emptyDir.
SCRATCH = "/tmp"
SCRATCH_SIZE = "4Gi"
MEMORY_HEADROOM = 1.25  # memory limit over the plan's request: an estimate, not a measurement
CPUS_PER_GPU = 2  # requested (no CPU limit, which throttles a latency-bound server): one rank, its stubs
STARTUP_SECONDS = 30 * 60  # loading a 70B engine's ranks can take many minutes
PROBE_PERIOD_SECONDS = 10
FRONT_UPSTREAM_PORT = 18000  # trtllm-serve behind the front, on the pod's loopback (18001 if serving uses 18000)
FRONT_RESOURCES = {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}


@dataclass(frozen=True)
class Served:
    """One server the manifests run: its object name, the variant whose serving settings it takes."""

    name: str
    variant: VariantPlan
    repository: str  # the repository's folder name under triton_repo/
    argv: list[str]
    gpus: int
    memory_gib: float


def in_pod(variant: VariantPlan) -> VariantPlan:
    """The variant as it serves in a pod: on every address (Service traffic arrives on the pod IP)."""
    return dataclasses.replace(variant, serving=variant.serving.model_copy(update={"host": POD_ADDRESS}))


def launch_argv(variant: VariantPlan) -> list[str]:
    """The serving argv of one variant's repository in the deployment (``build --dry-run`` prints it):
    tritonserver over its Triton repository, or ``trtllm-serve`` on a target without engines."""
    if not targets.definition(variant.target).builds_engines:
        return llm_api_launch_argv(in_pod(variant))
    repo = Path(variant.deploy.triton_repo_root) / variant.stage("package").output.name
    return gpu_launch_argv(in_pod(variant), repo, world_size=variant.world_size)


def spec_launch_argv(plan: Plan) -> list[str]:
    """The serving argv of the whole-spec repository in the deployment (orchestrator mode)."""
    assert plan.repository is not None
    first = plan.variants[0]
    repo = Path(first.deploy.triton_repo_root) / plan.repository.output.name
    return gpu_spec_launch_argv(plan, in_pod(first), repo)


def served(plan: Plan, whole_spec: bool) -> tuple[list[Served], list[str]]:
    """What the manifests run (``whole_spec``: the whole-spec repository was written), and notes on
    what they leave out."""
    notes = [
        f"{v.name}: target reference (the CPU reference backend) has no GPU deployment"
        for v in plan.variants
        if not targets.on_gpus(v.target)
    ]
    gpu_variants = [v for v in plan.variants if targets.on_gpus(v.target)]
    if whole_spec and plan.repository is not None and len(gpu_variants) == len(plan.variants):
        placement = place_fleet(plan)
        assert placement is not None, "a spec of tensorrt variants is placed"
        gpus = 1 + max(gpu for instance in placement.instances for gpu in instance.gpus)
        memory = sum(v.serve_resources.host_memory_gib for v in plan.variants if v.serve_resources)
        repository = plan.repository.output.name
        return [Served(plan.spec_name, plan.variants[0], repository, spec_launch_argv(plan), gpus, memory)], notes
    servers = []
    for variant in gpu_variants:
        llm_api = not targets.definition(variant.target).builds_engines
        if "lora_task_id" in variant.stage("package").params and llm_api:
            reached = (
                "its model name, through the front" if variant.deploy.front_image else "its lora_request in serve.json"
            )
            notes.append(f"{variant.name}: served by its LoRA group's trtllm-serve ({reached})")
            continue
        memory = variant.serve_resources.host_memory_gib if variant.serve_resources else 0.0
        repository = variant.stage("package").output.name
        server = Served(variant.name, variant, repository, launch_argv(variant), variant.world_size, memory)
        if _fronted(server):  # trtllm-serve on the loopback; the front on the Service's port
            upstream = dataclasses.replace(variant, serving=variant.serving.model_copy(update={"host": "127.0.0.1"}))
            argv = llm_api_launch_argv(upstream, _upstream_port(server))
            server = dataclasses.replace(server, argv=argv)
        elif llm_api and lora_members(variant.stage("package")):
            notes.append(
                f"{variant.name}: its fine-tunes are reached by their lora_request (serve.json); "
                "set deploy.front_image to reach them by model name"
            )
        servers.append(server)
    return servers, notes


def object_name(name: str) -> str:
    """A spec or variant name as a Kubernetes object name and label value (RFC 1123 label)."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return label or "specdeploy"


def _labels(server: Served, spec_name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "specdeploy",
        "app.kubernetes.io/instance": object_name(server.name),
        "app.kubernetes.io/part-of": object_name(spec_name),
    }


def _selector(server: Served) -> dict[str, str]:
    return {"app.kubernetes.io/name": "specdeploy", "app.kubernetes.io/instance": object_name(server.name)}


def _fronted(server: Served) -> bool:
    """Whether the pod runs the name-routing front beside trtllm-serve: a LoRA group with deploy.front_image."""
    members = lora_members(server.variant.stage("package"))
    return _is_trtllm_serve(server) and bool(members) and server.variant.deploy.front_image is not None


def _upstream_port(server: Served) -> int:
    return FRONT_UPSTREAM_PORT if server.variant.serving.http_port != FRONT_UPSTREAM_PORT else FRONT_UPSTREAM_PORT + 1


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def _loopback_probe(port: int, **timing: int) -> dict[str, Any]:
    """trtllm-serve's /health on the pod's loopback (the kubelet's probes reach only the pod IP), asked by
    the image's own Python (TensorRT-LLM is a Python package: python3 is there whatever else the image holds)."""
    script = (
        "import urllib.request; "
        f"urllib.request.urlopen('http://127.0.0.1:{port}{HEALTH_PATH}', timeout=4)"  # raises unless 2xx
    )
    check = {"exec": {"command": ["python3", "-c", script]}}
    return {**check, "periodSeconds": PROBE_PERIOD_SECONDS, "timeoutSeconds": 5, **timing}


def front_container(server: Served) -> dict[str, Any]:
    """The name-routing front: the Service's HTTP port, forwarding to trtllm-serve on the loopback."""
    variant, deploy = server.variant, server.variant.deploy
    serve_json = deploy.triton_repo_root / server.repository / SERVE_FILE
    port = variant.serving.http_port
    args = ["python", "-m", "pipeline.llm_api.front", str(serve_json), "--base", variant.name]
    args += ["--upstream", f"http://127.0.0.1:{_upstream_port(server)}", "--host", POD_ADDRESS, "--port", str(port)]
    http = {"httpGet": {"path": HEALTH_PATH, "port": port}, "periodSeconds": PROBE_PERIOD_SECONDS, "timeoutSeconds": 5}
    return {
        "name": "front",
        "image": deploy.front_image,
        "imagePullPolicy": "Always",
        "args": args,
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": FRONT_RESOURCES,
        "securityContext": _security_context(),
        "volumeMounts": [{"name": "models", "mountPath": deploy.mount_path, "readOnly": True}],
        # Ready when trtllm-serve is (its /health, through the front); alive while it accepts connections.
        "startupProbe": http | {"failureThreshold": STARTUP_SECONDS // PROBE_PERIOD_SECONDS},
        "readinessProbe": http | {"failureThreshold": 3},
        "livenessProbe": {"tcpSocket": {"port": port}, "periodSeconds": PROBE_PERIOD_SECONDS, "failureThreshold": 6},
    }


def _is_trtllm_serve(server: Served) -> bool:
    """Whether the server is trtllm-serve (HTTP only: an OpenAI-compatible API and ``/health``)."""
    return not targets.definition(server.variant.target).builds_engines


def _probe(server: Served, **timing: int) -> dict[str, Any]:
    serving = server.variant.serving
    check: dict[str, Any] = (
        {"httpGet": {"path": HEALTH_PATH, "port": serving.http_port}}
        if _is_trtllm_serve(server)
        else {"grpc": {"port": serving.grpc_port}}
    )
    return {**check, "periodSeconds": PROBE_PERIOD_SECONDS, "timeoutSeconds": 5, **timing}


def _ports(server: Served) -> list[dict[str, Any]]:
    """The container's ports: trtllm-serve's HTTP port; tritonserver's gRPC and metrics (and HTTP when on)."""
    serving = server.variant.serving
    http = [{"name": "http", "containerPort": serving.http_port, "protocol": "TCP"}]
    if _is_trtllm_serve(server):
        return http
    return [
        {"name": "grpc", "containerPort": serving.grpc_port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": serving.metrics_port, "protocol": "TCP"},
    ] + (http if serving.http else [])


def _affinity(variant: VariantPlan) -> dict[str, Any] | None:
    if variant.gpu is None:
        return None
    products = list(GPU_PRODUCTS[variant.gpu.name])
    term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": products}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def deployment(server: Served, spec_name: str) -> dict[str, Any]:
    deploy = server.variant.deploy
    fronted = _fronted(server)
    memory_mib = math.ceil(server.memory_gib * 1024)
    container = {
        "name": "tritonserver",
        "image": deploy.image,
        # A tag is resolved again at each start (a moved tag is noticed); a digest's layers stay cached.
        "imagePullPolicy": "Always",
        "args": server.argv,
        "env": [{"name": "HOME", "value": SCRATCH}],
        "resources": {
            "requests": {
                "cpu": str(CPUS_PER_GPU * server.gpus),
                "memory": f"{memory_mib}Mi",
                "nvidia.com/gpu": server.gpus,
            },
            "limits": {"memory": f"{math.ceil(memory_mib * MEMORY_HEADROOM)}Mi", "nvidia.com/gpu": server.gpus},
        },
        "securityContext": _security_context(),
        "volumeMounts": [
            {"name": "models", "mountPath": deploy.mount_path, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "scratch", "mountPath": SCRATCH},
        ],
    }
    if not fronted:  # behind the front, trtllm-serve's port is the pod's loopback's alone
        container["ports"] = _ports(server)
    probe = partial(_loopback_probe, _upstream_port(server)) if fronted else partial(_probe, server)
    container |= {
        "startupProbe": probe(failureThreshold=STARTUP_SECONDS // PROBE_PERIOD_SECONDS),
        "readinessProbe": probe(failureThreshold=3),
        "livenessProbe": probe(failureThreshold=6),
    }
    pod: dict[str, Any] = {
        "containers": [container, front_container(server)] if fronted else [container],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": deploy.run_as_user,
            "runAsGroup": deploy.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The server never talks to the API server; no token to steal, no service variables to read.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "volumes": [
            {"name": "models", "persistentVolumeClaim": {"claimName": deploy.volume_claim, "readOnly": True}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            {"name": "scratch", "emptyDir": {"sizeLimit": SCRATCH_SIZE}},
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        # Triton drains in-flight requests on SIGTERM for up to its exit timeout (30 s).
        "terminationGracePeriodSeconds": 60,
    }
    affinity = _affinity(server.variant)
    if affinity is not None:
        pod["affinity"] = affinity
    labels = _labels(server, spec_name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": object_name(server.name), "namespace": deploy.namespace, "labels": labels},
        "spec": {
            "replicas": deploy.replicas,
            "selector": {"matchLabels": _selector(server)},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def service(server: Served, spec_name: str) -> dict[str, Any]:
    ports = [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"}
        | ({"appProtocol": "grpc"} if p["name"] == "grpc" else {})
        for p in _ports(server)
        if p["name"] != "http" or _is_trtllm_serve(server)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": object_name(server.name),
            "namespace": server.variant.deploy.namespace,
            "labels": _labels(server, spec_name),
        },
        "spec": {"type": "ClusterIP", "selector": _selector(server), "ports": ports},
    }


def network_policy(server: Served, spec_name: str) -> dict[str, Any]:
    """Connections in only on the ports the pod serves (the Service's and the metrics port)."""
    ports = [{"port": p["containerPort"], "protocol": "TCP"} for p in _ports(server)]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": object_name(server.name),
            "namespace": server.variant.deploy.namespace,
            "labels": _labels(server, spec_name),
        },
        "spec": {
            "podSelector": {"matchLabels": _selector(server)},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": ports}],
        },
    }


def pod_monitor(server: Served, spec_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": object_name(server.name),
            "namespace": server.variant.deploy.namespace,
            "labels": _labels(server, spec_name),
        },
        "spec": {
            "selector": {"matchLabels": _selector(server)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def kustomization(deploy: DeploySpec, resources: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": deploy.namespace,
        "resources": resources,
    }


def manifests(plan: Plan, whole_spec: bool) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """{file name: its documents} and the notes of :func:`served`; empty when nothing runs on GPUs."""
    deploys = {v.deploy for v in plan.variants}
    if len(deploys) > 1:
        raise InputError(
            f"{plan.spec_file}: the variants' deploy: sections differ; a spec deploys to one namespace and "
            "volume claim (set deploy: once, at the top of the spec)"
        )
    servers, notes = served(plan, whole_spec)
    names = [object_name(s.name) for s in servers]
    if len(set(names)) != len(names):
        raise InputError(f"{plan.spec_file}: variants {', '.join(names)} map to the same Kubernetes object names")
    if plan.variants[0].deploy.front_image is not None and not any(_fronted(s) for s in servers):
        notes.append("deploy.front_image is unused: no LoRA group of target pytorch runs here")
    if not servers:
        return {}, notes
    files = {
        "deployment.yaml": [deployment(s, plan.spec_name) for s in servers],
        "service.yaml": [service(s, plan.spec_name) for s in servers],
        "podmonitor.yaml": [pod_monitor(s, plan.spec_name) for s in servers if not _is_trtllm_serve(s)],
        "networkpolicy.yaml": [network_policy(s, plan.spec_name) for s in servers],
    }
    files = {name: documents for name, documents in files.items() if documents}
    return files | {"kustomization.yaml": [kustomization(plan.variants[0].deploy, list(files))]}, notes


class _Dumper(yaml.SafeDumper):
    """Plain YAML: a dict used twice (the labels) is written twice, not as an anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(documents: list[dict[str, Any]]) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def write_deploy(plan: Plan, engines_root: Path, whole_spec: bool) -> tuple[Path | None, list[str]]:
    """Write ``<engines_root>/<spec>/deploy/`` atomically (a temp folder renamed into place); its
    path (None when no variant runs on GPUs) and the notes."""
    files, notes = manifests(plan, whole_spec)
    target = Path(engines_root) / plan.spec_name / DEPLOY_FOLDER
    if not files:
        return None, notes
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{DEPLOY_FOLDER}.tmp-{os.getpid()}"
    if os.path.lexists(tmp):
        remove_path(tmp)
    tmp.mkdir()
    try:
        for name, documents in files.items():
            (tmp / name).write_text(to_yaml(documents))
        replace_folder(tmp, target)
    except BaseException:
        remove_path(tmp)
        raise
    return target, notes
