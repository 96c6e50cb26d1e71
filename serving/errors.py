"""What goes wrong in serving, as the rest of the job sees it.

Every failure serving raises to its callers is a `ServingError`: its message is one line and
says what to do, so a driver can stop with it and a session can record it as an infrastructure
error without knowing which part of serving failed. A turn that does not fit its token budget
is not a failure of serving and is not one of these (serving.toolcall.TurnTooLong).
"""


class ServingError(RuntimeError):
    """A serving problem the user can act on; its message is one line and says what to do."""


class ServerUnavailable(ServingError):
    """The serving side failed (unreachable, timed out, 5xx, lost its engines): retry elsewhere."""
