import socket

import pytest

from serving import Cluster, ModelConfig, ServingConfig, ServingError, resolve_model_dir


def test_missing_model_path(tmp_path):
    with pytest.raises(ServingError, match="does not exist"):
        resolve_model_dir(ModelConfig(path=str(tmp_path / "nope")), tmp_path)


def test_model_path_without_config(tmp_path):
    with pytest.raises(ServingError, match="no config.json"):
        resolve_model_dir(ModelConfig(path=str(tmp_path)), tmp_path)


def test_port_taken_is_refused_before_start(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cluster = Cluster(ServingConfig(port=port), ModelConfig(), tmp_path, tmp_path / "cache")
        with pytest.raises(ServingError, match=f"port {port} .* already in use"), cluster:
            pass
    assert cluster.engines == []


def test_external_url_that_does_not_answer(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        cfg = ServingConfig(mode="external", base_url=f"http://127.0.0.1:{port}/v1")
        with pytest.raises(ServingError, match="does not answer"), \
                Cluster(cfg, ModelConfig(), tmp_path, tmp_path):
            pass


def test_unknown_mode(tmp_path):
    with pytest.raises(ServingError, match="unknown serving.mode"):
        Cluster(ServingConfig(mode="magic"), ModelConfig(), tmp_path, tmp_path)
