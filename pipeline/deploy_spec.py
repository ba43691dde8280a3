"""The spec's ``deploy:`` section: where and how the Kubernetes manifests run the packaged repository.

::

    deploy:
      namespace: llm-serving              # the namespace of every object (kustomization's namespace)
      volume_claim: specdeploy-models     # a PersistentVolumeClaim holding engines/ and triton_repo/
      image: nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3
      replicas: 2
      mount_path: /models                 # where the claim is mounted in the container

The claim holds the two output roots side by side, as ``specdeploy engine`` wrote them:
``<mount_path>/engines/<variant>/engine/`` and ``<mount_path>/triton_repo/<repository>/``. The
package stage writes every ``gpt_model_path`` under ``<mount_path>/engines/`` (NVIDIA's backend reads
it as given), so the repository needs no edit on the cluster; ``specdeploy serve`` elsewhere resolves
those paths against ``--engines-dir`` (:mod:`pipeline.triton.relocate`).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The TensorRT-LLM 1.2.1 Triton container (README: "The container").
DEFAULT_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # RFC 1123 label: namespaces
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"  # RFC 1123 subdomain: claim names
ENGINES_FOLDER = "engines"  # under mount_path: the --engines-dir root
TRITON_REPO_FOLDER = "triton_repo"  # under mount_path: the --triton-repo root


class DeploySpec(BaseModel):
    """The Kubernetes manifests the package stage writes (``engines/<spec>/deploy/``)."""

    # The same strictness as every spec section (pipeline/spec.py).
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)

    namespace: str = Field("default", pattern=DNS_LABEL)
    """Kubernetes namespace of the Deployment, Service and PodMonitor."""
    volume_claim: str = Field("specdeploy-models", pattern=DNS_SUBDOMAIN)
    """PersistentVolumeClaim holding engines/ and triton_repo/ as specdeploy wrote them."""
    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=512, pattern=r"^[^\s]+$")
    """The container image: NVIDIA's Triton TensorRT-LLM 1.2.1 container (or a copy in your registry)."""
    replicas: int = Field(1, ge=1, le=1000)
    """Pods of the Deployment, each a whole server on its own GPUs."""
    mount_path: str = "/models"
    """Where the claim is mounted in the container; gpt_model_path points under <mount_path>/engines/."""

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts or str(path) != value or path == PurePosixPath("/"):
            raise ValueError("an absolute, normalized POSIX path other than / (e.g. /models)")
        return value

    @property
    def engines_root(self) -> PurePosixPath:
        """The --engines-dir of the deployment: <mount_path>/engines."""
        return PurePosixPath(self.mount_path) / ENGINES_FOLDER

    @property
    def triton_repo_root(self) -> PurePosixPath:
        """The --triton-repo of the deployment: <mount_path>/triton_repo."""
        return PurePosixPath(self.mount_path) / TRITON_REPO_FOLDER
