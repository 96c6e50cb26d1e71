"""The topologies a cluster can run, by name: one module each, imported when chosen.

Adding a topology is one module (a `Topology` subclass, serving/topologies/base.py) and one
line here.
"""

from __future__ import annotations

import importlib

TOPOLOGIES = {
    "embedded": "serving.topologies.embedded:Embedded",
    "kv_routed": "serving.topologies.aggregated:Aggregated",
    "disagg": "serving.topologies.disaggregated:Disaggregated",
    "mocker": "serving.topologies.mocker:Mocker",
    "external": "serving.topologies.external:External",
}


def topology_class(name: str) -> type:
    """The Topology subclass registered as `name` (KeyError if none)."""
    module, _, cls = TOPOLOGIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)
