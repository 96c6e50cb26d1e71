"""Tests of scripts/, which is not a package: each test module loads its script by path."""

import importlib.util
import sys
from types import ModuleType

from rollfleet.paths import ROOT


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py as a module, registered under its name (a dataclass in it looks its
    module up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
