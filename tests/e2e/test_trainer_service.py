"""A trainer in processes of its own (2 torchrun ranks) attached to the rollout service
(rollout/rl/service.py), pushing its weights from both ranks straight to the engines
(serving/weight_transfer.py), on real engines, real Dynamo and real Ray: every record of version
v re-scores against the weights the trainer kept as v, the engines served exactly those bytes,
nothing is lost, and the service's memory does not grow with the model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from datasets import load_from_disk
from safetensors.torch import load_file

from rollfleet.paths import ROOT
from serving import Transfer, WeightSender
from serving.tiny_model import TinyGlmSpec, ensure_tiny_glm
from tests.e2e.records import check_behaviour
from tests.procs import new_job_processes, process_table

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
STEPS = 3
# a model big enough that a copy of its weights in the service would show (~110 MB of bf16)
LARGER = TinyGlmSpec(hidden_size=512, num_hidden_layers=8, intermediate_size=1024,
                     moe_intermediate_size=256)
TOPOLOGIES = {
    "kv_routed_with_tier": ["serving=kv_routed", "serving.kv_tier=mooncake",
                            "serving.kv_tier_gib=0.5"],
    "disagg": ["serving=disagg"],
}


def _start_service(run: Path, overrides: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """The service as the README starts it; (its process, its Ray address) once it is ready."""
    service = subprocess.Popen(
        [sys.executable, "-m", "rollout.rl.service", "+experiment=rl_loop", *overrides,
         f"output.dir={run}", "logger=none", "rollout.max_sessions=8",
         "rollout.max_tokens_per_turn=256"],
        cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        found = re.search(r"ready: Ray at (\S+),", log.read_text())
        if found:
            return service, found.group(1)
        assert service.poll() is None, log.read_text()[-3000:]
        time.sleep(2)
    service.kill()
    raise AssertionError(f"the service was not ready in 600 s: {log.read_text()[-3000:]}")


def _digest_of(folder: Path, world: int) -> str:
    """The digest the engines serve a version under, recomputed from the weights the trainer
    kept, sent as the trainer's `world` ranks sent them."""
    tensors = load_file(str(folder / "model.safetensors"))
    parts = [WeightSender(r, world).describe(WeightSender(r, world).rows(tensors))
             for r in range(world)]
    return Transfer.from_parts(parts, lambda rendezvous: None).plan.digest


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_a_trainer_of_two_ranks_pushes_its_weights_straight_to_the_engines(topology, tmp_path):
    before = process_table()
    larger = topology == "kv_routed_with_tier"
    model_dir = (ensure_tiny_glm(ROOT / ".cache" / "models", LARGER) if larger else
                 ensure_tiny_glm(ROOT / ".cache" / "models"))
    model_bytes = (model_dir / "model.safetensors").stat().st_size
    run, kept = tmp_path / "run", tmp_path / "versions"
    service, address = _start_service(
        run, [*TOPOLOGIES[topology], f"model.path={model_dir}"], tmp_path / "service.log")
    try:
        driver = psutil.Process(service.pid)
        driver_rss = driver.memory_info().rss
        trainer = subprocess.run(
            [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m",
             "rollout.rl.dist_trainer", "--steps", str(STEPS), "--address", address,
             "--keep-versions", str(kept), "--stop"],
            cwd=ROOT, capture_output=True, text=True, timeout=1200,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert trainer.returncode == 0, (trainer.stdout + trainer.stderr)[-4000:]
        driver_growth = driver.memory_info().rss - driver_rss
        service.wait(timeout=300)
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
    assert service.returncode == 0, (tmp_path / "service.log").read_text()[-3000:]
    steps = json.loads((run / "rl_steps.json").read_text())
    assert [s["policy_version"] for s in steps] == [1, 2, 3]
    assert all(s["transfer_s"] > 0 and s["sent_bytes"] > 0 for s in steps)
    # neither the service nor its driver holds the weights: while a push runs the service's
    # memory rises by less than half a copy of the model (a copy would be all of it; what it
    # rises by is the update's HTTP clients and the sessions sampling meanwhile: 13-25 MiB here
    # for this 72 MiB model), and the driver's over the whole run too
    if larger:
        pushes = [s["service_peak_above_mib"] * 2**20 for s in steps]
        assert max(pushes) < 0.5 * model_bytes, (pushes, model_bytes)
        assert driver_growth < 0.5 * model_bytes, (driver_growth, model_bytes)

    records = load_from_disk(str(run / "dataset")).to_list()
    assert records and {r["status"] for r in records} <= {"ok", "truncated", "stale"}
    assert len({r["rollout_id"] for r in records}) == len(records)  # nothing lost or doubled
    turns = [t for r in records for t in r["turns"]]
    served = {t["policy_version"]: t["policy_checkpoint"] for t in turns}
    assert 0 in served and max(served) >= 1, sorted(served)
    for version, digest in served.items():  # the bytes the engines served are the trainer's
        if version:
            assert digest == _digest_of(kept / f"v{version}", 2), version
    for version in sorted(served):  # each token's logprob is what its version's weights give
        own = [r for r in records if r["policy_versions"] == [version]]
        if own:
            check_behaviour(own, str(model_dir if version == 0 else kept / f"v{version}"))
    assert new_job_processes(before) == []
