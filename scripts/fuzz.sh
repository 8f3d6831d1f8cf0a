#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) into build-fuzz/ with clang, ASan and
# UBSan, and runs each for the given seconds (default 60) from its seed corpus
# (fuzz/corpus/<target>/; the inputs it finds go to build-fuzz/corpus/). Prints
# per target the executions, the coverage (libFuzzer's final cov:) and the
# findings (build-fuzz/findings/); exits non-zero when any target found one.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=(fuzz_tree_json fuzz_npy fuzz_c_api fuzz_incremental_planner fuzz_validate)

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREEATTN_FUZZ=ON \
  -DTREEATTN_CUDA=OFF -DTREEATTN_VULKAN=OFF -DTREEATTN_BUILD_CLI=OFF -DTREEATTN_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
cmake --build build-fuzz --target "${targets[@]}" >/dev/null

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=0
printf '%-26s %12s %8s  %s\n' target executions cov findings
for target in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$target findings=build-fuzz/findings/$target log=build-fuzz/$target.log
  mkdir -p "$corpus" "$findings"
  status=0
  build-fuzz/fuzz/$target "$corpus" "fuzz/corpus/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$findings/" >"$log" 2>&1 || status=$?
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
  found=$(find "$findings" -type f | wc -l)
  printf '%-26s %12s %8s  %s\n' "$target" "${executions:-?}" "${cov:-?}" "$found"
  if ((status != 0 || found > 0)); then
    failed=1
    echo "fuzz: $target failed (exit $status); its log is $log, the inputs are in $findings/" >&2
  fi
done
exit "$failed"
