"""New policy weights for running engines: checked before any engine switches, loaded in place,
read back before anything samples again.

An update is: pause every engine (turns in flight wait, are aborted, or are kept, by `mode`;
engines that hand KV to others first: `pause_all`), let what would keep an engine's cache from
being dropped run out on the old weights (a decode worker's request waiting for its KV:
nothing runs on new weights before every cache is dropped), load the checkpoint on every
engine (vLLM's `reload_weights`: the model's own loader over the folder's safetensors, the
engine's weight version set to the checkpoint's label), publish the new served policy (the
KV tier's connectors key their blocks by it), drop every KV computed with the old weights
(the prefix cache, running requests' KV, and the tier connector's namespace: a cache reset
whose result is checked), read every engine's weight version back, resume. If one engine
fails or reports another version, every engine goes back to the previous checkpoint the same
way, so the fleet never serves two versions; if that fails too, or the resume does, the error
(`FleetBroken`) names every engine and the version it reports, and nothing resumes.

Weights that come from a trainer's ranks instead of a folder (`Incoming`,
serving/weight_transfer.py) are received by every engine, staged and checked, after the pause
and before any engine loads: a rank that never sends or bytes that arrive wrong fail the update
with every engine still on the old weights. They load from the staged copy, which stays until
the update ends, so a load undone and done again needs no second transfer. Going back needs
the previous version's weights: a folder's (the model's, or a folder a trainer handed over);
after weights that came over the wire there is none, and a failure past the load is
`FleetBroken`.

Each engine is reached through its control routes (`EngineControl`): vLLM's server routes for
development (`VLLM_SERVER_DEV_MODE=1`, set for the engines the project starts; loopback only)
and a Dynamo worker's `/engine/*` routes on its system port. Prefill and decode workers of a
disaggregated fleet are paused and resumed in the order KV flows between them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from serving.checkpoints import PolicyCheckpoint, PolicyUpdateError
from serving.config import PAUSE_MODES
from serving.weight_transfer import Rendezvous, TransferPlan

log = logging.getLogger(__name__)

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # vLLM's update routes (on loopback, like the server)
REMOTE_KV_WAIT_S = 30.0  # how long a decode worker's reset waits out a request's KV in transit
RESET_TRIES = 5  # a vLLM cache reset refused while blocks are held (async saves) is tried again
SWITCH_TRIES = 3  # loads undone because KV reached an engine meanwhile, before the update fails


class KvInTransit(PolicyUpdateError):
    """An engine holds a request waiting for its KV from another engine: its cache cannot be
    dropped until that lands, which takes running it."""


class FleetBroken(PolicyUpdateError):
    """An update failed and so did the way back (or the resume): the engines may serve
    different weights, so nothing may sample from them again. The message names every engine
    and the version it reports."""


@dataclass(frozen=True)
class UpdateTimes:
    """Seconds each step of one update took, over the whole fleet."""

    pause_s: float  # pausing and settling
    weights_s: float  # loading
    invalidate_s: float
    resume_s: float
    transfer_s: float = 0.0  # receiving from a trainer's ranks (weights that came as files: 0)

    @property
    def total_s(self) -> float:
        return (self.pause_s + self.transfer_s + self.weights_s + self.invalidate_s
                + self.resume_s)

    def as_dict(self) -> dict[str, float]:
        """Step -> seconds, the total included (what a trainer logs)."""
        return {**asdict(self), "total_s": self.total_s}


@dataclass(frozen=True)
class Incoming:
    """Weights on their way from a trainer's ranks (serving/weight_transfer.py): the plan, where
    the groups meet, and whom to tell once the engines wait for the rows."""

    plan: TransferPlan
    rendezvous: Rendezvous
    receiving: Callable[[], None] = lambda: None


# -- engine controls -------------------------------------------------------------------------------

class EngineControl:
    """One engine's pause / load / reset / version / resume, over HTTP. `hands_off_kv`: its
    finished requests hold KV until another engine reads it (a prefill worker): it pauses
    before the others and resumes after them."""

    name: str

    def __init__(self, name: str, url: str, timeout_s: float = 600.0,
                 hands_off_kv: bool = False) -> None:
        self.name, self.url, self.timeout_s = name, url, timeout_s
        self.hands_off_kv = hands_off_kv

    def _request(self, method: str, path: str, body: dict | None = None,
                 params: dict | None = None) -> Any:
        try:
            resp = httpx.request(method, f"{self.url}{path}", json=body, params=params,
                                 timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise PolicyUpdateError(f"engine {self.name}: {path}: {type(exc).__name__}: "
                                    f"{exc}") from None
        if resp.status_code != 200:
            raise PolicyUpdateError(f"engine {self.name}: {path}: HTTP {resp.status_code}: "
                                    f"{resp.text[:300]}")
        return resp.json() if resp.content else {}

    def pause(self, mode: str) -> None:
        raise NotImplementedError

    def load(self, checkpoint: PolicyCheckpoint) -> None:
        """The checkpoint's weights (its folder's, or those `receive` staged), and its label as
        the engine's weight version."""
        if checkpoint.path:
            self.reload(checkpoint)
        else:
            self.transfer({"action": "apply", "digest": checkpoint.digest})
            self.declare(checkpoint)

    def reload(self, checkpoint: PolicyCheckpoint) -> None:
        """The checkpoint folder's weights, and its label as the engine's weight version."""
        raise NotImplementedError

    def receive(self, incoming: Incoming, engine_rank: int) -> None:
        """Every rank's rows, staged beside the weights served, checked, not loaded."""
        self.transfer({"action": "receive", "plan": incoming.plan.as_dict(),
                       "rendezvous": incoming.rendezvous.as_dict(),
                       "engine_rank": engine_rank})

    def drop_staged(self) -> None:
        self.transfer({"action": "drop"})

    def transfer(self, update_info: dict) -> None:
        """One step of the engine's weight transfer (serving/engine/weight_transfer.py)."""
        for method, kwargs in (("start_weight_update", {}),
                               ("update_weights", {"update_info": update_info}),
                               ("finish_weight_update", {})):
            self.rpc(method, kwargs)

    def rpc(self, method: str, kwargs: dict) -> None:
        """`method` of the engine's worker, with JSON `kwargs`."""
        raise NotImplementedError

    def settle(self, mode: str) -> None:
        """Paused, before the load: whatever keeps `invalidate` from working later (a request
        waiting on something outside the engine) is let run out now, on the weights it began
        on, so that nothing ever runs on new weights over old KV. Most engines have nothing."""

    def invalidate(self, mode: str) -> None:
        """Drop every cached KV block, running requests' and the host tier's included (its
        connector moves to the served policy's namespace), without running anything;
        PolicyUpdateError unless the engine says it did."""
        raise NotImplementedError

    def version(self) -> str:
        """The weight version the engine reports (a checkpoint's label)."""
        raise NotImplementedError

    def declare(self, checkpoint: PolicyCheckpoint) -> None:
        """The engine serves `checkpoint` already (it started from it): say so."""
        raise NotImplementedError

    def resume(self) -> None:
        raise NotImplementedError


