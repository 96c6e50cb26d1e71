"""New weights are checked against the served model before anything is written or loaded; the
fleet loads, publishes, drops every cache and reads every engine's version back before it
resumes; a fleet that fails midway goes back to the previous weights on every engine, and one
that cannot says which engine reports what."""

import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from rollfleet.paths import ROOT
from serving import policy
from serving.checkpoints import PolicyCheckpoint, PolicyUpdateError, check_checkpoint
from serving.policy import DynamoControl, EngineControl, FleetBroken, VllmControl, update_fleet
from serving.tiny_model import ensure_tiny_glm

SERVED = ensure_tiny_glm(ROOT / ".cache" / "models")
V1, V2 = PolicyCheckpoint(1, "/ckpt/v1", "a" * 64), PolicyCheckpoint(2, "/ckpt/v2", "b" * 64)


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


class Engine(EngineControl):
    """The steps an engine took (the HTTP routes are below and in the e2e tests); `fail` names
    the step and the version at which it fails, `reports` a version it reports whatever it
    loaded."""

    def __init__(self, name, fail=(), reports=None, error=PolicyUpdateError):
        super().__init__(name, "http://unused")
        self.steps, self.fail, self.reports, self.error = [], set(fail), reports, error
        self.loaded = "0:served"

    def _step(self, step, version=None):
        self.steps.append(step if version is None else f"{step}:{version}")
        if (step, version) in self.fail:
            raise self.error(f"engine {self.name}: {step} failed")

    def pause(self, mode):
        self._step(f"pause:{mode}")

    def load(self, checkpoint):
        self.loaded = checkpoint.label
        self._step("load", checkpoint.version)

    def invalidate(self, mode):
        self._step("invalidate")

    def version(self):
        return self.reports or self.loaded

    def declare(self, checkpoint):
        self.loaded = checkpoint.label

    def resume(self):
        self._step("resume")


def _update(engines, mode="wait"):
    published = []
    times = update_fleet(engines, V2, V1, mode, published.append)
    return times, published


def test_every_engine_pauses_loads_drops_its_caches_and_resumes_on_the_version_read_back():
    engines = [Engine("prefill0"), Engine("decode0")]
    for e in engines:
        e.declare(V1)
    times, published = _update(engines, "abort")
    for e in engines:
        assert e.steps == ["pause:abort", "load:2", "invalidate", "resume"]
        assert e.version() == V2.label
    assert published == [V2]  # before the caches were dropped (the tier reads it then)
    assert times.total_s >= 0


def test_one_engine_failing_puts_every_engine_back_on_the_previous_weights():
    ok, bad = Engine("decode0"), Engine("decode1", fail={("load", 2)})
    published = []
    with pytest.raises(PolicyUpdateError, match=r"previous weights \(1:a+\) again.*decode1: "
                                                r"load failed") as err:
        update_fleet([ok, bad], V2, V1, "wait", published.append)
    assert not isinstance(err.value, FleetBroken)
    # both go back (the one that failed halfway may have changed weights too), the tier's
    # namespace with them, every cache is dropped again, and they serve on
    assert ok.steps == ["pause:wait", "load:2", "load:1", "invalidate", "resume"]
    assert bad.steps == ["pause:wait", "load:2", "load:1", "invalidate", "resume"]
    assert published == [V1]


@pytest.mark.parametrize("error", [NameError, RuntimeError, ConnectionResetError])
def test_any_error_in_a_step_puts_the_engines_back_and_never_leaves_them_paused(error):
    """Not only the errors an engine answers with: a bug or a dropped connection inside the
    update rolls back and resumes as well (a job left with paused engines waits forever)."""
    ok, bad = Engine("agg0"), Engine("agg1", fail={("load", 2)}, error=error)
    with pytest.raises(PolicyUpdateError, match=rf"again: {error.__name__}: engine agg1"):
        update_fleet([ok, bad], V2, V1, "abort")
    assert ok.steps[-3:] == bad.steps[-3:] == ["load:1", "invalidate", "resume"]
    worse = [Engine("agg0", fail={("load", 2), ("load", 1)}, error=error)]
    with pytest.raises(FleetBroken, match=r"going back to 1:a+ failed too \(engine agg0: load"):
        update_fleet(worse, V2, V1, "abort")
    assert "resume" not in worse[0].steps


