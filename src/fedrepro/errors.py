"""The one base of the errors fedrepro raises on purpose.

Each such error's message names the file or the setting at fault and what to do about it; the
``fedrepro`` command prints it as its last line (``fedrepro <command>: <message>``) and exits with
status 2, without a traceback, which ``--debug`` or ``FEDREPRO_DEBUG=1`` shows. Anything else that
escapes is a bug, and keeps its traceback.
"""


class FedreproError(Exception):
    """Raised on purpose; the message is what the user reads, and says what to do."""


class SetupError(FedreproError, RuntimeError):
    """The machine or a store around a run is not as the run needs it (no CUDA device, a store to repair)."""