class VllmControl(EngineControl):
    """vLLM's OpenAI server, development routes (`VLLM_SERVER_DEV_MODE=1`)."""

    def pause(self, mode: str) -> None:
        self._request("POST", "/pause", params={"mode": mode, "clear_cache": "false"})

    def reload(self, checkpoint: PolicyCheckpoint) -> None:
        self.rpc("reload_weights", {"weights_path": checkpoint.path})
        self.declare(checkpoint)

    def rpc(self, method: str, kwargs: dict) -> None:
        self._request("POST", "/collective_rpc", {"method": method, "kwargs": kwargs})

    def invalidate(self, mode: str) -> None:
        # running requests (keep mode's frozen ones) are preempted: recomputed under the new
        # weights when they resume. vLLM answers 200 with success false while blocks are
        # held (an asynchronous save): tried again, then an error.
        for attempt in range(RESET_TRIES):
            answer = self._request("POST", "/reset_prefix_cache", params={
                "reset_running_requests": "true", "reset_external": "true"})
            if answer.get("success") is True:
                return
            time.sleep(0.2 * 2 ** attempt)
        raise PolicyUpdateError(f"engine {self.name}: /reset_prefix_cache: the engine did not "
                                f"drop its cache ({answer}) in {RESET_TRIES} tries")

    def version(self) -> str:
        return str(self._request("GET", "/weight_info").get("weight_version"))

    def declare(self, checkpoint: PolicyCheckpoint) -> None:
        self._request("POST", "/update_weight_version", {"new_version": checkpoint.label})

    def resume(self) -> None:
        self._request("POST", "/resume")