def test_an_engine_reporting_other_weights_after_the_load_is_an_update_that_failed():
    engines = [Engine("agg0"), Engine("agg1", reports="1:" + "a" * 16)]
    with pytest.raises(PolicyUpdateError,
                       match=r"previous weights.*other weights than 2:b+: \{'agg1'"):
        _update(engines)
    assert engines[0].steps[-3:] == ["load:1", "invalidate", "resume"]


def test_a_failed_way_back_leaves_the_fleet_paused_and_names_every_engines_version():
    engines = [Engine("agg0"), Engine("agg1", fail={("load", 2), ("load", 1)})]
    with pytest.raises(FleetBroken, match=r"agg0': '1:a+'.*agg1': '1:a+'") as err:
        _update(engines)
    assert "failed too" in str(err.value)
    assert all("resume" not in e.steps for e in engines)  # nothing samples on a mixed fleet


def test_a_resume_that_fails_after_the_load_is_a_broken_fleet_naming_the_versions():
    engines = [Engine("agg0"), Engine("agg1", fail={("resume", None)})]
    with pytest.raises(FleetBroken, match=r"resuming on 2:b+ failed.*agg0': '2:b+'"):
        _update(engines)


def test_a_pause_that_fails_resumes_the_engines_on_the_weights_they_have():
    engines = [Engine("prefill0"), Engine("decode0", fail={("pause:keep", None)})]
    with pytest.raises(PolicyUpdateError, match="pause:keep failed"):
        _update(engines, "keep")
    assert engines[0].steps == ["pause:keep", "resume"]


class Routes:
    """An engine's HTTP routes, scripted: each answer by the route's last path part."""

    def __init__(self, answers=None) -> None:
        self.answers, self.calls = answers or {}, []

    def request(self, method, url, json=None, params=None, timeout=None):
        route = url.rsplit("/", 1)[-1]
        self.calls.append(route)
        answer = self.answers.get(route, {"status": "ok"})
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        return httpx.Response(200, json=answer)


def test_a_vllm_reset_answering_success_false_is_never_taken_as_done(monkeypatch):
    routes = Routes({"reset_prefix_cache": [{"success": False}]})
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    monkeypatch.setattr(policy.time, "sleep", lambda s: None)
    with pytest.raises(PolicyUpdateError, match=r"did not drop its cache \(\{'success': False"):
        VllmControl("0", "http://engine").invalidate("wait")
    assert routes.calls == ["reset_prefix_cache"] * policy.RESET_TRIES
    routes = Routes({"reset_prefix_cache": [{"success": False}, {"success": True}]})
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    VllmControl("0", "http://engine").invalidate("wait")  # held blocks freed: done
    assert routes.calls == ["reset_prefix_cache"] * 2


def test_a_dynamo_route_that_does_not_answer_ok_fails_the_step(monkeypatch):
    routes = Routes({"update_weights_from_disk": {"status": "error", "message": "no such file"}})
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    with pytest.raises(PolicyUpdateError, match="decode0: update_weights_from_disk: no such"):
        DynamoControl("decode0", "http://worker").load(V2)


@pytest.mark.parametrize("mode", ["wait", "abort", "keep"])
def test_a_dynamo_update_relies_on_the_pause_and_never_aborts_by_route(monkeypatch, mode):
    """Dynamo 1.6.1 aborts one request by id and refuses `abort_all`; an update's pause
    (abort mode: vLLM's own abort of everything the engine holds) is all it sends."""
    routes = Routes({"get_weight_version": {"status": "ok", "version": V2.label}})
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    update_fleet([DynamoControl("agg0", "http://worker")], V2, V1, mode)
    assert routes.calls == ["pause_generation", "pause_generation", "update_weights_from_disk",
                            "pause_generation", "get_weight_version", "resume_generation"]


