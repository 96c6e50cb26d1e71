#!/bin/bash
# The P:D diagnostic table of the README, at the fitted knobs, 5 seeds each.
cd "$(dirname "$0")/../.."
K=$(python3 -c "import json;k=json.load(open('bench/simulate_fit.json'))['calibration']['knobs'];print(f\"simulate.decode_efficiency={k['decode_efficiency']} simulate.prefill_efficiency={k['prefill_efficiency']} simulate.host_kv_tokens={int(k['host_kv_tokens'])} simulate.tool_s={k['tool_s']} simulate.mtp_acceptance={k['mtp_acceptance']}\")")
mkdir -p bench/simulate_prefill_workers
row() { # name P D N extra...
  name=$1; P=$2; D=$3; N=$4; shift 4
  .venv/bin/python -m planner run serving=glm5_gpu serving.prefill_engines=$P serving.decode_engines=$D \
    simulate.sessions=$N $K simulate.seeds=5 simulate.jobs=2 "$@" simulate.out=bench/simulate_prefill_workers/$name.json
  echo "$name rc=$?"
}
row a_1p5d_60 1 5 60
row b_2p10d_60 2 10 60
row c_2p10d_60_c4 2 10 60 simulate.overlap_credit=4
row d_2p10d_120 2 10 120
row e_2p10d_120_c4 2 10 120 simulate.overlap_credit=4
row f_2p10d_120_c16 2 10 120 simulate.overlap_credit=16
row g_2p10d_120_h1 2 10 120 simulate.host_hit_weight=1
row h_2p10d_120_c16h1 2 10 120 simulate.overlap_credit=16 simulate.host_hit_weight=1
row i_2p10d_120_affine 2 10 120 simulate.policy=kv_affine
