#!/usr/bin/env bash
# Runs every GPU check of docs/gpu.md in one go and keeps what to report in
# OUT: the machine (env.txt), check_assumptions.py (checks.txt, checks.json)
# and bench_gpt.py (bench.txt, bench/). Each part has its own time limit and
# a failing part does not stop the next, so one short lease gives them all.
#
#   harness/gpu/collect.sh [OUT] [LIBSPILLWAY] [bench_gpt options...]
#   harness/gpu/collect.sh gpu-report build/lib/libspillway.so --steps 20
set -u
out=${1:-gpu-report}
lib=${2:-build/lib/libspillway.so}
shift $(($# > 2 ? 2 : $#))
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi
  nvidia-smi -q | grep -iE "product name|driver version|cuda version|bus type|link (gen|width)|current|max" | head -30
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  lscpu | head -20
  uname -a
} >"$out/env.txt" 2>&1

# libspillway opens CUPTI as "libcupti.so.13" from the library path; PyTorch's
# wheels keep theirs in site-packages: put the directory of the one
# check_assumptions.py would use (cuda_ctypes.find_cupti) first (one copy in
# the process: the loader matches an already loaded soname).
cupti=$("$py" -c "import sys; sys.path.insert(0, '$here'); import cuda_ctypes as cu
print(cu.find_cupti()[1] or '')" 2>/dev/null)
if [ "$(dirname "${cupti:-x}")" != . ]; then
  export LD_LIBRARY_PATH="$(dirname "$cupti")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "cupti: ${cupti:-not found}" >>"$out/env.txt"

PYTHONUNBUFFERED=1 timeout "${CHECK_TIMEOUT:-200}" "$py" "$here/check_assumptions.py" \
  --json "$out/checks.json" --timeout 90 >"$out/checks.txt" 2>&1
echo "check_assumptions.py exit status: $?" >>"$out/checks.txt"

PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-300}" "$py" "$here/bench_gpt.py" \
  --lib "$lib" --out "$out/bench" "$@" >"$out/bench.txt" 2>&1
echo "bench_gpt.py exit status: $?" >>"$out/bench.txt"