class WorkerRoutes(Routes):
    """A Dynamo worker whose cache reset fails `refusals` times the way vLLM 0.31's does while
    a request waits for its KV from the prefill worker."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    def request(self, method, url, json=None, params=None, timeout=None):
        route = url.rsplit("/", 1)[-1]
        if route == "pause_generation" and json["clear_cache"] and self.refusals:
            self.refusals -= 1
            self.calls.append(route)
            return httpx.Response(200, json={
                "status": "error", "message": "Call to pause_scheduler method failed: Failed "
                "to reset KV cache ... running requests waiting for remote KV transfer, which "
                "is not supported yet."})
        return super().request(method, url, json, params, timeout)


@pytest.mark.parametrize("mode", ["wait", "abort"])
def test_a_decode_worker_with_kv_in_transit_is_resumed_and_reset_again(monkeypatch, mode):
    routes = WorkerRoutes(refusals=2)
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    monkeypatch.setattr(policy.time, "sleep", lambda s: None)
    DynamoControl("decode0", "http://worker").settle(mode)
    assert routes.calls == ["pause_generation", "resume_generation", "pause_generation"] * 2 \
        + ["pause_generation"]


def test_kv_in_transit_fails_a_keep_reset_and_a_stuck_one_in_time(monkeypatch):
    routes = WorkerRoutes(refusals=1)
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    with pytest.raises(PolicyUpdateError, match="decode0: pause_generation: .*remote KV"):
        DynamoControl("decode0", "http://worker").settle("keep")  # kept turns would run
    routes = WorkerRoutes(refusals=10**6)
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    monkeypatch.setattr(policy, "REMOTE_KV_WAIT_S", 0.0)
    with pytest.raises(PolicyUpdateError, match="remote KV"):
        DynamoControl("decode0", "http://worker").settle("wait")
    assert routes.calls == ["pause_generation"]  # the deadline had passed: no retry


class LateKvRoutes(WorkerRoutes):
    """A decode worker that a request waiting for its KV reaches after the settle, while the
    new weights load (`arrivals` times): its cache resets are refused until it is resumed."""

    def __init__(self, arrivals: int) -> None:
        super().__init__(refusals=0)
        self.weights, self.arrivals = V1.label, arrivals

    def request(self, method, url, json=None, params=None, timeout=None):
        route = url.rsplit("/", 1)[-1]
        if route == "update_weights_from_disk":
            self.weights = json["weight_version"]
            if self.weights == V2.label and self.arrivals:
                self.arrivals -= 1
                self.refusals = 10**6
        if route == "resume_generation":
            self.refusals = 0  # it lands
            self.calls.append(f"resume on {self.weights}")
            return httpx.Response(200, json={"status": "ok"})
        if route == "get_weight_version":
            self.calls.append(route)
            return httpx.Response(200, json={"status": "ok", "version": self.weights})
        return super().request(method, url, json, params, timeout)


@pytest.mark.parametrize("mode", ["wait", "abort"])
def test_an_engine_never_runs_on_new_weights_before_its_cache_is_dropped(monkeypatch, mode):
    """KV in transit once the new weights are in: resuming then would decode on them over KV
    the old ones computed (and a continued turn would tag those tokens with the old version).
    The engine goes back to the old weights, the request lands there, and the load is done
    again; a request that keeps arriving fails the update, the fleet on the old weights."""
    routes = LateKvRoutes(arrivals=1)
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    monkeypatch.setattr(policy.time, "sleep", lambda s: None)
    update_fleet([DynamoControl("decode0", "http://worker")], V2, V1, mode)
    assert [c for c in routes.calls if c.startswith("resume")] == [
        f"resume on {V1.label}", f"resume on {V2.label}"]
    assert routes.calls[-3:] == ["pause_generation", "get_weight_version",
                                 f"resume on {V2.label}"]  # dropped, checked, then run
    routes = LateKvRoutes(arrivals=policy.SWITCH_TRIES)
    monkeypatch.setattr(policy.httpx, "request", routes.request)
    with pytest.raises(PolicyUpdateError, match=r"previous weights \(1:a+\) again.*remote KV"):
        update_fleet([DynamoControl("decode0", "http://worker")], V2, V1, mode)
    assert {c for c in routes.calls if c.startswith("resume")} == {f"resume on {V1.label}"}


@pytest.mark.parametrize("mode", ["wait", "abort", "keep"])
def test_a_prefill_worker_pauses_before_its_decode_worker_and_resumes_after_it(monkeypatch,
                                                                               mode):
    """A decode worker paused first reads no KV the prefill worker handed off, and the prefill
    worker's pause waits that KV's lease out (30 s in vLLM 0.31's NIXL connector; seen as a
    30 s update on disagg); resumed first, the prefill worker hands off KV nobody reads yet.
    The prefill worker lets its one-token requests end whatever the mode: the decode workers
    treat the turns as the mode says."""
    seen, modes = [], {}

    def request(method, url, json=None, params=None, timeout=None):
        worker, route = url.split("//")[1].split(":")[0], url.rsplit("/", 1)[-1]
        if route == "pause_generation" and not json["clear_cache"]:
            seen.append(f"{worker} pause")
            modes[worker] = json["mode"]
        if route == "resume_generation":
            seen.append(f"{worker} resume")
        if route == "get_weight_version":
            return httpx.Response(200, json={"status": "ok", "version": V2.label})
        return httpx.Response(200, json={"status": "ok"})

    monkeypatch.setattr(policy.httpx, "request", request)
    fleet = [DynamoControl("decode0", "http://decode0:1"),
             DynamoControl("prefill0", "http://prefill0:1", hands_off_kv=True),
             DynamoControl("decode1", "http://decode1:1")]
    update_fleet(fleet, V2, V1, mode)
    assert seen[0] == "prefill0 pause" and sorted(seen[1:3]) == ["decode0 pause",
                                                                 "decode1 pause"]
    assert sorted(seen[3:5]) == ["decode0 resume", "decode1 resume"]
    assert seen[5:] == ["prefill0 resume"]
    assert modes == {"prefill0": "wait", "decode0": mode, "decode1": mode}


# -- weights from a trainer's ranks -----------------------------------------------------------

W2 = PolicyCheckpoint(2, "", "c" * 64)  # came over the wire: no folder


class Receiver(Engine):
    """An engine of the fleet's weight transfer: `load` is the control's own (a folder reloads,
    weights that came from ranks apply what `receive` staged); `transfer` is what reached it."""

    def __init__(self, name, fail=()):
        super().__init__(name, fail)
        self.staged = ""

    load = EngineControl.load

    def reload(self, checkpoint):
        self.loaded = checkpoint.label
        self._step("reload", checkpoint.version)

    def transfer(self, update_info):
        action = update_info["action"]
        if action == "receive":
            self.ranks = (update_info["engine_rank"], update_info["rendezvous"]["engines"])
            self._step("receive")
            self.staged = update_info["plan"]["digest"]
        elif action == "apply":
            self._step("apply")
            if update_info["digest"] != self.staged:
                raise PolicyUpdateError(f"engine {self.name}: {update_info['digest'][:4]} "
                                        "is not staged")
        else:
            self._step("drop")
            self.staged = ""


class Plan:
    """The one thing the policy's code reads of a plan: its dict."""

    def __init__(self, digest):
        self.digest = digest

    def as_dict(self):
        return {"digest": self.digest}


