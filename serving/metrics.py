"""The engines' Prometheus metrics, read over HTTP: what the cache did, from the engine's side.

A metric the engine does not report is an error (MetricsError), never a silent 0.0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from serving.errors import ServingError

PREFIX_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
_LINE = re.compile(r"^([^\s{]+)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class MetricsError(ServingError):
    """An engine's /metrics did not answer, or lacks a metric the caller needs."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


def parse(text: str) -> dict[str, list[Sample]]:
    """Prometheus text exposition -> metric name -> its samples (one per label set)."""
    out: dict[str, list[Sample]] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        out.setdefault(name, []).append(Sample(dict(_LABEL.findall(labels or "")), float(value)))
    return out


def fetch(url: str) -> dict[str, list[Sample]]:
    try:
        resp = httpx.get(url, timeout=5.0)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise MetricsError(f"{url}: {type(exc).__name__}: {exc}") from None
    return parse(resp.text)


def total(metrics: dict[str, list[Sample]], name: str, url: str = "") -> float:
    """A metric summed over its label sets (one engine may report several)."""
    if name not in metrics:
        raise MetricsError(f"{url or 'metrics'} reports no {name}")
    return sum(s.value for s in metrics[name])


def scrape(url: str, names: tuple[str, ...] = PREFIX_COUNTERS) -> dict[str, float]:
    metrics = fetch(url)
    return {name: total(metrics, name, url) for name in names}


def cache_config(metrics: dict[str, list[Sample]], url: str = "") -> dict[str, str]:
    """vLLM's `cache_config_info` labels (block_size, num_gpu_blocks, ...)."""
    samples = metrics.get("vllm:cache_config_info")
    if not samples:
        raise MetricsError(f"{url or 'metrics'} reports no vllm:cache_config_info")
    return samples[0].labels


def block_size(url: str) -> int:
    """The engine's KV block size."""
    return int(cache_config(fetch(url), url)["block_size"])


@dataclass(frozen=True)
class KvState:
    """One engine's KV cache: how many tokens it holds, how full it is, preemptions so far."""

    capacity_tokens: int
    usage: float  # fraction of KV blocks in use, 0..1
    preemptions: float  # counter since start


def kv_state(url: str) -> KvState:
    metrics = fetch(url)
    cfg = cache_config(metrics, url)
    blocks = cfg.get("num_gpu_blocks")
    if not blocks or blocks == "None":
        raise MetricsError(f"{url}: vllm:cache_config_info has no num_gpu_blocks yet")
    return KvState(int(blocks) * int(cfg["block_size"]),
                   total(metrics, "vllm:kv_cache_usage_perc", url),
                   total(metrics, "vllm:num_preemptions_total", url))


def prefix_hits(urls: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per engine (name -> its /metrics): prefix-cache queries and hits (tokens) so far."""
    out = {}
    for name, url in urls.items():
        c = scrape(url)
        out[name] = {"queries": c["vllm:prefix_cache_queries_total"],
                     "hits": c["vllm:prefix_cache_hits_total"]}
    return out


def histogram(url: str, name: str) -> dict[float, float]:
    """A Prometheus histogram's cumulative bucket counts by upper bound, summed over label sets."""
    samples = fetch(url).get(f"{name}_bucket")
    if not samples:
        raise MetricsError(f"{url} reports no histogram {name}")
    buckets: dict[float, float] = {}
    for s in samples:
        bound = float(s.labels["le"])
        buckets[bound] = buckets.get(bound, 0.0) + s.value
    return buckets


def quantile(buckets: dict[float, float], q: float) -> float:
    """`histogram_quantile` as Prometheus computes it: linear within the bucket that holds q."""
    bounds = sorted(buckets)
    count_all = buckets[bounds[-1]] if bounds else 0.0
    if count_all <= 0:
        return 0.0
    rank, lower, below = q * count_all, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower
