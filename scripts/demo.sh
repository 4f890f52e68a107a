#!/usr/bin/env bash
# Sets everything up, then runs moecore's demonstration on built-in synthetic data.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd /tmp  # import the installed package, not the source tree
"${PYTHON:-python3}" -m moecore check
"${PYTHON:-python3}" -m moecore demo "$@"
