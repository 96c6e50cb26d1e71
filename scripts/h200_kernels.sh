#!/usr/bin/env bash
# One device call for kernels/: GPU tests, the benchmark, and (with NCU="H B ...") ncu reports
# of the two decodes at those shapes, as text. Everything lands in $OUT.
#   run: bash scripts/h200_kernels.sh                  (tests + bench)
#        NCU="16 64 64 128" BENCH=0 bash scripts/h200_kernels.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels 2>&1 | tail -15
fi
if [ "${BENCH:-1}" = 1 ]; then
  python3 scripts/bench_kernels.py --out "$OUT" ${SHAPES:+--shapes $SHAPES} > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  sed -n '/^   H /,$p' "$OUT/bench.log"
fi
set -- ${NCU:-}
while [ $# -ge 2 ]; do
  h=$1 b=$2; shift 2
  rep=/tmp/ncu_h${h}_b${b}
  # launches: NVFP4 x3 then FP8 x3; profile the last of each (warm caches, compiled)
  ncu --clock-control none --set full --import-source yes -k regex:_split_kernel \
      --launch-skip 2 --launch-count 4 -f -o "$rep" \
      python3 scripts/bench_kernels.py --profile "$h" "$b" > /dev/null 2>&1
  echo "ncu h$h b$b rc=$?"
  ncu -i "$rep.ncu-rep" --page details > "$OUT/ncu_h${h}_b${b}.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv 2>/dev/null \
      | gzip > "$OUT/ncu_h${h}_b${b}_sass.csv.gz"
done
