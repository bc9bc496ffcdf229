"""``link`` on S3: an atomic create-if-absent copy (what delta-rs and other committers that
publish with ``link(tmp, final)`` need).

How, in order of preference (each decided once per origin):

1. a server-side ``CopyObject`` with ``If-None-Match: *``: the server refuses (412) when the
   destination exists, atomically. SeaweedFS 4.48 honours it (probed: a second copy onto the
   same key is refused); servers that ignore or refuse the header fall through. Objects up to
   5 GiB (the CopyObject limit);
2. a conditional PUT (``If-None-Match: *``) of the source's bytes read back, with the source's
   metadata: objects up to ``single_put_max``, on servers with conditional writes;
3. otherwise a HEAD of the destination, then a copy: a writer that creates the destination in
   between is overwritten (the race documented for emulated conditional puts).

Either way the new name is an independent object with the source's bytes, mode, owner and
mtime (``nlink`` 1 for both).
"""

from __future__ import annotations

import contextlib
import errno
import threading
import uuid

import obstore

from ..base import Conflict, Entry, Exists, Kind, NotSupported, PermissionDenied
from ._config import BULK_MIN, PROBE_PREFIX
from ._core import S3Client
from ._errors import translate
from ._meta import Meta
from ._reads import Reads
from ._tree import Tree
from ._writes import Writes

#: CopyObject copies at most this much (AWS)
COPY_MAX = 5 << 30


class Links:
    """``link`` of the S3 origin. Its state: whether the server honours ``If-None-Match``
    on CopyObject (probed once, on the first link that can use it)."""

    def __init__(self, client: S3Client, reads: Reads, writes: Writes, tree: Tree) -> None:
        self.c = client
        self.reads = reads
        self.writes = writes
        self.tree = tree
        self._conditional_copy: bool | None = None
        self._probe_lock = threading.Lock()

    def link(self, src: str, dst: str) -> Entry:
        """Copy file ``src`` to ``dst`` only if ``dst`` does not exist, atomically where the
        server allows (see the module docstring). Raises :class:`Exists` when ``dst`` exists
        (on any node), :class:`NotFound` without ``src`` or ``dst``'s parent,
        :class:`PermissionDenied` (EPERM) for a directory ``src``."""
        where = self.c.where(dst)
        s = self.reads.stat(src)
        if s.kind is Kind.DIR:
            raise PermissionDenied(
                f"{self.c.where(src)}: is a directory (directories cannot be linked)", errno.EPERM
            )
        if not dst:
            raise Exists(f"{where}: exists")
        self.tree.parent_must_be_dir(dst)
        if self.c.is_dir(dst):
            raise Exists(f"{where}: exists")
        try:
            if s.size <= COPY_MAX and self.c.raw is not None and self.conditional_copies():
                headers = {"x-amz-copy-source": self.c.copy_source(src), "if-none-match": "*"}
                self.c.raw.request(
                    "PUT", self.c.key(dst), where, headers=headers, slow=s.size > BULK_MIN
                )
            elif s.size <= self.writes.single_put_max and self.writes.conditional_writes():
                data = self.reads.read_range(src, 0, s.size, s.version)
                attrs = Meta(s.mode, s.uid, s.gid, s.mtime_ns)  # what the source shows
                self.writes.put_object(dst, data, len(data), attrs, "create")
            else:
                if self.c.head(dst) is not None:
                    raise Exists(f"{where}: exists")
                if s.size > COPY_MAX:
                    raise NotSupported(f"{where}: linking an object over 5 GiB (a copy)")
                obstore.copy(self.c.bulk, src, dst)
        except Exception as exc:
            err = translate(exc, where)
            if isinstance(err, Conflict):
                raise Exists(f"{where}: exists") from None
            raise err from None
        return self.reads.stat(dst)

    def conditional_copies(self) -> bool:
        """Whether the server honours ``If-None-Match: *`` on CopyObject (probed once, with
        two hidden objects at the origin's root; needs the signing client)."""
        if self._conditional_copy is not None:
            return self._conditional_copy
        if self.c.raw is None:
            return False
        with self._probe_lock:
            if self._conditional_copy is None:
                self._conditional_copy = self._probe_conditional_copy()
        return self._conditional_copy

    def _probe_conditional_copy(self) -> bool:
        """Copy a hidden object twice onto a new key with ``If-None-Match: *``: the second
        copy must be refused. Transient errors propagate; anything else means "not
        supported"."""
        assert self.c.raw is not None
        a = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        b = a + "-copy"
        headers = {"x-amz-copy-source": self.c.copy_source(a), "if-none-match": "*"}
        try:
            obstore.put(self.c.store, a, b"probe", use_multipart=False)
            self.c.raw.request("PUT", self.c.key(b), self.c.where(b), headers=headers)
            try:
                self.c.raw.request("PUT", self.c.key(b), self.c.where(b), headers=headers)
            except Conflict:
                return True
            return False  # If-None-Match ignored on copies
        except Exception as exc:
            err = translate(exc, self.c.where(a))
            if err.transient:
                raise err from None
            return False
        finally:
            for key in (a, b):
                with contextlib.suppress(Exception):
                    obstore.delete(self.c.store, key)
