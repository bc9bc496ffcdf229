#!/usr/bin/env bash
# Set up everything airfs needs on a fresh Debian/Ubuntu machine: system packages (FUSE 3 and
# the headers pyfuse3 builds against), a virtual environment at .venv with airfs installed
# editable, torch (CPU build) and the test tools. Idempotent: re-running it is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || need_apt+=(libfuse3-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v gcc >/dev/null || need_apt+=(gcc)
# the test suite runs real tools through the mount: vim (scripted edits), flock(1), rsync
command -v vim >/dev/null || command -v vim.tiny >/dev/null || need_apt+=(vim-tiny)
command -v flock >/dev/null || need_apt+=(util-linux)
command -v setpriv >/dev/null || need_apt+=(util-linux)
# the CSI plugin's tests: mount namespaces with propagation (unshare, nsenter)
command -v unshare >/dev/null && command -v nsenter >/dev/null || need_apt+=(util-linux)
command -v rsync >/dev/null || need_apt+=(rsync)
# PySpark (the tables tests run it in local mode) needs a Java runtime
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)
# benchmarks only (scripts/bench/cold_s3.py's peers, never needed by the tests):
# AIRFS_BENCH_PEERS=1 scripts/setup.sh
if [ "${AIRFS_BENCH_PEERS:-0}" = 1 ]; then
  command -v s3fs >/dev/null || need_apt+=(s3fs)
  command -v rclone >/dev/null || need_apt+=(rclone)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "airfs setup: missing system packages: ${need_apt[*]} (run as root or install them)" >&2
    exit 1
  fi
  echo "airfs setup: installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" python3-dev >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip_q() { .venv/bin/pip install -q --disable-pip-version-check "$@"; }
# torch first, pinned: the CPU build of 2.13.0 is what this kind of machine carries; an
# unpinned torch would pull a multi-GB CUDA build.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  pip_q "torch==${AIRFS_TORCH_VERSION:-2.13.0}"
fi
pip_q -e '.[torch,tables,test,bench,csi]'
echo "airfs setup: ready (.venv/bin/airfs)"