def _incoming(told):
    from serving.weight_transfer import Rendezvous

    return policy.Incoming(Plan(W2.digest), Rendezvous("127.0.0.1", 1, "k", 2),
                           lambda: told.append("told"))


def test_weights_from_ranks_are_received_everywhere_before_any_engine_loads_them():
    engines, told = [Receiver("prefill0"), Receiver("decode0")], []
    times = update_fleet(engines, W2, V1, "abort", incoming=_incoming(told))
    for e in engines:
        assert e.steps == ["pause:abort", "receive", "apply", "invalidate", "drop", "resume"]
        assert e.version() == W2.label
    assert told == ["told"]  # the ranks were told to send once
    assert sorted(e.ranks for e in engines) == [(0, 2), (1, 2)]  # one rank each in the groups
    assert times.transfer_s > 0 and times.total_s >= times.transfer_s


def test_a_transfer_that_fails_on_one_engine_loads_nothing_anywhere_and_serves_on():
    ok, bad = Receiver("agg0"), Receiver("agg1", fail={("receive", None)})
    with pytest.raises(PolicyUpdateError, match="agg1: receive failed"):
        update_fleet([ok, bad], W2, V1, "wait", incoming=_incoming([]))
    for e in (ok, bad):  # nothing applied, the staged copies dropped, both resumed
        assert "apply" not in e.steps and e.steps[-2:] == ["drop", "resume"]
        assert e.version() == "0:served"


