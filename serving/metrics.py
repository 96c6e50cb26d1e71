"""The engines' Prometheus counters, read over HTTP: what the cache did, from the engine's side."""

from __future__ import annotations

import httpx

PREFIX_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                   "vllm:prompt_tokens_total", "vllm:request_success_total")


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
