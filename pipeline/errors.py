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