def test_a_failed_apply_goes_back_to_a_folder_and_serves_on():
    ok, bad = Receiver("agg0"), Receiver("agg1", fail={("apply", None)})
    with pytest.raises(PolicyUpdateError, match="serves the previous weights") as err:
        update_fleet([ok, bad], W2, V1, "wait", incoming=_incoming([]))
    assert not isinstance(err.value, FleetBroken)
    for e in (ok, bad):
        assert e.steps[-4:] == ["reload:1", "invalidate", "drop", "resume"]


def test_going_back_to_weights_that_came_from_ranks_is_a_broken_fleet():
    """No engine holds the previous version's weights when they came over the wire."""
    previous = PolicyCheckpoint(1, "", "d" * 64)
    engines = [Receiver("agg0"), Receiver("agg1", fail={("apply", None)})]
    with pytest.raises(FleetBroken, match="going back to 1:d+ failed too.*is not staged"):
        update_fleet(engines, W2, previous, "wait", incoming=_incoming([]))
    assert all("resume" not in e.steps and e.steps[-1] == "drop" for e in engines)


# -- what each engine control sends, and what an update hands each step -----------------------

class Wire:
    """Every request a control sends as (method, path, body, params, timeout), answered from
    `answers` by path (a list: one answer after another); the sleeps between its tries."""

    def __init__(self, monkeypatch, answers=None):
        self.sent, self.sleeps, self.answers = [], [], answers or {}
        monkeypatch.setattr(policy.httpx, "request", self.request)
        monkeypatch.setattr(policy.time, "sleep", self.sleeps.append)

    def request(self, method, url, json=None, params=None, timeout=None):
        path = url.removeprefix("http://engine:8000")
        self.sent.append((method.upper(), path, json, params, timeout))  # httpx upper-cases it
        answer = self.answers.get(path, {"status": "ok"})
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        return answer if isinstance(answer, httpx.Response) else httpx.Response(200, json=answer)


def test_a_vllm_engine_is_sent_its_development_routes_as_vllm_takes_them(monkeypatch):
    """vLLM 0.31's dev-mode server: a refused cache reset is tried again after 0.2 s, doubling."""
    wire = Wire(monkeypatch, {"/weight_info": {"weight_version": V2.label},
                              "/reset_prefix_cache": [{"success": False}, {"success": False},
                                                      {"success": True}]})
    engine = VllmControl("0", "http://engine:8000")
    engine.pause("keep")
    engine.load(V2)
    engine.load(W2)
    engine.drop_staged()
    engine.invalidate("keep")
    version = engine.version()
    engine.resume()

    def rpc(method, kwargs):
        return ("POST", "/collective_rpc", {"method": method, "kwargs": kwargs}, None, 600.0)
    reset = ("POST", "/reset_prefix_cache", None,
             {"reset_running_requests": "true", "reset_external": "true"}, 600.0)
    assert wire.sent == [
        ("POST", "/pause", None, {"mode": "keep", "clear_cache": "false"}, 600.0),
        rpc("reload_weights", {"weights_path": "/ckpt/v2"}),
        ("POST", "/update_weight_version", {"new_version": V2.label}, None, 600.0),
        rpc("start_weight_update", {}),
        rpc("update_weights", {"update_info": {"action": "apply", "digest": W2.digest}}),
        rpc("finish_weight_update", {}),
        ("POST", "/update_weight_version", {"new_version": W2.label}, None, 600.0),
        rpc("start_weight_update", {}), rpc("update_weights", {"update_info": {"action": "drop"}}),
        rpc("finish_weight_update", {}),
        reset, reset, reset,
        ("GET", "/weight_info", None, None, 600.0),
        ("POST", "/resume", None, None, 600.0)]
    assert version == V2.label and wire.sleeps == [0.2, 0.4]


