"""Completions sent straight to a Dynamo frontend, and what they say about the engines."""

from __future__ import annotations

import httpx

from serving.metrics import fetch, total


def complete(url: str, prompt: list[int], max_tokens: int, *, session: str | None = None,
             worker: str | None = None) -> tuple[int, dict]:
    """One greedy completion through the frontend at `url` -> (HTTP status, body). `session`
    binds it (x-dynamo-session-id); `worker` pins it to a worker's instance id (hex)."""
    nvext: dict = {"extra_fields": ["worker_id"]}
    if worker is not None:
        nvext["backend_instance_id"] = int(worker, 16)
    resp = httpx.post(f"{url}/v1/completions", timeout=300,
                      headers={"x-dynamo-session-id": session} if session else None,
                      json={"model": "tiny-glm", "prompt": prompt, "max_tokens": max_tokens,
                            "temperature": 0, "nvext": nvext})
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, {"text": resp.text}


def served_by(body: dict) -> tuple[str | None, str]:
    """(prefill, decode) worker instance ids (hex) that served a completion."""
    ids = body["nvext"]["worker_id"]
    prefill = ids.get("prefill_worker_id")
    return (None if prefill is None else f"{prefill:x}"), f"{ids['decode_worker_id']:x}"


def cached(body: dict) -> int:
    return (body.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def tier_hits(metrics_url: str) -> float:
    """Prompt tokens an engine has taken from the KV tier."""
    return total(fetch(metrics_url), "vllm:external_prefix_cache_hits_total", metrics_url)