class DynamoControl(EngineControl):
    """A Dynamo vLLM worker's engine routes on its system port (`/engine/<route>`)."""

    def _engine(self, route: str, body: dict) -> dict:
        answer = self._request("POST", f"/engine/{route}", body)
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise PolicyUpdateError(f"engine {self.name}: {route}: {message}")
        return answer

    def pause(self, mode: str) -> None:
        # A prefill worker's requests end at their first token: it lets them end and hand their
        # KV off, and the decode workers, paused after it, wait for, cut or keep the turns as
        # `mode` says. A request aborted on the prefill worker reaches the client as an error
        # (Dynamo 1.6.1's frontend: HTTP 500), and its rollout starts over.
        self._engine("pause_generation", {"mode": "wait" if self.hands_off_kv else mode,
                                          "clear_cache": False})

    def reload(self, checkpoint: PolicyCheckpoint) -> None:
        # Dynamo resets the prefix cache after loading but ignores the reset's result and
        # leaves the KV connector alone: `invalidate` does it properly
        self._engine("update_weights_from_disk", {"model_path": checkpoint.path,
                                                  "weight_version": checkpoint.label})

    def rpc(self, method: str, kwargs: dict) -> None:
        # the one route of Dynamo 1.6.1 that hands a worker method JSON kwargs with no
        # deadline of its own (its init route stops the worker after one); paused workers only
        self._engine("update_weights_from_distributed", {
            "engine_rpc": method, "reset_prefix_cache": False, **kwargs})

    def settle(self, mode: str) -> None:
        # vLLM 0.31 cannot drop a decode engine's cache while a request there waits for its KV
        # from the prefill worker (seen in the loop benchmark: a request that reached the
        # decode worker as the fleet paused, or a cancelled one's leftover). In wait and abort
        # modes nothing of ours runs on: resume so that it lands and ends (on the weights it
        # began on, which is why this runs before the load), and try again. In keep mode the
        # turns kept would run on, so it fails instead.
        deadline = time.monotonic() + REMOTE_KV_WAIT_S
        while True:
            try:
                self.invalidate(mode)
                return
            except KvInTransit:
                if mode == "keep" or time.monotonic() > deadline:
                    raise
                log.info("engine %s: a request still waits for its KV; resetting again",
                         self.name)
                self._engine("resume_generation", {})
                time.sleep(0.5)
                self._engine("pause_generation", {"mode": mode, "clear_cache": False})

    def invalidate(self, mode: str) -> None:
        # A pause with clear_cache is the one route of Dynamo 1.6.1 whose cache reset reaches
        # the KV connector, drops running requests' KV and reports a failure (its flush and
        # update routes do neither). The engine is paused already; `keep` leaves it so.
        try:
            self._engine("pause_generation", {"mode": "keep", "clear_cache": True})
        except PolicyUpdateError as exc:
            if "remote KV" in str(exc):
                raise KvInTransit(str(exc)) from None
            raise

    def version(self) -> str:
        return str(self._engine("get_weight_version", {}).get("version"))

    def declare(self, checkpoint: PolicyCheckpoint) -> None:
        self._engine("set_weight_version", {"weight_version": checkpoint.label})

    def resume(self) -> None:
        self._engine("resume_generation", {})


def on_all(controls: list[EngineControl], step: Callable[[EngineControl], None]) -> None:
    """`step` on every engine at once; the first failure is raised after all have run."""
    with ThreadPoolExecutor(max(1, len(controls))) as pool:
        futures = [pool.submit(step, c) for c in controls]
        errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]


