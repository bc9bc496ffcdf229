"""The manifests in mount/kubernetes/ checked against Kubernetes' API models (the official
``kubernetes`` client's): every field known to its model with the model's type (a mistyped or
misplaced field fails, which the client's own deserialiser would silently drop), every object
deserialised by the client, and what the plugin relies on: the DaemonSet's privileged
container, Bidirectional propagation of /Volumes and the kubelet's pods dir from the right
host paths, the registrar's socket path, the driver name everywhere, the PV's attributes
valid for the plugin, and the plugin's arguments accepted by airfs's own parser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

k8s = pytest.importorskip("kubernetes.client")
yaml = pytest.importorskip("yaml")

from airfs.cli.app import build_parser  # noqa: E402
from airfs.csi.node import volume_ref  # noqa: E402

DIR = Path(__file__).resolve().parents[2] / "mount" / "kubernetes"
DRIVER = "csi.airfs.io"  # airfs.csi.server.DRIVER_NAME (not imported: it needs grpc)

_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\[(.+), (.+)\]$|^dict\((.+), (.+)\)$")
_PRIMITIVE: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "object": (str, int, dict, list, bool, float),  # IntOrString, RawExtension
    "datetime": (str,),
    "date": (str,),
}


def check_model(value: Any, type_name: str, where: str) -> list[str]:
    """Problems of ``value`` as the client's type ``type_name`` (a model class name,
    ``list[...]``, ``dict[str, ...]`` or a primitive): unknown keys, wrong types."""
    m = _LIST.match(type_name)
    if m:
        if not isinstance(value, list):
            return [f"{where}: a list expected, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in check_model(v, m.group(1), f"{where}[{i}]")]
    m = _DICT.match(type_name)
    if m:
        inner = m.group(2) or m.group(4)
        if not isinstance(value, dict):
            return [f"{where}: a mapping expected, got {type(value).__name__}"]
        return [p for k, v in value.items() for p in check_model(v, inner, f"{where}.{k}")]
    if type_name in _PRIMITIVE:
        ok = isinstance(value, _PRIMITIVE[type_name])
        if type_name == "int" and isinstance(value, bool):
            ok = False
        return [] if ok else [f"{where}: {type_name} expected, got {value!r}"]
    model = getattr(k8s, type_name)
    if not isinstance(value, dict):
        return [f"{where}: a {type_name} mapping expected, got {value!r}"]
    by_key = {v: k for k, v in model.attribute_map.items()}
    out = []
    for key, v in value.items():
        if key not in by_key:
            out.append(f"{where}.{key}: not a field of {type_name}")
            continue
        out += check_model(v, model.openapi_types[by_key[key]], f"{where}.{key}")
    return out


class _Response:
    """What ``ApiClient.deserialize`` reads: a response with a JSON body in ``data``."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc)


def model_name(doc: dict[str, Any]) -> str:
    version = doc["apiVersion"].rsplit("/", 1)[-1]
    return f"{version.capitalize()}{doc['kind']}"


def load_all() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":  # kustomize's, not an API object
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def objects(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in load_all() if d["kind"] == kind]


def test_every_manifest_matches_the_api_models() -> None:
    docs = load_all()
    kinds = sorted(d["kind"] for _, d in docs)
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "CSIDriver", "ConfigMap", "Secret", "DaemonSet",
         "PersistentVolume", "PersistentVolumeClaim", "Pod"]
    )  # fmt: skip
    api = k8s.ApiClient()
    for name, doc in docs:
        model = model_name(doc)
        problems = check_model(doc, model, f"{name}:{doc['kind']}")
        assert problems == []
        obj = api.deserialize(_Response(doc), model)  # the client's own checks (required...)
        assert type(obj).__name__ == model
        assert obj.metadata.name == doc["metadata"]["name"]


def test_the_checker_refuses_unknown_and_mistyped_fields() -> None:
    """The check above can fail: a misspelt field, one in the wrong place, a wrong type."""
    (ds,) = objects("DaemonSet")
    mount = ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][1]
    mount["mountPropogation"] = mount.pop("mountPropagation")
    ds["spec"]["template"]["spec"]["privileged"] = True
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = "yes"
    problems = check_model(ds, "V1DaemonSet", "ds")
    assert any(
        "volumeMounts[1].mountPropogation: not a field of V1VolumeMount" in p for p in problems
    )
    assert any("template.spec.privileged: not a field of V1PodSpec" in p for p in problems)
    assert any("securityContext.privileged: bool expected, got 'yes'" in p for p in problems)


