"""Errors that reach the user as one line, never as a traceback.

Every module raises one of these for bad input or an environment problem; the CLI
prints ``error: <message>`` and exits with ``exit_code``.
"""


class SpecdeployError(Exception):
    """A problem the user can fix; the message names the file/tensor/field and what to do."""

    exit_code = 2


class InputError(SpecdeployError):
    """Bad input: a spec, a checkpoint, a head file, a request. Exit code 2."""

    exit_code = 2


class StageError(SpecdeployError):
    """A stage failed while running (tool failure, missing dependency on this host). Exit code 1."""

    exit_code = 1


class StageUnavailable(StageError):
    """The stage cannot run on this host (e.g. trtllm-build without TensorRT-LLM).

    ``exit_code`` 3 says "not done here"; 0 marks a stage this version does not have yet.
    """

    def __init__(self, message: str, exit_code: int = 3) -> None:
        super().__init__(message)
        self.exit_code = exit_code
