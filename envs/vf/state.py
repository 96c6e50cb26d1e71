"""The rollout state our tool server shares with the host through verifiers' state channel."""

from __future__ import annotations

import verifiers.v1 as vf


class WorkspaceState(vf.State):
    """What scoring needs once the tool server is gone: the session's changes, and `submit`."""

    diff: str = ""
    """The session's changes as `git diff --binary` from the starting tree (envs.workspace)."""
    refused: str = ""
    """Why there is no diff (over the sandbox's changes_mb): scored as the agent's failure."""
    submitted: bool = False
