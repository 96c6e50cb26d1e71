import socket

import pytest

from serving import Cluster, ModelConfig, ServingConfig, ServingError


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


def test_topologies_name_their_workers():
    from serving.cluster import worker_roles

    assert worker_roles(ServingConfig(mode="kv_routed", engines=3)) == [
        ("agg0", "agg"), ("agg1", "agg"), ("agg2", "agg")]
    assert worker_roles(ServingConfig(mode="disagg", prefill_engines=1, decode_engines=2)) == [
        ("prefill0", "prefill"), ("decode0", "decode"), ("decode1", "decode")]
    with pytest.raises(ServingError, match="decode_engines >= 1"):
        worker_roles(ServingConfig(mode="disagg", decode_engines=0))


def test_gpu_topology_is_refused_without_its_gpus(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rollout.config import project_root, register_schemas, typed

    register_schemas()  # the YAML files' defaults name `<group>/schema`
    with initialize_config_dir(str(project_root() / "conf"), version_base=None):
        cfg = compose("config", ["serving=glm5_gpu"])
    serving = typed(ServingConfig, OmegaConf.to_container(cfg.serving, resolve=True), "serving")
    assert (serving.prefill_engines, serving.decode_engines, serving.kv_cache_dtype) == (
        1, 4, "nvfp4")
    with pytest.raises(ServingError, match="needs 40 GPUs; this machine has 0"), \
            Cluster(serving, ModelConfig(), tmp_path, project_root() / ".cache"):
        pass
