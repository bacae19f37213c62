#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test spillway.
# Idempotent and quiet when everything is present.
set -euo pipefail

packages=(cmake g++ make libgtest-dev libgmock-dev libbenchmark-dev libspdlog-dev libfmt-dev
          libunwind-dev libcli11-dev nlohmann-json3-dev python3 python3-pytest
          pkg-config python3-venv python3-pip python3-setuptools python3-wheel  # tests/install
          clang libclang-rt-14-dev  # the libFuzzer targets (fuzz/run.sh, .ci/run)
          python3-torch python3-torchvision python3-numpy python3-matplotlib  # the trace recorder and its tests
          python3-scipy)  # harness/lp_bound.py (HiGHS) and its tests

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log=$(mktemp)
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
           -o=Dpkg::Use-Pty=0 --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-deps: apt-get failed (log above)" >&2
    exit 1
  fi
  rm -f "$log"
fi

# The CUDA 13 toolkit (headers only are used) is not a Debian package; it must be present.
cuda_h=""
for d in "${CUDAToolkit_ROOT:-}" /usr/local/cuda /usr/local/cuda-13.0; do
  [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && { cuda_h="$d/include/cuda.h"; break; }
done
if [ -z "$cuda_h" ] || ! grep -qE '#define CUDA_VERSION 13[0-9]{3}' "$cuda_h"; then
  echo "install-deps: the CUDA 13 toolkit headers (cuda.h, cupti.h) were not found." >&2
  echo "  Install the CUDA 13 toolkit (only headers are used) or set CUDAToolkit_ROOT." >&2
  exit 1
fi
