"""Governed volumes through the mount itself, with real users and a group on root mounts of a
directory and of SeaweedFS S3: every class of operation allowed and refused as the grants say,
the catalog levels refusing mkdir/rmdir/rename (EPERM), the reserved name hidden, a revoke and
a grant made on one node seen by the other within the TTL, and the seed's samples run by a user
with the grants and failing cleanly (a PermissionError naming the volume and privilege) for
one without."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cattest_util import People, Site, User, governed, run_as, site

from airfs.control import client
from airfs.testing.mountfix import fuse_available

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, mounts)"),
    pytest.mark.mount,
]


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def gsite(request: pytest.FixtureRequest, folks: People) -> Iterator[Site]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    seaweed = request.getfixturevalue("seaweed") if request.param == "s3" else None
    with site(request.param, seaweed) as s:
        governed(s, folks)
        if s.origin.kind == "posix":  # a name at the top that the catalog does not know
            (s.base / "origin" / "stray").mkdir()
        s.mount()
        yield s


PROBE = """
V = MP + "/main/raw/images"
S = MP + "/main/raw/secret"
def wr(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)
def rd(path):
    with open(path, "rb") as f:
        return len(f.read())
def mm(path):
    import mmap
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        return len(m[:])
r = {
    "root": attempt(lambda: sorted(os.listdir(MP))),
    "schema": attempt(lambda: sorted(os.listdir(MP + "/main/raw"))),
    "reserved": attempt(os.stat, MP + "/.airfs-catalog"),
    "reserved_file": attempt(rd, MP + "/.airfs-catalog/catalog.json"),
    "read": attempt(rd, V + "/a.bin"),
    "mmap": attempt(mm, V + "/a.bin"),
    "list": attempt(lambda: sorted(os.listdir(V))),
    "secret_read": attempt(rd, S + "/s.bin"),
    "secret_list": attempt(os.listdir, S),
    "create": attempt(wr, V + "/new.bin", b"n" * 100),
    "readback": attempt(rd, V + "/new.bin"),
    "truncate": attempt(os.truncate, V + "/new.bin", 10),
    "rename": attempt(os.rename, V + "/new.bin", V + "/renamed.bin"),
    "symlink": attempt(os.symlink, "new.bin", V + "/sym"),
    "readlink": attempt(os.readlink, V + "/sym"),
    "link": attempt(os.link, V + ("/renamed.bin" if os.path.exists(V + "/renamed.bin")
                                  else "/a.bin"), V + "/hard.bin"),
    "unlink_links": attempt(lambda: [os.unlink(V + "/sym"), os.unlink(V + "/hard.bin")]),
    "mkdir": attempt(os.mkdir, V + "/d"),
    "rmdir": attempt(os.rmdir, V + "/d"),
    "unlink": attempt(os.unlink, V + "/renamed.bin"),
    "overwrite_a": attempt(wr, V + "/a.bin", b"z"),
    "secret_create": attempt(wr, S + "/x.bin"),
    "mkdir_catalog": attempt(os.mkdir, MP + "/newcat"),
    "mkdir_schema": attempt(os.mkdir, MP + "/main/newschema"),
    "mkdir_volume": attempt(os.mkdir, MP + "/main/raw/newvol"),
    "rmdir_volume": attempt(os.rmdir, V),
    "rename_volume": attempt(os.rename, V, MP + "/main/raw/other"),
    "touch_schema": attempt(wr, MP + "/main/raw/file.bin"),
    "cache_dir": attempt(os.listdir, CACHE),
    "cache_index": attempt(os.listdir, CACHE + "/blocks"),
}
print(json.dumps(r))
"""


def test_every_operation_class_as_the_grants_say(gsite: Site, folks: People) -> None:
    mp = gsite.nodes[0].mountpoint
    cache = gsite.nodes[0].cache_dir
    probe = f"CACHE = {str(cache)!r}\n" + PROBE
    a = run_as(folks.alice, mp, probe)
    b = run_as(folks.bob, mp, probe)
    for r in (a, b):
        assert r["root"] == ["ok", ["main"]], r  # no stray name, no .airfs-catalog
        assert r["schema"] == ["ok", ["images", "secret"]]
        assert r["reserved"][0] == "ENOENT" and r["reserved_file"][0] == "ENOENT"
        assert r["read"] == ["ok", 5000] and r["mmap"] == ["ok", 5000]
        assert r["secret_read"][0] == "EACCES" and r["secret_list"][0] == "EACCES"
        assert r["secret_create"][0] == "EACCES"
        assert r["cache_dir"][0] == "EACCES" and r["cache_index"][0] == "EACCES"
        for k in ("mkdir_catalog", "mkdir_schema", "mkdir_volume", "rmdir_volume",
                  "rename_volume", "touch_schema"):  # fmt: skip
            # the levels are 0755 root's: the kernel's mode check refuses first (EACCES)
            assert r[k][0] in ("EPERM", "EACCES"), (k, r[k])
    # alice reads, changes nothing
    assert a["list"] == ["ok", ["a.bin"]]
    for k in ("create", "mkdir", "overwrite_a", "symlink"):
        assert a[k][0] == "EACCES", (k, a[k])
    # a link to root's a.bin: the kernel's protected_hardlinks may refuse it first (EPERM)
    assert a["link"][0] in ("EACCES", "EPERM"), a["link"]
    if gsite.origin.kind == "posix":
        # bob's group reads and writes (the volume directory is 0777: the grants decide)
        for k in ("create", "symlink", "link", "unlink_links", "truncate", "rename", "mkdir",
                  "rmdir", "unlink"):  # fmt: skip
            assert b[k][0] == "ok", (k, b[k])
        assert b["readlink"] == ["ok", "new.bin"]
        assert b["readback"] == ["ok", 100]
        assert b["overwrite_a"][0] == "EACCES"  # a.bin is root's 0644: the mode bits still apply
    else:
        # S3 directories show 0755, owned by the mount's owner: the mode bits refuse first
        assert b["create"][0] == "EACCES"
    # root passes the mode bits: the catalog refuses (EPERM), with a log line
    v = mp / "main" / "raw" / "images"
    for fn, args in (
        (os.mkdir, (mp / "newcat",)),
        (os.mkdir, (mp / "main" / "newschema",)),
        (os.mkdir, (mp / "main" / "raw" / "newvol",)),
        (os.rmdir, (v,)),
        (os.rename, (v, mp / "main" / "raw" / "other")),
        (os.rename, (v / "a.bin", mp / "main" / "raw" / "a.bin")),
    ):
        with pytest.raises(PermissionError) as e:
            fn(*args)
        assert e.value.errno == errno.EPERM, (fn, args)
    assert (v / "a.bin").stat().st_size == 5000
    st = client.status(str(mp))["catalog"]
    assert st["denied_by_errno"]["EPERM"] >= 6
    assert st["denied_by_privilege"]["READ VOLUME"] >= 2
    if gsite.origin.kind == "posix":
        assert st["denied_by_privilege"]["WRITE VOLUME"] >= 2
    log = gsite.nodes[0].log.read_text()
    assert f"catalog: denied {folks.alice.name} (uid {folks.alice.uid}" in log
    assert "missing READ VOLUME on volume main.raw.secret" in log
    assert "mkdir at the catalog level: catalogs, schemas and volumes are catalog objects" in log


def _sees(user: User, mp: Path) -> dict[str, list[object]]:
    out: dict[str, list[object]] = run_as(
        user,
        mp,
        """
        print(json.dumps({
            "main": attempt(lambda: sorted(os.listdir(MP + "/main"))),
            "open": attempt(lambda: open(MP + "/main/raw/images/a.bin", "rb").close()),
        }))
        """,
    )
    return out


def test_revoke_and_grant_on_one_node_reach_the_other_within_the_ttl(
    gsite: Site, folks: People
) -> None:
    a = gsite.nodes[0]
    b = gsite.mount()
    assert _sees(folks.alice, b.mountpoint) == {"main": ["ok", ["raw"]], "open": ["ok", None]}
    args = {"privilege": "USE SCHEMA", "type": "schema", "name": "main.raw",
            "principal": folks.alice.name}  # fmt: skip
    client.request(str(a.mountpoint), "catalog", command="revoke", args=args)
    for _ in range(20):  # each try takes longer than the TTL (0.5 s) to start
        out = _sees(folks.alice, b.mountpoint)
        if out["main"] == ["ok", []]:
            break
    assert out == {"main": ["ok", []], "open": ["ENOENT", out["open"][1]]}, out
    client.request(str(a.mountpoint), "catalog", command="grant", args=args)
    want = {"main": ["ok", ["raw"]], "open": ["ok", None]}
    for _ in range(20):  # the listing and the open may straddle the catalog's reload
        out = _sees(folks.alice, b.mountpoint)
        if out == want:
            break
    assert out == want, out


SEED = """
import subprocess
V = MP + "/main/raw/images"
S = MP + "/main/raw/secret"
r = {}
def sh(cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return [p.returncode, p.stderr.strip()]
# the seed's shell samples
r["ls"] = sh(f"ls -l {V}")
r["mkdir"] = sh(f"mkdir -p {V}/sub-dir")
r["touch"] = sh(f"touch {V}/sub-dir/test_file")
r["cp"] = sh(f"cd {V} && find . -type f -print0 | xargs -0 -P 8 -I {{}} cp --parents '{{}}' {TMP}/")
# torch.save / torch.load(weights_only=True) into the volume
def save_load():
    torch.save({"w": torch.ones(3)}, V + "/sub-dir/ckpt.pt")
    return float(torch.load(V + "/sub-dir/ckpt.pt", weights_only=True)["w"].sum())
r["torch"] = attempt(save_load)
# UCVolumeDataset / DataLoader over the volume, and over one without READ VOLUME
def dataset(root):
    ds = VolumeDataset(root, shuffle=False, local_cache=False)
    return sorted(os.path.basename(p) for p in ds)
for name, root in (("dataset", V), ("dataset_secret", S)):
    try:
        r[name] = ["ok", dataset(root)]
    except PermissionError as exc:
        r[name] = ["PermissionError", str(exc)]
# DCP checkpoint into the volume
def checkpoint(path):
    import torch.distributed.checkpoint as dcp
    dcp.save({"w": torch.arange(4.0)}, storage_writer=VolumeWriter(path), no_dist=True)
    sd = {"w": torch.zeros(4)}
    dcp.load(sd, storage_reader=VolumeReader(path), no_dist=True)
    return float(sd["w"].sum())
try:
    r["dcp"] = ["ok", checkpoint(CK)]
except BaseException as exc:  # DCP wraps errors in CheckpointException (a BaseException)
    r["dcp"] = [type(exc).__name__, str(exc)]
try:
    dcp_sd = {"w": torch.zeros(4)}
    import torch.distributed.checkpoint as dcp
    dcp.load(dcp_sd, storage_reader=VolumeReader(S + "/ck"), no_dist=True)
    r["dcp_load_secret"] = ["ok", None]
except BaseException as exc:
    r["dcp_load_secret"] = [type(exc).__name__, str(exc)]
print(json.dumps(r))
"""

SEED_IMPORTS = """
import torch, torch.distributed.checkpoint, torch.utils.data, mmap
import torch.distributed.checkpoint.filesystem, torch.distributed.checkpoint.default_planner
from airfs.data import VolumeDataset
from airfs.data.checkpoint import VolumeWriter, VolumeReader
import airfs.catalog.explain
"""


def test_seed_samples_run_with_grants_and_fail_cleanly_without(
    gsite: Site, folks: People, tmp_path: object
) -> None:
    pytest.importorskip("torch")
    if gsite.origin.kind != "posix":
        pytest.skip("writes by other users need a volume directory they may write (posix)")
    mp = gsite.nodes[0].mountpoint
    tmp = gsite.base / "copies"
    tmp.mkdir()
    os.chown(tmp, folks.bob.uid, folks.bob.gid)
    # the seed's layout: a checkpoint directory bob makes himself (the flush barrier's mode
    # check takes its owner from the mount: bob)
    pre = f"TMP = {str(tmp)!r}\nCK = MP + '/main/raw/images/checkpoints/step_1000'\n"
    b = run_as(folks.bob, mp, pre + SEED, imports=SEED_IMPORTS)
    assert b["ls"][0] == 0 and b["mkdir"][0] == 0 and b["touch"][0] == 0, b
    assert b["cp"][0] == 0 and (tmp / "a.bin").stat().st_size == 5000, b
    assert b["torch"] == ["ok", 3.0], b
    assert b["dataset"] == ["ok", ["a.bin", "ckpt.pt", "test_file"]], b
    assert b["dcp"] == ["ok", 6.0], b
    missing_read = "needs READ VOLUME on volume main.raw.secret"
    assert b["dataset_secret"][0] == "PermissionError" and missing_read in b["dataset_secret"][1]
    assert b["dcp_load_secret"][0] == "CheckpointException", b
    assert missing_read in b["dcp_load_secret"][1], b
    # alice may read but not write: the writes fail with the privilege named
    tmp2 = gsite.base / "copies2"
    tmp2.mkdir()
    os.chown(tmp2, folks.alice.uid, folks.alice.gid)
    pre = f"TMP = {str(tmp2)!r}\nCK = MP + '/main/raw/images/checkpoints/step_1'\n"
    a = run_as(folks.alice, mp, pre + SEED, imports=SEED_IMPORTS)
    assert a["ls"][0] == 0 and (tmp2 / "a.bin").stat().st_size == 5000, a
    assert a["touch"][0] != 0 and "Permission denied" in a["touch"][1], a
    assert a["torch"][0] == "RuntimeError" and "Permission denied" in a["torch"][1], a
    assert a["dcp"][0] == "CheckpointException", a
    assert "needs WRITE VOLUME on volume main.raw.images" in a["dcp"][1], a
    assert a["dataset_secret"][0] == "PermissionError" and missing_read in a["dataset_secret"][1]


READ_SEED = """
V = MP + "/main/raw/images"
S = MP + "/main/raw/secret"
r = {}
def names(root):
    try:
        return ["ok", sorted(os.path.basename(p) for p in VolumeDataset(root, shuffle=False,
                                                                        local_cache=False))]
    except PermissionError as exc:
        return ["PermissionError", str(exc)]
r["dataset"] = names(V)
r["dataset_secret"] = names(S)
print(json.dumps(r))
"""


def test_dataset_reads_with_read_volume_and_names_what_is_missing(
    gsite: Site, folks: People
) -> None:
    """The seed's UCVolumeDataset on both origins: a reader lists and reads its volume; on one
    without READ VOLUME it gets a PermissionError that names the volume and privilege."""
    pytest.importorskip("torch")
    out = run_as(folks.alice, gsite.nodes[0].mountpoint, READ_SEED, imports=SEED_IMPORTS)
    assert out["dataset"] == ["ok", ["a.bin"]], out
    kind, msg = out["dataset_secret"]
    assert kind == "PermissionError", out
    assert msg.endswith(
        "main/raw/secret: permission denied: needs READ VOLUME on volume main.raw.secret "
        "(see airfs catalog show-grants main.raw.secret)"
    ), msg
