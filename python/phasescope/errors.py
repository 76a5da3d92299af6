"""errors.py — PhasescopeError: every failure of the library, carrying the C message; Cancelled: a call a
progress callback stopped."""


class PhasescopeError(Exception):
    """A call into phasescope failed. str(e) is the library's message (it names the file, tensor, hook,
    flag or value at fault); e.code is the C return code (1: a failure, 2: an invalid request; 0 when
    the check was made on the Python side)."""

    def __init__(self, message, code=0):
        super().__init__(message)
        self.code = code


class Cancelled(PhasescopeError):
    """A long call stopped because its progress callback asked it to (progress= returned True): str(e) says
    where ("cancelled after 3 of 16 batches"); e.code is 3 (PS_API_ECANCELLED). Ctrl-C raises
    KeyboardInterrupt instead."""
