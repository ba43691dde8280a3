"""The spec's ``deploy:`` section: where and how the Kubernetes manifests run the packaged repository.

::

    deploy:
      namespace: llm-serving              # the namespace of every object (kustomization's namespace)
      volume_claim: specdeploy-models     # a PersistentVolumeClaim holding engines/ and triton_repo/
      image: nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3   # or pinned: ...@sha256:<64 hex>
      replicas: 2
      mount_path: /models                 # where the claim is mounted in the container
      run_as_user: 1000                   # the image's unprivileged user (triton-server)
      front_image: registry.example.com/specdeploy-front:0.1.0   # target pytorch: fine-tunes by model name

The claim holds the two output roots side by side, as ``specdeploy engine`` wrote them:
``<mount_path>/engines/<variant>/engine/`` and ``<mount_path>/triton_repo/<repository>/``. The
package stage writes every ``gpt_model_path`` under ``<mount_path>/engines/`` (NVIDIA's backend reads
it as given), so the repository needs no edit on the cluster; ``specdeploy serve`` elsewhere resolves
those paths against ``--engines-dir`` (:mod:`pipeline.triton.relocate`).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The TensorRT-LLM 1.2.1 Triton container (README: "The container").
DEFAULT_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # RFC 1123 label: namespaces
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"  # RFC 1123 subdomain: claim names
# An image reference as the OCI distribution spec and Docker's reference grammar write it:
# [registry[:port]/]path[:tag][@sha256:<64 hex>] (github.com/distribution/reference, regexp.go).
IMAGE_REFERENCE = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
# Where the claim may not be mounted: the container's own system folders (a mount would shadow the
# image), the kernel's file systems and /dev/shm (the pod's in-memory emptyDir); /tmp itself, below.
RESERVED_MOUNTS = tuple(
    PurePosixPath(p)
    for p in (
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/opt/nvidia",
        "/opt/tritonserver",
        "/proc",
        "/run",
        "/sbin",
        "/sys",
        "/usr",
        "/var/run",
    )
)
ENGINES_FOLDER = "engines"  # under mount_path: the --engines-dir root
TRITON_REPO_FOLDER = "triton_repo"  # under mount_path: the --triton-repo root


class DeploySpec(BaseModel):
    """The Kubernetes manifests the package stage writes (``engines/<spec>/deploy/``)."""

    # The same strictness as every spec section (pipeline/spec/document.py).
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)

    namespace: str = Field("default", pattern=DNS_LABEL)
    """Kubernetes namespace of the Deployment, Service and PodMonitor."""
    volume_claim: str = Field("specdeploy-models", pattern=DNS_SUBDOMAIN)
    """PersistentVolumeClaim holding engines/ and triton_repo/ as specdeploy wrote them."""
    image: str = DEFAULT_IMAGE
    """The container image: NVIDIA's Triton TensorRT-LLM 1.2.1 container (or a copy in your registry);
    pin it by digest (``...@sha256:<64 hex>``) so every replica runs the same bytes."""
    front_image: str | None = None
    """Target ``pytorch``, a LoRA group: an image with specdeploy's name-routing front (``python -m
    pipeline.llm_api.front``; it needs fastapi, uvicorn and httpx). Set, each pod runs it beside
    trtllm-serve, which then listens on the pod's loopback only, and an OpenAI client reaches every
    fine-tune by its own ``model`` name; unset, clients send the fine-tune's ``lora_request`` (serve.json)
    (docs/guides/kubernetes.md)."""
    replicas: int = Field(1, ge=1, le=1000)
    """Pods of the Deployment, each a whole server on its own GPUs."""
    run_as_user: int = Field(1000, ge=1, le=2**31 - 1)
    """The unprivileged user (and group) the server runs as: triton-server, uid 1000, in NVIDIA's
    containers; the claim's files must be readable by it. Never 0: the pod runs as non-root."""
    mount_path: str = "/models"
    """Where the claim is mounted in the container; gpt_model_path points under <mount_path>/engines/."""

    @field_validator("image", "front_image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if len(value) > 512 or not IMAGE_REFERENCE.fullmatch(value):
            raise ValueError(
                f"{value[:80]!r} is not an image reference: [registry/]repository[:tag][@sha256:<64 hex digits>] "
                f"(e.g. {DEFAULT_IMAGE})"
            )
        return value

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        path = PurePosixPath(value)
        if (
            len(value) > 256
            or not value.isprintable()
            or any(c.isspace() for c in value)
            or not path.is_absolute()
            or ".." in path.parts
            or str(path) != value
            or path == PurePosixPath("/")
        ):
            raise ValueError(
                f"{value[:80]!r} must be an absolute, normalized POSIX path other than / without spaces or "
                "control characters, at most 256 characters (e.g. /models)"
            )
        if path == PurePosixPath("/tmp"):  # the pod's scratch emptyDir (a folder under it may be mounted)
            raise ValueError("'/tmp' is the pod's scratch volume; use a folder of its own, e.g. /models")
        for reserved in RESERVED_MOUNTS:
            if path == reserved or reserved in path.parents:
                raise ValueError(
                    f"{value!r} is or lies under the container's {reserved} (a mount there shadows the image or a "
                    "volume the pod already has); use a folder of its own, e.g. /models"
                )
        return value

    @property
    def engines_root(self) -> PurePosixPath:
        """The --engines-dir of the deployment: <mount_path>/engines."""
        return PurePosixPath(self.mount_path) / ENGINES_FOLDER

    @property
    def triton_repo_root(self) -> PurePosixPath:
        """The --triton-repo of the deployment: <mount_path>/triton_repo."""
        return PurePosixPath(self.mount_path) / TRITON_REPO_FOLDER
