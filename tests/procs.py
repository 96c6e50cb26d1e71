"""Helpers for tests that must prove the job leaves no process behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

STARTED_BY_JOB = ("vllm", "EngineCore", "raylet", "gcs_server", "ray::", "wandb-core",
                  "dynamo", "mooncake", "etcd", "nats-server")


def process_table() -> dict[int, str]:
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(entry.name)] = cmd.strip()
    return table


def new_job_processes(before: dict[int, str]) -> list[str]:
    """Processes that did not exist in `before` and look like engines, Ray or wandb."""
    now = process_table()
    return [f"{pid}: {cmd[:120]}" for pid, cmd in now.items()
            if pid not in before and pid != os.getpid()
            and any(marker in cmd for marker in STARTED_BY_JOB)]


def listening(pids: set[int]) -> list[str]:
    """Local addresses the given processes listen on (TCP)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines()
            if any(f"pid={pid}," in line for pid in pids)]