def versions(controls: list[EngineControl]) -> dict[str, str]:
    """Each engine's reported weight version (or why it could not say)."""
    out = {}
    for c in controls:
        try:
            out[c.name] = c.version()
        except PolicyUpdateError as exc:
            out[c.name] = f"unknown ({exc})"
    return out


def check_versions(controls: list[EngineControl], checkpoint: PolicyCheckpoint) -> None:
    """PolicyUpdateError unless every engine reports `checkpoint`'s label."""
    seen = versions(controls)
    wrong = {name: v for name, v in seen.items() if v != checkpoint.label}
    if wrong:
        raise PolicyUpdateError(f"engines report other weights than {checkpoint.label}: "
                                f"{wrong}")


def switch_to(controls: list[EngineControl], checkpoint: PolicyCheckpoint, mode: str,
              publish: Callable[[PolicyCheckpoint], None],
              loaded: list[EngineControl] | None = None) -> tuple[float, float]:
    """Load `checkpoint` on every engine, publish it as served, drop every cache, read the
    versions back; (seconds loading, seconds invalidating). `loaded` collects the engines that
    began loading (a load that fails halfway may have changed weights too)."""
    t0 = time.perf_counter()

    def load(c: EngineControl) -> None:
        if loaded is not None:
            loaded.append(c)
        c.load(checkpoint)

    on_all(controls, load)
    t1 = time.perf_counter()
    publish(checkpoint)
    on_all(controls, lambda c: c.invalidate(mode))
    check_versions(controls, checkpoint)
    return t1 - t0, time.perf_counter() - t1


def update_fleet(controls: list[EngineControl], checkpoint: PolicyCheckpoint,
                 previous: PolicyCheckpoint, mode: str,
                 publish: Callable[[PolicyCheckpoint], None] = lambda c: None,
                 incoming: Incoming | None = None) -> UpdateTimes:
    """Pause, settle, load, publish, invalidate, check, resume every engine (see the module's
    docstring). `publish` makes a checkpoint the served one for whatever keys by it (the KV
    tier); it runs before the caches are dropped. `incoming`: the checkpoint's weights come
    from a trainer's ranks; every engine receives and checks them (engine i as rank i of the
    rendezvous) before any loads them, and drops its staged copy at the end."""
    if mode not in PAUSE_MODES:
        raise PolicyUpdateError(f"unknown pause mode {mode!r}; one of {PAUSE_MODES}")
    t0 = time.perf_counter()
    try:
        pause_all(controls, mode)
        on_all(controls, lambda c: c.settle(mode))
    except Exception:  # nothing switched yet: serve on, on the old weights
        resume_all(controls, _resume_quietly)
        raise
    transfer_s = 0.0
    if incoming is not None:
        try:
            transfer_s = _receive_all(controls, incoming)
            on_all(controls, lambda c: c.settle(mode))  # KV that came meanwhile: old weights
        except Exception:  # nothing loaded: serve on, on the old weights
            _drop_staged(controls)
            resume_all(controls, _resume_quietly)
            raise
    # the staged copy goes before the engines resume (a Dynamo worker takes it only paused)
    drop = (lambda: _drop_staged(controls)) if incoming is not None else (lambda: None)
    return _switch_and_resume(controls, checkpoint, previous, mode, publish, t0, transfer_s,
                              drop)


def _receive_all(controls: list[EngineControl], incoming: Incoming) -> float:
    """Every engine receives the ranks' rows (the ranks, told to send now, wait for every
    engine in their groups); seconds taken."""
    t0 = time.perf_counter()
    ranks = {id(c): i for i, c in enumerate(controls)}
    incoming.receiving()
    on_all(controls, lambda c: c.receive(incoming, ranks[id(c)]))
    return time.perf_counter() - t0


def _drop_staged(controls: list[EngineControl]) -> None:
    for c in controls:
        try:
            c.drop_staged()
        except PolicyUpdateError as exc:
            log.warning("dropping %s's staged weights: %s", c.name, exc)


