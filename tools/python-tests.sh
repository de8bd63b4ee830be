#!/usr/bin/env bash
# The Python suite: builds the hmct_rs package into a venv under target/ and runs
# pytest on python/tests. Exit status: pytest's (non-zero on any failure).
#
#   tools/python-tests.sh [PYTHON] [PYTEST ARGS...]   (PYTHON: $HMCT_PYTHON, else python3)
#
# The extension is built by maturin, the backend `pip install .` uses, in the dev
# profile (every dependency optimized, no LTO: the release profile's thin LTO takes
# several times longer) into the root's target/ folder, where `cargo test` has built
# the same dependencies with the same settings, so they are reused. (`--profile test`
# would not do: `cargo rustc --profile test` builds a test harness, not the module.)
# The CLI the tests compare with is built as `cargo test` builds it.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
python="${HMCT_PYTHON:-python3}"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    python="$1"
    shift
fi

venv="$repo/target/pyenv-hmct"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
stamp="$venv/.requirements"
want="$(cat tools/requirements.txt pyproject.toml | sha256sum)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # maturin: the version pyproject.toml's build-system pins.
    maturin="$(sed -n 's/^requires = \["\(maturin[^"]*\)"\]/\1/p' pyproject.toml)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r tools/requirements.txt pytest "$maturin"
    echo "$want" > "$stamp"
fi

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
cargo build --quiet -p hmct-cli --bin hmct-debugger --profile test
# `maturin develop` builds the wheel pyproject.toml describes and installs it into
# the venv (as `pip install .` would, minus the isolated build environment).
CARGO_TARGET_DIR="$repo/target" VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" \
    "$venv/bin/maturin" develop

export HMCT_DEBUGGER="$repo/target/debug/hmct-debugger"
exec "$venv/bin/python" -m pytest -q python/tests "$@"
