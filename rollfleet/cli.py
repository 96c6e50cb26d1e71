"""The skeleton every command shares: compose a Hydra config from conf/, type its groups (a bad
key, type or choice is one `error:` line and exit 2, before anything starts), and a SIGTERM that
unwinds like Ctrl-C, so every `finally` stops what it started.

Each group's schema is the dataclass of the component that uses it, registered as
`<group>/schema` for the YAML files' defaults lists: its defaults live there and only there.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import field, fields
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from rollfleet.paths import CONF

T = TypeVar("T")
EXIT_BAD_CONFIG = 2


class ConfigError(ValueError):
    """A config value the command cannot use; the message names the key."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds exactly like Ctrl-C. A KeyboardInterrupt, because asyncio re-raises
    only those (and SystemExit) from its callbacks: raised inside a socket write, another
    BaseException was logged as "Fatal write error on socket transport" and swallowed, and
    `serving.serve` never stopped (2026-12-02)."""


_sigterm_received = False


def _terminate(signum: int, _frame: Any) -> None:
    global _sigterm_received
    _sigterm_received = True
    raise Terminated()


def sigterm_received() -> bool:
    """Whether this process got SIGTERM: Ray turns a KeyboardInterrupt raised while it waits
    (Terminated included) into a plain one, so the exception's type cannot say."""
    return _sigterm_received


def terminate_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _terminate)


def store_schema(group: str, cls: type) -> None:
    """Register `cls` as Hydra's `<group>/schema`."""
    from hydra.core.config_store import ConfigStore

    node = OmegaConf.structured(cls)
    OmegaConf.set_readonly(node, False)  # the dataclasses are frozen; the config is not
    ConfigStore.instance().store(group=group, name="schema", node=node)


def compose(config: str, overrides: list[str], schemas: dict[str, type]) -> tuple[
        DictConfig, dict[str, Any]]:
    """conf/<config>.yaml with `overrides`, and each group of `schemas` typed; ConfigError
    (one line) for anything wrong."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    for group, cls in schemas.items():
        store_schema(group, cls)
    try:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            cfg = hydra_compose(config, overrides=overrides)
        return cfg, {group: typed(cls, cfg[group], group) for group, cls in schemas.items()}
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(one_line(exc)) from None


def one_line(exc: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line errors as one line, without the search-path noise."""
    text = f"{exc}\n{exc.__cause__}" if exc.__cause__ else str(exc)
    return " ".join(ln.strip() for ln in text.splitlines() if ln.strip()
                    and not ln.strip().startswith(("Config search path", "provider=")))


def bad_config(message: str) -> int:
    """Say it on one line; the exit code of a command refused before anything started."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def one_of(default: str, choices: Any) -> Any:
    """A setting with a fixed set of values (a dataclass field), checked by `typed`."""
    return field(default=default, metadata={"choices": tuple(choices)})


def typed(cls: type[T], node: Any, group: str) -> T:
    """Build `cls` from a config group; unknown keys, wrong types and values outside a field's
    `choices` (its metadata) are ConfigErrors."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(values, dict):
        raise ConfigError(f"config group {group!r} must be a mapping, got {values!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in config group {group!r}; "
                          f"known keys: {sorted(known)}")
    for name, value in values.items():
        choices = known[name].metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"{group}.{name} must be one of {list(choices)}, got {value!r}")
        kind = known[name].type
        if kind in ("int", "float") and (not isinstance(value, int | float)
                                         or isinstance(value, bool)):
            raise ConfigError(f"{group}.{name} must be a number, got {value!r}")
        if kind == "int" and isinstance(value, float):
            raise ConfigError(f"{group}.{name} must be an integer, got {value!r}")
        if kind == "dict[str, str]":  # environment variables: `X=16` on the command line is an int
            if not isinstance(value, dict) or any(isinstance(v, dict | list | None)
                                                  for v in value.values()):
                raise ConfigError(f"{group}.{name} must map names to plain values, got {value!r}")
            values[name] = {str(k): str(v) for k, v in value.items()}
    return cls(**values)
