"""`python -m serving.serve`'s announcement, with a stand-in for the cluster (the real command on
every topology is tests/e2e/test_serve.py)."""

from __future__ import annotations

import contextlib
import socket

import pytest

from rollfleet.paths import ROOT
from serving import Endpoint
from serving.process import free_port
from serving.serve import cli
from serving.tiny_model import ensure_tiny_glm


class Announced(Exception):
    """Stops the server once it has said where it serves."""


def test_the_serving_line_comes_once_the_port_listens(monkeypatch, tmp_path):
    """A client (or a script) that waits for the line and connects must find the port open:
    the line used to be printed before the server bound it, and a client that connected at
    once was refused (seen in CI on `embedded`)."""
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", model="tiny-glm",
                        model_dir=str(ensure_tiny_glm(ROOT / ".cache" / "models")),
                        front_door="vllm", request_timeout_s=5)
    monkeypatch.setattr(cli, "Cluster", lambda *a: contextlib.nullcontext(endpoint))
    monkeypatch.setattr(cli, "terminate_on_sigterm", lambda: None)
    port, heard = free_port("127.0.0.1"), []

    def announce(*args, **kwargs):
        line = " ".join(map(str, args))
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            heard.append(line)  # the port accepted a connection when the line came
        raise Announced

    monkeypatch.setattr(cli, "print", announce, raising=False)
    with pytest.raises(Announced):
        cli.serve([f"serve.port={port}", f"run_dir={tmp_path}"])
    assert heard == [f"serving tiny-glm at http://127.0.0.1:{port}/v1 (topology embedded; "
                     f"logs in {tmp_path}); Ctrl-C stops it"]