def test_a_dynamo_worker_is_sent_its_engine_routes_as_dynamo_takes_them(monkeypatch):
    """Dynamo 1.6.1's /engine routes; a prefill worker pauses in wait mode whatever the mode."""
    from serving.weight_transfer import Rendezvous

    wire = Wire(monkeypatch, {"/engine/get_weight_version": {"status": "ok",
                                                             "version": V2.label}})
    prefill = DynamoControl("prefill0", "http://engine:8000", timeout_s=30.0, hands_off_kv=True)
    prefill.pause("abort")
    prefill.load(V2)
    prefill.receive(_incoming([]), 1)
    prefill.load(W2)
    prefill.invalidate("wait")
    version = prefill.version()
    prefill.resume()

    def engine(route, body):
        return ("POST", f"/engine/{route}", body, None, 30.0)

    def rpc(method, **kwargs):
        return engine("update_weights_from_distributed",
                      {"engine_rpc": method, "reset_prefix_cache": False, **kwargs})
    received = {"action": "receive", "plan": {"digest": W2.digest},
                "rendezvous": Rendezvous("127.0.0.1", 1, "k", 2).as_dict(), "engine_rank": 1}
    assert wire.sent == [
        engine("pause_generation", {"mode": "wait", "clear_cache": False}),
        engine("update_weights_from_disk", {"model_path": "/ckpt/v2",
                                            "weight_version": V2.label}),
        rpc("start_weight_update"), rpc("update_weights", update_info=received),
        rpc("finish_weight_update"),
        rpc("start_weight_update"),
        rpc("update_weights", update_info={"action": "apply", "digest": W2.digest}),
        rpc("finish_weight_update"),
        engine("set_weight_version", {"weight_version": W2.label}),
        engine("pause_generation", {"mode": "keep", "clear_cache": True}),
        engine("get_weight_version", {}),
        engine("resume_generation", {})]
    assert version == V2.label


def test_a_worker_settling_kv_in_transit_is_resumed_for_half_a_second_and_paused_in_the_mode(
        monkeypatch):
    refused = {"status": "error", "message": "running requests waiting for remote KV transfer"}
    wire = Wire(monkeypatch, {"/engine/pause_generation": [refused, {"status": "ok"},
                                                           {"status": "ok"}]})
    DynamoControl("decode0", "http://engine:8000").settle("abort")
    reset = ("POST", "/engine/pause_generation", {"mode": "keep", "clear_cache": True}, None,
             600.0)
    assert wire.sent == [
        reset, ("POST", "/engine/resume_generation", {}, None, 600.0),
        ("POST", "/engine/pause_generation", {"mode": "abort", "clear_cache": False}, None,
         600.0),
        reset]
    assert wire.sleeps == [0.5]


def test_an_engine_that_cannot_be_reached_or_answers_an_error_fails_the_step_saying_so(
        monkeypatch):
    def unreachable(method, url, **kwargs):
        raise httpx.ConnectError("refused")
    monkeypatch.setattr(policy.httpx, "request", unreachable)
    with pytest.raises(PolicyUpdateError, match=r"^engine e0: /resume: ConnectError: refused$"):
        VllmControl("e0", "http://engine:8000").resume()
    Wire(monkeypatch, {"/resume": httpx.Response(503, text="x" * 400),
                       "/pause": httpx.Response(200),
                       "/engine/get_weight_version": httpx.Response(200, json=["busy"])})
    with pytest.raises(PolicyUpdateError) as err:
        VllmControl("e0", "http://engine:8000").resume()
    assert str(err.value) == "engine e0: /resume: HTTP 503: " + "x" * 300
    assert VllmControl("e0", "http://engine:8000")._request("POST", "/pause") == {}  # no body
    with pytest.raises(PolicyUpdateError, match=r"^engine d0: get_weight_version: \['busy'\]$"):
        DynamoControl("d0", "http://engine:8000").version()


class ModeEngine(Engine):
    """Records the mode each settle and invalidate gets; `transit`: loads of the new weights
    that KV reaches meanwhile (the next reset refused until the engine goes back)."""

    def __init__(self, name, fail=(), transit=0, hands_off_kv=False):
        super().__init__(name, fail)
        self.transit, self.hands_off_kv, self.refuse = transit, hands_off_kv, False

    def load(self, checkpoint):
        super().load(checkpoint)
        if checkpoint == V2 and self.transit:
            self.transit, self.refuse = self.transit - 1, True

    def settle(self, mode):
        self._step(f"settle:{mode}")

    def invalidate(self, mode):
        self._step(f"invalidate:{mode}")
        if self.refuse:
            self.refuse = False
            raise policy.KvInTransit(f"engine {self.name}: remote KV")


