"""The seed's published figures for its GLM-5.3 fleet (shared/notes/peers.md, kv-formats.md):
the one home of every number the simulation is compared with. None of them is an input."""

# How the seed's tok/s per user is read: one figure per fleet, the mean over its users (a p10
# would be said); the fit and the ratio search judge it so, the planner by the p10.
TOK_S_STAT = "mean"

PUBLISHED = {
    "tok_s_user": 101.0,  # at 1P:4D with 66 sessions per prefill group
    "sessions_per_prefill_group": 66,
    "itl_p90_reduction": 0.40,  # p90 ITL, disaggregated vs aggregated
    "fp8_tokens": 1.09e6,  # KV tokens per decoder, 576-byte rows
    "nvfp4_tokens": 1.63e6,  # the same with 352-byte rows
    # one TP8 worker's KV transfer (vLLM, one workload): per-layer -> block-major
    "per_layer_descriptors": 19_559,
    "block_major_descriptors": 1_940,
    "per_layer_ms": 146.0,
    "block_major_ms": 78.0,
}
