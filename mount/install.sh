#!/usr/bin/env bash
# Node-startup integration: makes `mount -t fuse.airfs` and fuse.airfs lines in /etc/fstab
# work, and installs the systemd unit template. Run as root from the repository after
# scripts/setup.sh. Pass --prefix DIR if the repository is not at /opt/airfs.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=$(pwd)
[ "${1:-}" = "--prefix" ] && prefix=$2
helper="$prefix/.venv/bin/mount.fuse.airfs"
[ -x "$helper" ] || { echo "install: $helper missing: run scripts/setup.sh first" >&2; exit 1; }
ln -sf "$helper" /sbin/mount.fuse.airfs
echo "installed /sbin/mount.fuse.airfs -> $helper"
if [ -d /etc/systemd/system ]; then
  sed "s#/opt/airfs#$prefix#g" mount/airfs@.service > /etc/systemd/system/airfs@.service
  mkdir -p /etc/airfs
  echo "installed /etc/systemd/system/airfs@.service (configure /etc/airfs/<instance>.env)"
fi
grep -q '^user_allow_other' /etc/fuse.conf 2>/dev/null || echo "note: add user_allow_other to /etc/fuse.conf to let non-root mounts use --allow-other"
