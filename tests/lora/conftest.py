"""The LoRA tests' tiny matmuls run on one torch thread (tests/runtime/fixtures.py)."""

from tests.runtime.fixtures import one_torch_thread  # noqa: F401  (autouse for this folder)
