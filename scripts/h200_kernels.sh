#!/usr/bin/env bash
# One device call for kernels/: build the CUDA decode (ptxas report kept), its GPU tests first,
# then every kernel test, the benchmark, and (with NCU="H B ...") ncu reports of one kernel at
# those shapes. Every step has a time limit, so a hung kernel costs minutes, not the call.
#   run: bash scripts/h200_kernels.sh                          (build, tests, bench)
#        NCU="16 64 64 128" bash scripts/h200_kernels.sh       (+ ncu of the CUDA kernel)
#        NCU="64 128" NCU_KERNEL=_split_kernel NCU_PATHS=nvfp4,fp8 BENCH=0 bash ...  (Triton)
#        CUDA_VARIANTS="0 1 2 3" CUDA_ONLY=1 TESTS=0 SHAPES=16x64,64x128 bash ...
#          (gate each CUDA kernel variant alone, then time the ones that passed, nothing else)
#        PROBE="15 16" ...   (+ kernels/probe_pieces.py: the pieces of one H16 B64 call, per variant)
#        PROBE_HB="64 128" PROBE="27 29 31" ...   (the probe at another H, B: the 64-head kernel;
#          variants 31, 32 add each role's wait clocks)
#        TESTS_K="cuda" TESTS_LAST=1 ...   (only the kernel tests that pytest -k selects; variants that failed
#          their gate are always left out of the test run, so that a hung one costs its gate only)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

t0=$SECONDS
ROLLFLEET_CUDA_VERBOSE=1 timeout 300 python3 -c \
  "from kernels.cuda_decode import _ext; print('smem', _ext().smem_bytes())" > "$OUT/build.log" 2>&1
echo "build rc=$? $((SECONDS - t0)) s"; grep -E "error|registers|spill|smem|C75" "$OUT/build.log"

# Gate: the simplest CUDA tests (one split; two, merged), per kernel variant (each in its own
# process, so that a hung variant costs its time limit only); if every variant fails, nothing else
# runs the CUDA kernel.
default_v=$(python3 -c "from kernels.cuda_decode import default_variant; print(default_variant())")
ok_variants=""
bad_k=""
: > "$OUT/tests.log"
for v in ${CUDA_VARIANTS:-$default_v}; do
  timeout 120 python3 -m pytest -x -q -p no:cacheprovider -o timeout=60 -o timeout_method=thread \
    tests/kernels -k "(cuda_one_slot or cuda_zero_q or cuda_two_splits) and v$v" >> "$OUT/tests.log" 2>&1
  rc=$?; echo "cuda gate variant $v rc=$rc"
  if [ $rc = 0 ]; then ok_variants="$ok_variants,$v"; else tail -15 "$OUT/tests.log"; bad_k="$bad_k and not v$v"; fi
done
ok_variants=${ok_variants#,}
if [ -z "$ok_variants" ]; then export BENCH_NO_CUDA=1 NCU=""; sel="not cuda"; else sel=""; fi
sel="${TESTS_K:-}${sel:+${TESTS_K:+ and }$sel}"
if [ -n "$bad_k" ]; then sel="${sel:-(v0 or not v0)}$bad_k"; fi
run_tests() {
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -n 8 -p no:cacheprovider -o timeout=90 \
    -o timeout_method=thread tests/kernels ${sel:+-k "$sel"} >> "$OUT/tests.log" 2>&1
  echo "kernel tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -15
}
# TESTS_LAST=1: the benchmark first (its numbers come back even if the call runs out of time)
if [ "${TESTS:-1}" = 1 ] && [ "${TESTS_LAST:-0}" != 1 ]; then run_tests; fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout 300 python3 scripts/bench_kernels.py --out "$OUT" ${SHAPES:+--shapes $SHAPES} \
    ${ok_variants:+--cuda-variants $ok_variants} ${CUDA_ONLY:+--cuda-only} > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  sed -n '/^   H /,$p' "$OUT/bench.log"
fi
if [ "${TESTS:-1}" = 1 ] && [ "${TESTS_LAST:-0}" = 1 ]; then run_tests; fi
# PROBE="15 16": where one few-heads call's time goes (kernels/probe_pieces.py), per variant that
# passed its gate
if [ -n "${PROBE:-}" ]; then
  pv=""; for v in $PROBE; do case ",$ok_variants," in *",$v,"*) pv="$pv,$v";; esac; done
  set -- ${PROBE_HB:-16 64}
  timeout 240 python3 -m kernels.probe_pieces --variants "${pv#,}" --heads "$1" --batch "$2" \
    --out "$OUT" > "$OUT/probe.log" 2>&1
  echo "probe rc=$?"; sed -n '/^H[0-9]* B/,$p' "$OUT/probe.log"; grep -E "Error|error" "$OUT/probe.log" | tail -5
fi
set -- ${NCU:-}
while [ $# -ge 2 ]; do
  h=$1 b=$2; shift 2
  rep=/tmp/ncu_h${h}_b${b}
  # each path launches 3 times: profile the third launch of the kernel (warm caches, compiled)
  # NCU_SECTIONS="SpeedOfLight WarpStateStats ...": those sections only (fewer replay passes)
  if [ -n "${NCU_SECTIONS:-}" ]; then what=$(printf -- "--section %s " $NCU_SECTIONS); else what="--set full"; fi
  timeout 150 ncu --clock-control none $what --import-source yes \
      -k "regex:${NCU_KERNEL:-decode_kernel}" --launch-skip 2 --launch-count 1 -f -o "$rep" \
      python3 scripts/bench_kernels.py --profile "$h" "$b" --profile-paths "${NCU_PATHS:-cuda}" \
      > /dev/null 2>&1
  echo "ncu h$h b$b rc=$?"
  ncu -i "$rep.ncu-rep" --page details > "$OUT/ncu_h${h}_b${b}.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv 2>/dev/null \
      | gzip > "$OUT/ncu_h${h}_b${b}_sass.csv.gz"
done
