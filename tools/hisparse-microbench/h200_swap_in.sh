#!/usr/bin/env bash
# One device call for the swap-in (issue 3): build, GPU tests, memcheck on the small tests, then
# the swap-in microbenchmarks selected by $1 (a --benchmark_filter regex). Logs go to $OUT; a
# short table of us/call and GB/s is printed last.
set -o pipefail
out=${OUT:-/tmp/hotperf}
mkdir -p "$out"
filter=${1:-'^swap_in/pool_gb:16/batch:(1|64)/hot:4096/row:656/'}
touch kernels/hotcache/* tools/hisparse-microbench/* tests/gpu/hotcache_swap_in_gpu_test.cpp
cmake --preset cuda >"$out/configure.log" 2>&1 &&
  cmake --build --preset cuda -j16 --target hisparse-microbench gpu_hotcache_swap_in_gpu_test \
    >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
ctest --preset gpu -R Hotcache --timeout 120 2>&1 | tee "$out/ctest.log" | tail -4
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 \
  build/cuda/tests/gpu_hotcache_swap_in_gpu_test \
  --gtest_filter='*Worked*:*WiderThanOneTile*:*Grouped*:*FallsBack*' >"$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(grep -c 'ERROR SUMMARY: 0 errors' "$out/memcheck.log") clean summaries"
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 3 \
  build/cuda/tests/gpu_hotcache_swap_in_gpu_test --gtest_filter='*Worked*:*Grouped*' \
  >"$out/racecheck.log" 2>&1
echo "racecheck rc=$? $(grep -m1 'RACECHECK SUMMARY' "$out/racecheck.log")"
build/cuda/tools/hisparse-microbench/hisparse-microbench --benchmark_filter="$filter" \
  --benchmark_out="$out/bench.json" --benchmark_out_format=json >"$out/bench.log" 2>&1
echo "bench rc=$?"
python3 - "$out/bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["benchmarks"]
for r in rows:
    if r.get("error_occurred"):
        print(f"{r['name']:<96} ERROR {r.get('error_message','')}")
        continue
    print(f"{r['name']:<96} {r['us_per_call']:9.1f} us {r['missed_GBps']:6.1f} GB/s")
# swap_in_phases: mean time of each phase of the resolve block (block 0), us and kilocycles.
phases = [r for r in rows if 'ph_all_us' in r]
if phases:
    keys = sorted(k for k in phases[0] if k.startswith('ph') and k.endswith('_us') and k != 'ph_all_us')
    print('phase us (kcyc):', ' '.join(k[4:-3] for k in keys), 'all')
    for r in phases:
        cells = ' '.join(f"{r[k]:.2f}({r[k[:-3] + '_kcyc']:.1f})" for k in keys)
        print(f"{r['name'].split('/',1)[1]:<70} {cells} {r['ph_all_us']:.2f}({r['ph_all_kcyc']:.1f})")
PY
