"""New policy weights for running engines: checked before any engine switches, loaded in place.

An update is: pause every engine (turns in flight wait, are aborted, or are kept, by `mode`),
drop every KV computed with the old weights (the engine's prefix cache, and the host KV tier:
its connector moves to a new key namespace), load the checkpoint on every engine (vLLM's
`reload_weights`: the model's own loader over the folder's safetensors), resume. If one engine
fails to load, every engine that switched loads the previous checkpoint again, so the fleet
never serves two versions; the error names the engine and the cause.

Each engine is reached through its control routes (`EngineControl`): vLLM's server routes for
development (`VLLM_SERVER_DEV_MODE=1`, set for the engines the project starts; loopback only)
and a Dynamo worker's `/engine/*` routes on its system port. Prefill and decode workers of a
disaggregated fleet are paused together and resumed together.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from serving.errors import ServingError

log = logging.getLogger(__name__)

PAUSE_MODES = ("wait", "abort", "keep")
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # vLLM's update routes (on loopback, like the server)
REMOTE_KV_WAIT_S = 30.0  # how long a decode worker's pause waits out a request's KV in transit


class PolicyUpdateError(ServingError):
    """An update the fleet refused or could not finish; the message names what and where."""


@dataclass(frozen=True)
class UpdateTimes:
    """Seconds each step of one update took, over the whole fleet."""

    pause_s: float
    weights_s: float
    invalidate_s: float
    resume_s: float

    @property
    def total_s(self) -> float:
        return self.pause_s + self.weights_s + self.invalidate_s + self.resume_s

    def as_dict(self) -> dict[str, float]:
        """Step -> seconds, the total included (what a trainer logs)."""
        return {**asdict(self), "total_s": self.total_s}


# -- checkpoints ---------------------------------------------------------------------------------

def _header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """A safetensors file's tensors: name -> (dtype, shape), read from its header alone."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100 << 20:
            raise ValueError(f"header of {size} bytes")
        header = json.loads(f.read(size))
    data = path.stat().st_size - 8 - size
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        end = info["data_offsets"][1]
        if end > data:
            raise ValueError(f"tensor {name} ends at byte {end}, past the file's {data}")
        out[name] = (info["dtype"], tuple(info["shape"]))
    return out


