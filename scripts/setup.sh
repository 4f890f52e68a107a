#!/usr/bin/env bash
# Installs what moecore needs on a fresh Debian machine and builds it: system packages with
# apt-get (compiler, CMake, Ninja, Eigen3, GoogleTest, Python headers), Python packages with pip,
# then moecore itself (pip install .) with the C++ test binary in build/py.
# Usage: scripts/setup.sh [--test-deps]
set -euo pipefail
cd "$(dirname "$0")/.."

want_test_deps=0
[[ "${1:-}" == "--test-deps" ]] && want_test_deps=1

apt_packages=(g++ cmake ninja-build libeigen3-dev libgtest-dev python3-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "setup: apt-get install ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
pip=("$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore)
"${pip[@]}" "scikit-build-core>=0.9" "pybind11>=2.12" "numpy>=1.22" "ml_dtypes>=0.4"
if ((want_test_deps)); then
  # torch 2.13.0 is the CPU build (on this machine kind it is taken from the local wheel cache).
  "${pip[@]}" pytest "hypothesis>=6" "torch==2.13.0" "transformers>=4.45" safetensors matplotlib
fi

echo "setup: building moecore (C++ core, Python module, GoogleTest binary)"
"${pip[@]}" --no-build-isolation -C build-dir=build/py -C cmake.define.MOECORE_BUILD_TESTS=ON .
