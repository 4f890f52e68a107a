#!/usr/bin/env bash
# Sets everything up, then runs all tests: the GoogleTest suite through ctest, again under
# sanitizers, and the pytest suite against the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test-deps
ctest --test-dir build/py --output-on-failure -j2
scripts/sanitize.sh  # the C++ suite again under ASan+UBSan and TSan
"${PYTHON:-python3}" -m pytest tests_py -q -p no:cacheprovider "$@"
