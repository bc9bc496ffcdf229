#!/usr/bin/env bash
# The whole test suite: set-up (system packages, .venv) then every layer of tests
# (unit -> origin conformance on POSIX + S3 -> mounted -> torch end-to-end), then ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check airfs tests scripts
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
