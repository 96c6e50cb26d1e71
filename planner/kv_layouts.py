"""`python -m planner layouts`: one TP8 worker's KV transfer per turn of the seed's sessions,
per-layer vs block-major, predicted by the descriptor model beside the published figures.
Nothing is fitted to them: GLM-5.3's layout (79 MLA caches and 22 indexer caches, 101 regions
per-layer, 1 block-major; 64-token blocks), the runs per block the real connector posted in the
probe's steady state (planner/connector.py), the tokens moved from the workload (or, in
`calibrate`, from the replay: what each decoder lacked), and the transport's two constants
from another measurement (descriptors.TRANSPORTS, `simulate.kv_transport`).

MLA keeps the whole latent on every rank, so a TP8 worker's transfer is 8 identical rank
transfers side by side: the count and time of one rank are the worker's figures.
"""

from __future__ import annotations

from planner import connector, descriptors, offline, perf, workload
from planner.config import SimulateConfig
from planner.published import PUBLISHED
from planner.table import print_table


def geometry(kv_cache_dtype: str) -> descriptors.Geometry:
    return perf.kv_geometry(kv_cache_dtype, offline.BLOCK)


def tokens_moved(sessions: list[list[workload.Turn]]) -> dict[str, int]:
    """Mean tokens a turn's transfer moves: the whole prompt (a decoder that holds none of the
    session), or only what the previous turn did not leave on the decoder (its prompt and
    completion)."""
    turns = [t for s in sessions for t in s]
    new = []
    for s in sessions:
        new.append(s[0].prompt)
        new += [b.prompt - (a.prompt + a.output) for a, b in zip(s, s[1:], strict=False)]
    return {"whole prompt": round(sum(t.prompt for t in turns) / len(turns)),
            "new tokens only": round(sum(new) / len(new))}


def predict(kv_cache_dtype: str, blocks: float, transport: descriptors.Transport,
            share: float) -> dict[str, float]:
    """Descriptors and ms of a rank's transfer of `blocks` blocks, both layouts."""
    geo = geometry(kv_cache_dtype)
    nbytes = blocks * geo.block * geo.bytes_per_token
    out = {"blocks": blocks, "bytes": nbytes}
    for layout in descriptors.LAYOUTS:
        n = descriptors.LAYOUTS[layout](geo) * blocks * share
        out[layout] = n
        out[f"{layout}_ms"] = transport.ms(n, nbytes)
    return out


def run(cfg: SimulateConfig, kv_cache_dtype: str, sessions: list[list[workload.Turn]]) -> dict:
    geo, transport = geometry(kv_cache_dtype), descriptors.TRANSPORTS[cfg.kv_transport]
    share = connector.run_share()
    p = PUBLISHED
    rows, out = [], {}
    for case, tokens in tokens_moved(sessions).items():
        c = descriptors.compare(geo, tokens, transport, share.share)
        out[case] = vars(c)
        rows.append([case, f"{tokens:,}", f"{c.per_layer:,.0f} -> {c.block_major:,.0f}",
                     f"{c.per_layer_ms:.0f} -> {c.block_major_ms:.0f}",
                     f"{descriptors.error(c.per_layer, p['per_layer_descriptors']):+.0%} / "
                     f"{descriptors.error(c.block_major, p['block_major_descriptors']):+.0%}",
                     f"{descriptors.error(c.per_layer_ms, p['per_layer_ms']):+.0%} / "
                     f"{descriptors.error(c.block_major_ms, p['block_major_ms']):+.0%}"])
    print(f"\nKV transfer of one TP8 worker per turn: {geo.regions} regions per-layer ({geo.layers}"
          f" x {geo.row} B {kv_cache_dtype} + {geo.indexer_layers} x {geo.indexer_row} B indexer),"
          f" {geo.block}-token blocks, {share.share:.2f} runs per block ({share.source}); "
          f"transport {cfg.kv_transport}: {transport.descriptor_us:.2f} us per descriptor + bytes "
          f"at {transport.gbps:.0f} GB/s ({transport.source})")
    print(f"published: {p['per_layer_descriptors']:,} -> ~{p['block_major_descriptors']:,} "
          f"descriptors, {p['per_layer_ms']:.0f} -> {p['block_major_ms']:.0f} ms")
    table = print_table(["tokens moved", "tokens", "descriptors per-layer -> block-major",
                         "ms", "descriptor error", "time error"], rows)
    return {"table": table, "geometry": vars(geo), "run_share": vars(share),
            "transport": cfg.kv_transport, "transport_constants": vars(transport), "cases": out,
            "published": {k: p[k] for k in ("per_layer_descriptors", "block_major_descriptors",
                                             "per_layer_ms", "block_major_ms")}}
