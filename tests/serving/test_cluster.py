import socket

import pytest

from serving import ModelConfig, ServingConfig, ServingError
from serving.cluster import Cluster


def test_port_taken_is_refused_before_start(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cluster = Cluster(ServingConfig(port=port), ModelConfig(), tmp_path, tmp_path / "cache")
        with pytest.raises(ServingError, match=f"port {port} .* already in use"), cluster:
            pass
    assert cluster.topology is None and cluster.roster.engines() == ()


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


def test_gpu_topology_is_refused_without_its_gpus(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rollfleet.cli import typed
    from rollfleet.paths import ROOT
    from rollout.config import register_schemas

    register_schemas()  # the YAML files' defaults name `<group>/schema`
    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        cfg = compose("config", ["serving=glm5_gpu"])
    serving = typed(ServingConfig, OmegaConf.to_container(cfg.serving, resolve=True), "serving")
    assert (serving.prefill_engines, serving.decode_engines, serving.kv_cache_dtype) == (
        1, 4, "nvfp4")
    with pytest.raises(ServingError, match="needs 40 GPUs; this machine has 0"), \
            Cluster(serving, ModelConfig(), tmp_path, ROOT / ".cache"):
        pass
