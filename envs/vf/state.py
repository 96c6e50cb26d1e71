"""The rollout state our tool server shares with the host through verifiers' state channel."""

from __future__ import annotations

import verifiers.v1 as vf
from pydantic import Field


class WorkspaceState(vf.State):
    """What scoring needs once the tool server is gone: the session's changes, and `submit`."""

    files: dict[str, str | None] = Field(default_factory=dict)
    """Relative path -> new full text (None: deleted) of every file the session changed."""
    diff: str = ""
    submitted: bool = False
