"""Clear errors for the torch package: when an airfs mount refuses a path (EACCES), ask its
daemon (with this process's own credentials) whether the catalog is why, and say which
privilege on which volume (or table, for a table's files) is missing."""

from __future__ import annotations

import errno
import os

from airfs.control import client


def explain(exc: PermissionError, path: str, access: str) -> PermissionError:
    """``exc`` (raised for ``path``) restated with the volume and privilege the catalog of
    the mount holding ``path`` lacks for ``access`` (``"read"`` or ``"write"``); ``exc``
    itself when the path is not on an airfs mount or the catalog is not the reason."""
    path = os.path.abspath(path)
    mp = client.find_mount(path)
    if mp is None:
        return exc
    rel = os.path.relpath(path, mp)
    rel = "" if rel == "." else rel
    try:
        out = client.request(
            mp, "catalog", command="why", args={"path": rel, "access": access}, timeout=10
        )
    except (client.ControlError, OSError, TimeoutError):
        return exc
    if not isinstance(out, dict) or not out.get("missing") or out.get("errno") != errno.EACCES:
        return exc
    volume = out.get("volume")
    missing = str(out["missing"])
    hint = f" (see airfs catalog show-grants {volume})" if volume else ""
    if " on table " in missing:  # a table's files: its grants are what to look at
        hint = f" (see airfs catalog show-grants --type TABLE {missing.split(' on table ')[1]})"
    # the path is in the message (given as filename too, str() would name it twice)
    return PermissionError(errno.EACCES, f"{path}: permission denied: needs {out['missing']}{hint}")