def tensors_of(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor of a checkpoint folder's safetensors files, with dtype and shape."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise PolicyUpdateError(f"checkpoint {folder} has no *.safetensors files")
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        try:
            out.update(_header(file))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PolicyUpdateError(f"checkpoint file {file} cannot be read: {exc}") from None
    return out


def check_checkpoint(served: Path, checkpoint: Path) -> None:
    """PolicyUpdateError naming the first tensor that does not fit the served model (missing,
    extra, another shape or dtype); nothing is loaded anywhere before this passes."""
    if not checkpoint.is_dir():
        raise PolicyUpdateError(f"checkpoint {checkpoint} is not a folder")
    want, have = tensors_of(served), tensors_of(checkpoint)
    missing = sorted(set(want) - set(have))
    if missing:
        raise PolicyUpdateError(f"checkpoint {checkpoint} lacks tensor {missing[0]} "
                                f"({len(missing)} missing)")
    extra = sorted(set(have) - set(want))
    if extra:
        raise PolicyUpdateError(f"checkpoint {checkpoint} has tensor {extra[0]}, which the "
                                f"served model does not ({len(extra)} extra)")
    for name, (dtype, shape) in want.items():
        if have[name][1] != shape:
            raise PolicyUpdateError(f"checkpoint {checkpoint}: tensor {name} has shape "
                                    f"{list(have[name][1])}, the served model {list(shape)}")
        if have[name][0] != dtype:
            raise PolicyUpdateError(f"checkpoint {checkpoint}: tensor {name} is "
                                    f"{have[name][0]}, the served model's is {dtype}")


class SharedMemoryCheckpoints:
    """Tensors a trainer hands over in memory become a checkpoint in host shared memory
    (/dev/shm): written once, read by every engine's loader. The current version and the one
    before it (kept for a rollback) are the only copies."""

    def __init__(self, like: Path) -> None:
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        self.root = Path(tempfile.mkdtemp(prefix="rollfleet-weights-", dir=base))
        self.like = like  # the served model's folder: its other files (config) are copied
        self.kept: list[Path] = []

    def write(self, tensors: dict[str, Any], version: int) -> Path:
        from safetensors.torch import save_file

        folder = self.root / f"v{version}"
        folder.mkdir(parents=True, exist_ok=True)
        for extra in self.like.iterdir():
            if extra.is_file() and extra.suffix != ".safetensors" and \
                    extra.name != "model.safetensors.index.json":
                shutil.copy2(extra, folder / extra.name)
        save_file({k: v.detach().contiguous() for k, v in tensors.items()},
                  str(folder / "model.safetensors"))
        self.kept.append(folder)
        while len(self.kept) > 2:
            shutil.rmtree(self.kept.pop(0), ignore_errors=True)
        return folder

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


# -- engine controls -------------------------------------------------------------------------------

class EngineControl:
    """One engine's pause / reset / load / resume, over HTTP."""

    name: str

    def __init__(self, name: str, url: str, timeout_s: float = 600.0) -> None:
        self.name, self.url, self.timeout_s = name, url, timeout_s

    def _post(self, path: str, body: dict | None = None, params: dict | None = None) -> Any:
        try:
            resp = httpx.post(f"{self.url}{path}", json=body, params=params,
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

    def invalidate(self) -> None:
        """Drop every cached KV block, the host tier's included (its connector's reset)."""
        raise NotImplementedError

    def load(self, checkpoint: Path, version: int) -> None:
        raise NotImplementedError

    def resume(self) -> None:
        raise NotImplementedError

    def abort_all(self) -> None:
        """Abort every request the engine holds (queued ones included)."""
        raise NotImplementedError


class VllmControl(EngineControl):
    """vLLM's OpenAI server, development routes (`VLLM_SERVER_DEV_MODE=1`)."""

    def pause(self, mode: str) -> None:
        self._post("/pause", params={"mode": mode, "clear_cache": "false"})

    def invalidate(self) -> None:
        # running requests (keep mode's frozen ones) are preempted: recomputed under the new
        # weights when they resume
        self._post("/reset_prefix_cache", params={"reset_running_requests": "true",
                                                  "reset_external": "true"})

    def load(self, checkpoint: Path, version: int) -> None:
        self._post("/collective_rpc", {"method": "reload_weights",
                                       "kwargs": {"weights_path": str(checkpoint)}})
        self._post("/update_weight_version", {"new_version": str(version)})

    def resume(self) -> None:
        self._post("/resume")

    def abort_all(self) -> None:
        self._post("/abort_requests", {"abort_all": True})


class DynamoControl(EngineControl):
    """A Dynamo vLLM worker's engine routes on its system port (`/engine/<route>`)."""

    def _engine(self, route: str, body: dict) -> dict:
        answer = self._post(f"/engine/{route}", body)
        if isinstance(answer, dict) and answer.get("status") == "error":
            raise PolicyUpdateError(f"engine {self.name}: {route}: {answer.get('message')}")
        return answer

    def pause(self, mode: str) -> None:
        # Dynamo's pause is the only place a worker's cache reset reaches the KV connector and
        # reports its failure (its flush and update routes ignore the reset's result): the
        # caches are dropped here, while the engine is paused and before the new weights.
        deadline = time.monotonic() + REMOTE_KV_WAIT_S
        while True:
            try:
                self._engine("pause_generation", {"mode": mode, "clear_cache": True})
                return
            except PolicyUpdateError as exc:
                # vLLM 0.31 cannot drop a decode engine's cache while a request there waits
                # for its KV from the prefill worker (seen in the loop benchmark, with no turn
                # of ours in flight: a finished or cancelled request's leftover). In wait and
                # abort modes nothing of ours runs on: resume so that it lands and ends, then
                # pause again. In keep mode the turns kept would run on, so it fails instead.
                if ("remote KV" not in str(exc) or mode == "keep"
                        or time.monotonic() > deadline):
                    raise
                log.info("engine %s: a request still waits for its KV; pausing again", self.name)
                self._engine("resume_generation", {})
                time.sleep(0.5)

    def invalidate(self) -> None:
        pass  # done by pause (above)

    def load(self, checkpoint: Path, version: int) -> None:
        self._engine("update_weights_from_disk", {"model_path": str(checkpoint),
                                                  "weight_version": str(version)})

    def resume(self) -> None:
        self._engine("resume_generation", {})

    def abort_all(self) -> None:
        self._engine("abort_request", {"abort_all": True})


def on_all(controls: list[EngineControl], step: Callable[[EngineControl], None]) -> None:
    """`step` on every engine at once; the first failure is raised after all have run."""
    with ThreadPoolExecutor(max(1, len(controls))) as pool:
        futures = [pool.submit(step, c) for c in controls]
        errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]


def update_fleet(controls: list[EngineControl], checkpoint: Path, version: int,
                 previous: tuple[Path, int], mode: str,
                 after_pause: Callable[[], None] = lambda: None) -> UpdateTimes:
    """Pause, invalidate, load, resume every engine (see the module's docstring). `after_pause`
    runs while the engines are paused, before anything is dropped (a caller settling the turns
    it has in flight)."""
    if mode not in PAUSE_MODES:
        raise PolicyUpdateError(f"unknown pause mode {mode!r}; one of {PAUSE_MODES}")
    t0 = time.perf_counter()
    try:
        on_all(controls, lambda c: c.pause(mode))
        after_pause()
    except Exception:  # nothing switched yet: serve on, on the old weights
        on_all(controls, _resume_quietly)
        raise
    t1 = time.perf_counter()
    switched: list[EngineControl] = []
    try:
        on_all(controls, lambda c: c.invalidate())
        t2 = time.perf_counter()

        def load(c: EngineControl) -> None:
            switched.append(c)  # a load that fails halfway may have changed weights too
            c.load(checkpoint, version)

        on_all(controls, load)
        t3 = time.perf_counter()
    except PolicyUpdateError as exc:
        log.error("policy update to version %d failed (%s); %d engines go back to %s", version,
                  exc, len(switched), previous[0])
        try:
            on_all(switched, lambda c: c.load(*previous))
        finally:
            on_all(controls, _resume_quietly)
        raise PolicyUpdateError(f"update to version {version} failed, every engine serves "
                                f"the previous weights again: {exc}") from None
    on_all(controls, lambda c: c.resume())
    t4 = time.perf_counter()
    return UpdateTimes(t1 - t0, t3 - t2, t2 - t1, t4 - t3)


def _resume_quietly(control: EngineControl) -> None:
    try:
        control.resume()
    except PolicyUpdateError as exc:
        log.warning("resuming %s: %s", control.name, exc)



def complete_model_dir(checkpoint: Path, served: Path, scratch: Path) -> Path:
    """`checkpoint` as a folder an engine can start from: itself if it has a config, else a
    folder in `scratch` with links to its weights and the served model's other files."""
    if (checkpoint / "config.json").is_file():
        return checkpoint
    folder = Path(tempfile.mkdtemp(prefix=f"{checkpoint.name}-", dir=scratch))
    for f in checkpoint.glob("*.safetensors*"):
        (folder / f.name).symlink_to(f.absolute())
    for f in served.iterdir():
        if f.is_file() and not f.name.startswith("model") and not (folder / f.name).exists():
            (folder / f.name).symlink_to(f.absolute())
    return folder
