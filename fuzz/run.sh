#!/usr/bin/env bash
# Runs a libFuzzer target (docs/reliability.md):
#   fuzz/run.sh TARGET SECONDS [libFuzzer options...]
#   fuzz/run.sh all SECONDS        each target in turn (what .ci/run does)
# TARGET: spwt, size, config, replay_args or sim_config. Builds build-fuzz/ with clang
# first (SPILLWAY_FUZZ=ON; FUZZ_BUILD names another folder). The committed
# seeds (fuzz/corpus/TARGET) are read, never written: what the run finds
# goes to build-fuzz/corpus/TARGET, kept between runs, and a crash, leak,
# UBSan report or time-out to build-fuzz/artifacts/TARGET/ (the input that
# did it). Exits non-zero when the run found one. One process (-jobs=1) per
# target: add -fork=N or -jobs=N yourself for more cores.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=(spwt size config replay_args sim_config)
if [[ $# -lt 2 || ! "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: fuzz/run.sh TARGET|all SECONDS [libFuzzer options...]  (TARGET: ${TARGETS[*]})" >&2
  exit 2
fi
target=$1 seconds=$2
shift 2
if [[ $target == all ]]; then
  run=("${TARGETS[@]}")
elif [[ " ${TARGETS[*]} " == *" $target "* ]]; then
  run=("$target")
else
  echo "fuzz/run.sh: unknown target '$target' (known: ${TARGETS[*]})" >&2
  exit 2
fi
build=${FUZZ_BUILD:-build-fuzz}

CC=clang CXX=clang++ cmake -S . -B "$build" -DSPILLWAY_FUZZ=ON -DSPILLWAY_WERROR=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "${FUZZ_JOBS:-2}" --target "${run[@]/#/fuzz_}"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
status=0
for t in "${run[@]}"; do
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t" "$build/logs"
  dict=()
  [[ -f fuzz/dict/$t.dict ]] && dict=(-dict="fuzz/dict/$t.dict")
  log=$build/logs/$t.log
  echo "== fuzz_$t for ${seconds} s (log: $log)"
  set +e
  "$build/bin/fuzz_$t" "$build/corpus/$t" "fuzz/corpus/$t" "${dict[@]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t/" "$@" >"$log" 2>&1
  rc=$?
  set -e
  # libFuzzer's last status line ("#N DONE cov: C ft: F corp: ...") and its
  # final statistics.
  grep -E '^#[0-9]+\s+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -n 1 || true
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
  if [[ $rc -ne 0 ]]; then
    echo "fuzz_$t FAILED (exit $rc): the report, then the input in $build/artifacts/$t/" >&2
    grep -E -A 30 'ERROR: |runtime error|check failed' "$log" | head -n 60 >&2 || tail -n 40 "$log" >&2
    ls -l "$build/artifacts/$t/" >&2
    status=1
  fi
done
exit $status