def test_daemonset_privileged_with_bidirectional_propagation() -> None:
    (ds,) = objects("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    containers = {c["name"]: c for c in pod["containers"]}
    airfs = containers["airfs"]
    assert airfs["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m for m in airfs["volumeMounts"]}
    for path in ("/Volumes", "/var/lib/kubelet/pods"):
        assert mounts[path]["mountPropagation"] == "Bidirectional"
        assert host[mounts[path]["name"]] == path  # the same path inside and outside
    assert host[mounts["/dev/fuse"]["name"]] == "/dev/fuse"
    # the socket: the kubelet finds it where the registrar says, under the driver's name
    assert host[mounts["/csi"]["name"]] == f"/var/lib/kubelet/plugins/{DRIVER}"
    reg = containers["node-driver-registrar"]["args"]
    assert f"--kubelet-registration-path=/var/lib/kubelet/plugins/{DRIVER}/csi.sock" in reg
    assert "--csi-address=/csi/csi.sock" in reg
    regmounts = {
        m["mountPath"]: m["name"] for m in containers["node-driver-registrar"]["volumeMounts"]
    }
    assert host[regmounts["/registration"]] == "/var/lib/kubelet/plugins_registry"
    # the other containers need no privilege
    for name in ("node-driver-registrar", "liveness-probe"):
        assert "securityContext" not in containers[name]


def test_daemonset_args_are_airfs_csi_serve_arguments() -> None:
    """The container's arguments, with the ConfigMap's values put in as the kubelet does,
    parse with airfs's own parser; the mount options parse as ``airfs mount``'s."""
    (ds,) = objects("DaemonSet")
    (cm,) = objects("ConfigMap")
    env = {**cm["data"], "NODE_ID": "node-1"}
    airfs = ds["spec"]["template"]["spec"]["containers"][0]
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in airfs["args"]]
    ns = build_parser().parse_args(args)
    assert (ns.cmd, ns.csi_cmd, ns.endpoint) == ("csi", "serve", "unix:///csi/csi.sock")
    assert ns.mountpoint == "/Volumes" and ns.origin == env["AIRFS_ORIGIN"]
    mount = build_parser().parse_args(["mount", *ns.mount_options, "--origin", ns.origin, "/V"])
    assert mount.cache_dir == "/var/cache/airfs"
    mounts = {m["mountPath"]: m["name"] for m in airfs["volumeMounts"]}
    assert mounts[mount.cache_dir] == "cache"
    # SIGTERM's drain fits in the grace period
    assert ns.drain_timeout < ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def test_driver_name_and_volume_attributes() -> None:
    (driver,) = objects("CSIDriver")
    assert driver["metadata"]["name"] == DRIVER
    assert driver["spec"]["attachRequired"] is False  # no Controller service
    (pv,) = objects("PersistentVolume")
    csi = pv["spec"]["csi"]
    assert csi["driver"] == DRIVER
    ref = volume_ref(csi["volumeHandle"], csi["volumeAttributes"])
    assert ref.relpath == "main/default/images"
    assert volume_ref(csi["volumeHandle"], {}) == ref  # the handle alone names it too
    (pvc,) = objects("PersistentVolumeClaim")
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    (pod,) = objects("Pod")
    claims = [v["persistentVolumeClaim"] for v in pod["spec"]["volumes"]]
    assert claims == [{"claimName": pvc["metadata"]["name"], "readOnly": True}]


def test_kustomization_builds_the_plugin() -> None:
    """``kubectl apply -k mount/kubernetes/`` applies the plugin's objects (not the example),
    as kustomize builds them (offline: ``kubectl kustomize`` needs no cluster)."""
    if shutil.which("kubectl") is None:
        pytest.skip("needs kubectl")
    p = subprocess.run(
        ["kubectl", "kustomize", str(DIR)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    built = [d for d in yaml.safe_load_all(p.stdout) if d is not None]
    names = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in built)
    want = [
        f"{d['kind']}/{d['metadata']['name']}" for name, d in load_all() if name != "example.yaml"
    ]
    assert names == sorted(want)
