"""The README's main job as a subprocess, for the tests that drive or kill it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def swe_rl_job(out: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m rollout.run +experiment=swe_rl` into `out`, no wandb, output piped."""
    return subprocess.Popen([sys.executable, "-m", "rollout.run", "+experiment=swe_rl",
                             f"output.dir={out}", "logger=none", *overrides], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