class ModeReceiver(Receiver):
    settle = ModeEngine.settle

    def invalidate(self, mode):
        self._step(f"invalidate:{mode}")


@pytest.mark.parametrize("mode", ["wait", "abort", "keep"])
def test_every_step_of_an_update_and_of_its_ways_back_runs_in_the_update_s_mode(mode):
    """KV reaching an engine during the load on every try but the last (the fleet goes back
    and loads again), a load that fails (it goes back for good), weights from ranks."""
    def modes(engine):
        return {s.split(":")[1] for s in engine.steps
                if s.split(":")[0] in ("pause", "settle", "invalidate")}
    late = [ModeEngine("prefill0", transit=policy.SWITCH_TRIES - 1, hands_off_kv=True),
            ModeEngine("decode0")]
    update_fleet(late, V2, V1, mode)
    assert [e.steps.count("load:2") for e in late] == [policy.SWITCH_TRIES] * 2
    failing = [ModeEngine("prefill0", hands_off_kv=True), ModeEngine("decode0", {("load", 2)})]
    with pytest.raises(PolicyUpdateError, match="serves the previous weights"):
        update_fleet(failing, V2, V1, mode)
    received = ModeReceiver("agg0")
    update_fleet([received], W2, V1, mode, incoming=_incoming([]))
    assert received.steps == [f"pause:{mode}", f"settle:{mode}", "receive", f"settle:{mode}",
                              "apply", f"invalidate:{mode}", "drop", "resume"]
    assert all(modes(e) == {mode} for e in [*late, *failing])


def test_an_update_s_steps_take_no_more_than_the_update_and_its_transfer_is_counted_once():
    class Slow(Receiver):
        def transfer(self, update_info):
            if update_info["action"] == "receive":
                time.sleep(0.1)
            super().transfer(update_info)

    for engines, checkpoint, incoming in [([Slow("agg0")], W2, _incoming([])),
                                          ([Engine("agg0")], V2, None)]:
        start = time.perf_counter()
        times = update_fleet(engines, checkpoint, V1, "wait", incoming=incoming)
        took = time.perf_counter() - start
        steps = times.as_dict()
        assert steps == {"pause_s": times.pause_s, "weights_s": times.weights_s,
                         "invalidate_s": times.invalidate_s, "resume_s": times.resume_s,
                         "transfer_s": times.transfer_s, "total_s": times.total_s}
        assert all(s >= 0 for s in steps.values()) and times.total_s <= took
        assert times.total_s == pytest.approx(sum(v for k, v in steps.items() if k != "total_s"))
        assert (times.transfer_s >= 0.1) if incoming else times.transfer_s == 0.0


def test_a_fleet_that_cannot_resume_after_going_back_is_broken_and_says_on_what():
    engines = [Engine("agg0", {("load", 2), ("resume", None)})]
    with pytest.raises(FleetBroken, match=r"^resuming on 1:a+ failed"):
        update_fleet(engines, V2, V1, "wait")
    mute = Engine("agg1", {("load", 2), ("load", 1)})

    def no_answer():
        raise PolicyUpdateError("no answer")
    mute.version = no_answer
    with pytest.raises(FleetBroken, match=r"'agg1': 'unknown \(no answer\)'"):
        update_fleet([mute], V2, V1, "wait")


def test_a_pause_that_fails_resumes_every_engine_and_raises_the_pause_s_error():
    engines = [Engine("agg0", {("pause:wait", None), ("resume", None)}), Engine("agg1")]
    with pytest.raises(PolicyUpdateError, match="agg0: pause:wait failed"):
        update_fleet(engines, V2, V1, "wait")
    assert engines[1].steps == ["pause:wait", "resume"]
    with pytest.raises(PolicyUpdateError, match=r"unknown pause mode 'later'; one of \("):
        update_fleet(engines, V2, V1, "later")


def test_a_step_runs_on_every_engine_at_once():
    """Eight engines, each step waiting for the seven others (a pool of fewer threads than
    engines would run them in turns and never let the eighth start)."""
    barrier = threading.Barrier(8, timeout=5)
    policy.on_all([Engine(str(i)) for i in range(8)], lambda c: barrier.wait())
