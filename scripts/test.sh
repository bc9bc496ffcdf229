#!/usr/bin/env bash
# The whole test suite: set-up (system packages, .venv) then every layer of tests
# (unit -> origin conformance on POSIX + S3 -> mounted -> torch, tables end-to-end), after ruff
# and mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check airfs tests scripts
.venv/bin/python -m mypy   # strict, with the exceptions named in pyproject.toml
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
