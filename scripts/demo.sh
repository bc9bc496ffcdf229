#!/usr/bin/env bash
# The main job: set everything up, mount an origin on a /Volumes-style path, and show airfs
# at work: the seed's file operations, a parallel small-file warm, torch.save/torch.load,
# status, flush, and a clean unmount with every write at the origin.
# Usage: scripts/demo.sh [WORKDIR]   (default /tmp/airfs-demo; it is wiped first)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
scripts/setup.sh
airfs=$repo/.venv/bin/airfs
py=$repo/.venv/bin/python
work=${1:-/tmp/airfs-demo}
vol=$work/Volumes
if grep -q " $vol fuse.airfs " /proc/mounts; then "$airfs" umount "$vol" || fusermount3 -u -z "$vol"; fi
rm -rf "$work"
mkdir -p "$work/origin" "$vol"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "an origin with a small-file dataset (2,000 files of 150 KiB)"
"$py" - "$work/origin" <<'PY'
import os, sys
root = os.path.join(sys.argv[1], "main", "default", "images", "train")
os.makedirs(root)
for i in range(2000):
    with open(os.path.join(root, f"img_{i:05d}.jpg"), "wb") as f:
        f.write(os.urandom(150 << 10))
PY

step "airfs mount --origin $work/origin $vol"
"$airfs" mount --origin "$work/origin" --cache-dir "$work/cache" "$vol"
trap '"$airfs" umount "$vol" >/dev/null 2>&1 || fusermount3 -u -z "$vol" 2>/dev/null || true' EXIT

step "the seed's first example: os.makedirs + open(..., 'w'), then ls -l / mkdir -p / touch"
"$py" - "$vol" <<'PY'
import os, sys
dir_path = os.path.join(sys.argv[1], "main", "default", "my_volume", "sub-dir")
file_path = os.path.join(dir_path, "test_file")
os.makedirs(dir_path, exist_ok=True)
with open(file_path, "w") as file:
    file.write("Hello, World!")
print(open(file_path).read())
PY
ls -l "$vol/main/default/my_volume"
mkdir -p "$vol/main/default/my_volume/sub-dir"
touch "$vol/main/default/my_volume/sub-dir/test_file2"
ls -l "$vol/main/default/my_volume/sub-dir"

step "airfs warm -j 256 (pull the small-file dataset into the local cache)"
"$airfs" warm -j 256 "$vol/main/default/images/train"

step "parallel copy out of the mount (the seed's xargs -P 256 cp recipe)"
mkdir -p "$work/local"
start=$(date +%s.%N)
(cd "$vol/main/default/images/train" && find . -type f -print0 | xargs -0 -P 256 -I {} cp --parents "{}" "$work/local/")
echo "copied $(ls "$work/local" | wc -l) files in $(echo "$(date +%s.%N) - $start" | bc) s"

step "torch.save / torch.load(weights_only=True) through the mount"
"$py" - "$vol" <<'PY'
import os, sys, torch
path = os.path.join(sys.argv[1], "main", "default", "my_volume", "sub-dir", "ckpt.pt")
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
ckpt = torch.load(path, weights_only=True)
model.load_state_dict(ckpt["model"]); opt.load_state_dict(ckpt["opt"])
print("checkpoint round trip ok,", os.path.getsize(path), "bytes")
PY

step "airfs status"
"$airfs" status "$vol"

step "airfs flush (every write is at the origin when it returns)"
"$airfs" flush "$vol"

step "airfs umount (drains, then unmounts)"
trap - EXIT
"$airfs" umount "$vol"

step "the origin now holds what was written through the mount"
find "$work/origin/main/default/my_volume" -type f -printf '%p  %s bytes\n'
cat "$work/origin/main/default/my_volume/sub-dir/test_file"; echo
