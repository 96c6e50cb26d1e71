"""This host's Ray token (~/.ray/auth_token): a local Ray checks it, so a process that names the
rollout service's address must send it, and importing rollout must not change what a process
that imported ray first does (its `ray.init()` started a Ray it could not talk to)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

from rollfleet.paths import ROOT

START = ("import ray\nray.init(address='local', num_cpus=1, include_dashboard=False, "
         "configure_logging=False)\n")


def _env(home):
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT)}


def _python(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def test_a_process_that_imported_ray_before_rollout_starts_a_ray_it_can_use(tmp_path):
    code = START.replace("import ray\n", "import ray\nimport rollout.fleet\n") + (
        "print('got', ray.get(ray.put(7)))\nray.shutdown()\n")
    run = _python(code, _env(tmp_path / "home"))
    assert run.returncode == 0 and "got 7" in run.stdout, run.stderr[-3000:]


def test_a_process_that_names_a_local_ray_s_address_sends_this_host_s_token(tmp_path):
    env = _env(tmp_path / "home")
    head = subprocess.Popen(
        [sys.executable, "-c", START + "import sys\n"
         "print(ray.get_runtime_context().gcs_address, flush=True)\n"
         "sys.stdin.readline()\nray.shutdown()\n"],
        env=env, cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    try:
        address = head.stdout.readline().strip()
        assert address, "the head Ray did not start"
        run = _python("import ray\nfrom rollout.fleet import send_token_to\n"
                      f"send_token_to({address!r})\nray.init(address={address!r})\n"
                      "print('got', ray.get(ray.put(3)))\nray.shutdown()\n", env)
        assert run.returncode == 0 and "got 3" in run.stdout, run.stderr[-3000:]
    finally:
        head.communicate("\n", timeout=60)
