"""Checkpoints are checked against the served model before any engine switches; a fleet that
fails midway goes back to the previous weights on every engine."""

import shutil
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from rollfleet.paths import ROOT
from serving import policy
from serving.policy import (
    DynamoControl,
    EngineControl,
    PolicyUpdateError,
    check_checkpoint,
    complete_model_dir,
    update_fleet,
)
from serving.tiny_model import ensure_tiny_glm

SERVED = ensure_tiny_glm(ROOT / ".cache" / "models")


def _checkpoint(tmp_path: Path, change=None) -> Path:
    out = tmp_path / "ckpt"
    out.mkdir()
    tensors = load_file(str(SERVED / "model.safetensors"))
    if change:
        change(tensors)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def test_the_served_weights_pass(tmp_path):
    check_checkpoint(SERVED, _checkpoint(tmp_path))


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.pop("lm_head.weight"), "lacks tensor lm_head.weight"),
    (lambda t: t.update(extra=torch.zeros(2)), "has tensor extra"),
    (lambda t: t.update({"lm_head.weight": t["lm_head.weight"][:10]}),
     r"lm_head.weight has shape \[10, 256\]"),
    (lambda t: t.update({"lm_head.weight": t["lm_head.weight"].float()}),
     "lm_head.weight is F32, the served model's is BF16"),
])
def test_a_checkpoint_that_does_not_fit_names_the_tensor(tmp_path, change, message):
    with pytest.raises(PolicyUpdateError, match=message):
        check_checkpoint(SERVED, _checkpoint(tmp_path, change))


def test_an_unreadable_or_empty_checkpoint_is_refused(tmp_path):
    bad = _checkpoint(tmp_path)
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(PolicyUpdateError, match="cannot be read"):
        check_checkpoint(SERVED, bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PolicyUpdateError, match="no \\*.safetensors"):
        check_checkpoint(SERVED, tmp_path / "empty")


def test_weights_alone_become_a_folder_an_engine_starts_from(tmp_path):
    weights = _checkpoint(tmp_path)
    folder = complete_model_dir(weights, SERVED, tmp_path)
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert (folder / "model.safetensors").resolve() == (weights / "model.safetensors").resolve()
    whole = tmp_path / "whole"
    shutil.copytree(SERVED, whole)
    assert complete_model_dir(whole, SERVED, tmp_path) == whole


class Engine(EngineControl):
    """The steps an engine took (the HTTP routes are the e2e tests' business)."""

    def __init__(self, name, fail_load=False):
        super().__init__(name, "http://unused")
        self.steps, self.fail_load = [], fail_load

    def pause(self, mode):
        self.steps.append(f"pause:{mode}")

    def invalidate(self):
        self.steps.append("invalidate")

    def load(self, checkpoint, version):
        self.steps.append(f"load:{checkpoint.name}@{version}")
        if self.fail_load and version == 2:
            raise PolicyUpdateError(f"engine {self.name}: load failed")

    def resume(self):
        self.steps.append("resume")


def test_every_engine_pauses_drops_loads_and_resumes():
    engines = [Engine("prefill0"), Engine("decode0")]
    seen = []
    times = update_fleet(engines, Path("v2"), 2, (Path("v1"), 1), "abort",
                         after_pause=lambda: seen.append([e.steps[-1] for e in engines]))
    assert seen == [["pause:abort", "pause:abort"]]  # both paused before anything is dropped
    for e in engines:
        assert e.steps == ["pause:abort", "invalidate", "load:v2@2", "resume"]
    assert times.total_s >= 0


def test_turns_that_never_settle_leave_every_engine_serving_the_old_weights():
    """The caller's settling step fails (turns still in flight in abort mode): the engines
    were paused, so they resume on the weights they had; nothing was dropped or loaded."""
    engines = [Engine("prefill0"), Engine("decode0")]

    def never_settles():
        raise PolicyUpdateError("turns still in flight after 120 s; the update did not start")

    with pytest.raises(PolicyUpdateError, match="still in flight"):
        update_fleet(engines, Path("v2"), 2, (Path("v1"), 1), "abort", after_pause=never_settles)
    for e in engines:
        assert e.steps == ["pause:abort", "resume"]


def test_one_engine_failing_puts_every_engine_back_on_the_previous_weights():
    ok, bad = Engine("decode0"), Engine("decode1", fail_load=True)
    with pytest.raises(PolicyUpdateError, match="previous weights again.*decode1: load failed"):
        update_fleet([ok, bad], Path("v2"), 2, (Path("v1"), 1), "wait")
    assert ok.steps == ["pause:wait", "invalidate", "load:v2@2", "load:v1@1", "resume"]
    # the engine that failed halfway loads the previous weights again too
    assert bad.steps == ["pause:wait", "invalidate", "load:v2@2", "load:v1@1", "resume"]


class WorkerRoutes:
    """A Dynamo worker's /engine routes whose cache reset fails `refusals` times the way vLLM
    0.31's does while a request waits for its KV from the prefill worker."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.calls = refusals, []

    def post(self, url, json=None, params=None, timeout=None):
        route = url.rsplit("/", 1)[-1]
        self.calls.append(route)
        answer = {"status": "ok"}
        if route == "pause_generation" and self.refusals:
            self.refusals -= 1
            answer = {"status": "error", "message": "Call to pause_scheduler method failed: "
                      "Failed to reset KV cache ... running requests waiting for remote KV "
                      "transfer, which is not supported yet."}
        return httpx.Response(200, json=answer)


@pytest.mark.parametrize("mode", ["wait", "abort"])
def test_a_decode_worker_with_kv_in_transit_is_resumed_and_paused_again(monkeypatch, mode):
    routes = WorkerRoutes(refusals=2)
    monkeypatch.setattr(policy.httpx, "post", routes.post)
    monkeypatch.setattr(policy.time, "sleep", lambda s: None)
    DynamoControl("decode0", "http://worker").pause(mode)
    assert routes.calls == ["pause_generation", "resume_generation"] * 2 + ["pause_generation"]


def test_kv_in_transit_fails_a_keep_pause_and_a_stuck_one_in_time(monkeypatch):
    routes = WorkerRoutes(refusals=1)
    monkeypatch.setattr(policy.httpx, "post", routes.post)
    with pytest.raises(PolicyUpdateError, match="decode0: pause_generation: .*remote KV"):
        DynamoControl("decode0", "http://worker").pause("keep")  # kept turns would run on
    routes = WorkerRoutes(refusals=10**6)
    monkeypatch.setattr(policy.httpx, "post", routes.post)
    monkeypatch.setattr(policy, "REMOTE_KV_WAIT_S", 0.0)
    with pytest.raises(PolicyUpdateError, match="remote KV"):
        DynamoControl("decode0", "http://worker").pause("wait")
    assert routes.calls == ["pause_generation"]  # the deadline had passed: no retry