def _switch_and_resume(controls: list[EngineControl], checkpoint: PolicyCheckpoint,
                       previous: PolicyCheckpoint, mode: str,
                       publish: Callable[[PolicyCheckpoint], None], t0: float,
                       transfer_s: float, before_resume: Callable[[], None]) -> UpdateTimes:
    t1 = time.perf_counter()
    loaded: list[EngineControl] = []
    try:
        weights_s, invalidate_s = _switch_settled(controls, checkpoint, previous, mode,
                                                  publish, loaded)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the engines must not stay paused
        log.error("policy update to %s failed (%s); every engine goes back to %s",
                  checkpoint.label, exc, previous.label)
        try:
            _go_back(controls, loaded, previous, mode, publish)
            check_versions(controls, previous)
        except Exception as back:  # noqa: BLE001 - named in FleetBroken
            before_resume()
            raise FleetBroken(
                f"update to {checkpoint.label} failed ({exc}), and going back to "
                f"{previous.label} failed too ({back}); the engines stay paused, reporting "
                f"{versions(controls)}") from None
        before_resume()
        _resume_or_break(controls, previous)
        raise PolicyUpdateError(f"update to version {checkpoint.version} failed, every engine "
                                f"serves the previous weights ({previous.label}) again: "
                                f"{type(exc).__name__}: {exc}") from exc
    before_resume()
    t2 = time.perf_counter()
    _resume_or_break(controls, checkpoint)
    return UpdateTimes(t1 - t0 - transfer_s, weights_s, invalidate_s,
                       time.perf_counter() - t2, transfer_s)


def _switch_settled(controls: list[EngineControl], checkpoint: PolicyCheckpoint,
                    previous: PolicyCheckpoint, mode: str,
                    publish: Callable[[PolicyCheckpoint], None],
                    loaded: list[EngineControl]) -> tuple[float, float]:
    """`switch_to`; where KV reached an engine while the new weights loaded (a request the
    prefill worker had finished as the fleet paused), the engines go back to `previous`, let
    it land there, and load again."""
    for _ in range(SWITCH_TRIES - 1):
        try:
            return switch_to(controls, checkpoint, mode, publish, loaded)
        except KvInTransit as exc:
            log.info("KV reached an engine during the update to %s (%s); it lands on %s "
                     "first", checkpoint.label, exc, previous.label)
            _go_back(controls, loaded, previous, mode, publish)
            loaded.clear()
    return switch_to(controls, checkpoint, mode, publish, loaded)


def _go_back(controls: list[EngineControl], loaded: list[EngineControl],
             previous: PolicyCheckpoint, mode: str,
             publish: Callable[[PolicyCheckpoint], None]) -> None:
    """The engines that loaded anything load `previous` again; every engine settles (on the
    weights its requests began on) and drops its cache."""
    on_all(loaded, lambda c: c.load(previous))
    publish(previous)
    on_all(controls, lambda c: c.settle(mode))
    on_all(controls, lambda c: c.invalidate(mode))


def pause_all(controls: list[EngineControl], mode: str) -> None:
    """Engines that hand KV off first, then the rest. A prefill worker's pause returns once
    every KV it handed off was read; a decode worker paused first reads none, and the prefill
    worker's pause waited out its KV lease (vLLM 0.31's NIXL connector: `kv_lease_duration`,
    30 s), after which the decode worker would read blocks freed meanwhile."""
    on_all([c for c in controls if c.hands_off_kv], lambda c: c.pause(mode))
    on_all([c for c in controls if not c.hands_off_kv], lambda c: c.pause(mode))


def resume_all(controls: list[EngineControl],
               resume: Callable[[EngineControl], None] = lambda c: c.resume()) -> None:
    """The reverse of `pause_all`: engines that read KV first, so a prefill handed off on
    resume is read at once."""
    on_all([c for c in controls if not c.hands_off_kv], resume)
    on_all([c for c in controls if c.hands_off_kv], resume)


def _resume_or_break(controls: list[EngineControl], checkpoint: PolicyCheckpoint) -> None:
    try:
        resume_all(controls)
    except PolicyUpdateError as exc:
        raise FleetBroken(f"resuming on {checkpoint.label} failed ({exc}); the engines "
                          f"report {versions(controls)}") from None


def _resume_quietly(control: EngineControl) -> None:
    try:
        control.resume()
    except PolicyUpdateError as exc:
        log.warning("resuming %s: %s", control.name, exc)
