"""`python -m planner layouts`: one TP8 worker's KV transfer per turn of the seed's
sessions, per-layer vs block-major, predicted by the descriptor model beside the published
figures. Nothing is fitted to them: the geometry is GLM-5.3's (79 cached layers, the KV format's
row plus the DSA indexer's, 64-token blocks), the tokens moved come from the workload, and the
transport's two constants from another measurement (descriptors.TRANSPORTS,
`simulate.kv_transport`).

MLA keeps the whole latent on every rank, so a TP8 worker's transfer is 8 identical rank
transfers side by side: the count and time of one rank are the worker's figures.
"""

from __future__ import annotations

from planner import descriptors, offline, perf, workload
from planner.config import SimulateConfig
from planner.published import PUBLISHED
from planner.table import print_table


def geometry(kv_cache_dtype: str) -> descriptors.Geometry:
    row = perf.kv_bytes_per_token(kv_cache_dtype) // perf.KV_LAYERS
    return descriptors.Geometry(perf.KV_LAYERS, row, offline.BLOCK)


def tokens_moved(sessions: list[list[workload.Turn]]) -> dict[str, int]:
    """Mean tokens a turn's transfer moves: the whole prompt (a decoder that holds none of the
    session, and what Dynamo 1.6.1's mocker times), or only what the previous turn did not
    leave on the decoder (its prompt and completion)."""
    turns = [t for s in sessions for t in s]
    new = []
    for s in sessions:
        new.append(s[0].prompt)
        new += [b.prompt - (a.prompt + a.output) for a, b in zip(s, s[1:], strict=False)]
    return {"whole prompt": round(sum(t.prompt for t in turns) / len(turns)),
            "new tokens only": round(sum(new) / len(new))}


def run(cfg: SimulateConfig, kv_cache_dtype: str, sessions: list[list[workload.Turn]]) -> dict:
    geo, transport = geometry(kv_cache_dtype), descriptors.TRANSPORTS[cfg.kv_transport]
    p = PUBLISHED
    rows, out = [], {}
    for case, tokens in tokens_moved(sessions).items():
        c = descriptors.compare(geo, tokens, transport)
        out[case] = vars(c)
        rows.append([case, f"{tokens:,}", f"{c.per_layer:,} -> {c.block_major:,}",
                     f"{c.per_layer_ms:.0f} -> {c.block_major_ms:.0f}",
                     f"{descriptors.error(c.per_layer, p['per_layer_descriptors']):+.0%} / "
                     f"{descriptors.error(c.block_major, p['block_major_descriptors']):+.0%}",
                     f"{descriptors.error(c.per_layer_ms, p['per_layer_ms']):+.0%} / "
                     f"{descriptors.error(c.block_major_ms, p['block_major_ms']):+.0%}"])
    print(f"\nKV transfer of one TP8 worker per turn: {geo.layers} layers x {geo.row} B "
          f"({kv_cache_dtype} row + indexer), {geo.block}-token blocks; transport "
          f"{cfg.kv_transport}: {transport.descriptor_us:.2f} us per descriptor + bytes at "
          f"{transport.gbps:.0f} GB/s ({transport.source})")
    print(f"published: {p['per_layer_descriptors']:,} -> ~{p['block_major_descriptors']:,} "
          f"descriptors, {p['per_layer_ms']:.0f} -> {p['block_major_ms']:.0f} ms")
    table = print_table(["tokens moved", "tokens", "descriptors per-layer -> block-major",
                         "ms", "descriptor error", "time error"], rows)
    return {"table": table, "geometry": vars(geo), "transport": cfg.kv_transport,
            "transport_constants": vars(transport), "cases": out,
            "published": {k: p[k] for k in ("per_layer_descriptors", "block_major_descriptors",
                                             "per_layer_ms", "block_major_ms")}}
