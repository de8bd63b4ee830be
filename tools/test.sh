#!/usr/bin/env bash
# The project's one test command: the Rust suite, then the Python package's suite
# (which reuses the dependencies the Rust suite built in target/).
#
#   tools/test.sh            (HMCT_PYTHON: the Python for the onnxruntime cross-checks
#                             and the package; python3 when unset)
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace
tools/python-tests.sh
