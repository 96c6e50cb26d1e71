"""The engines' Prometheus counters, read over HTTP: what the cache did, from the engine's side."""

from __future__ import annotations

import httpx

PREFIX_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def scrape(url: str, names: tuple[str, ...] = PREFIX_COUNTERS) -> dict[str, float]:
    """Each named metric summed over its label sets (one engine may report several)."""
    text = httpx.get(url, timeout=5.0).text
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def block_size(url: str) -> int:
    """The engine's KV block size, from vLLM's `cache_config_info` labels."""
    for line in httpx.get(url, timeout=5.0).text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = line[line.index("{") + 1:line.rindex("}")]
            for pair in labels.split('",'):
                key, _, value = pair.partition('="')
                if key.strip() == "block_size":
                    return int(value.strip('"'))
    raise ValueError(f"{url} reports no vllm:cache_config_info block_size")


def prefix_hits(urls: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per engine: prefix-cache queries and hits (tokens) so far."""
    out = {}
    for name, url in urls.items():
        if name == "router":
            continue
        c = scrape(url)
        out[name] = {"queries": c["vllm:prefix_cache_queries_total"],
                     "hits": c["vllm:prefix_cache_hits_total"]}
    return out


def histogram(url: str, name: str) -> dict[float, float]:
    """A Prometheus histogram's cumulative bucket counts by upper bound, summed over label sets."""
    buckets: dict[float, float] = {}
    for line in httpx.get(url, timeout=5.0).text.splitlines():
        if not line.startswith(f"{name}_bucket{{"):
            continue
        le = line[line.index('le="') + 4:]
        bound = float(le[:le.index('"')])
        buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def quantile(buckets: dict[float, float], q: float) -> float:
    """`histogram_quantile` as Prometheus computes it: linear within the bucket that holds q."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return 0.0
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower
