"""The S3-compatible origin (AWS S3, SeaweedFS, MinIO, Ceph RGW, ...), over obstore's *sync* API.

obstore's calls release the GIL, so the core's worker threads run them in parallel. Layout in
the bucket (``s3://BUCKET/PREFIX``; the prefix is prepended to every key):

* a file ``a/b.bin`` is the object ``PREFIX/a/b.bin``; its version tag is the ETag (quotes
  included, as S3 sends it). Its mode, owner and mtime are kept in the object's user metadata
  (``x-amz-meta-airfs-mode``/``-uid``/``-gid``/``-mtime``, see :mod:`._meta`), written with
  the object itself by :meth:`S3Origin.put` (so it is never visible with other attributes)
  and changed by ``set_attrs`` (a metadata-replacing copy of the object onto itself,
  conditional on its ETag); objects written by other tools have ``default_mode`` (0o644
  unless configured), no owner and ``Last-Modified`` as mtime. Listings do not carry user
  metadata: the attributes of a listed object are known from this origin's own puts and heads
  (remembered per key, ETag and Last-Modified: the copy keeps the ETag) or asked for with a
  HEAD (in parallel), so a listing never shows a private object with the default mode;
* directories are key prefixes. ``mkdir`` writes a zero-byte *marker* object ``PREFIX/a/`` (the
  convention of the S3 console, Hadoop S3A, rclone, gcsfuse); a path is a directory if its
  marker exists or any key starts with ``path/``, so objects written by other tools
  (``a/b/c.parquet`` with no markers) appear as files in implied directories. A marker
  carries the same metadata where the server keeps a marker's metadata (AWS S3, MinIO; probed
  once; SeaweedFS does not); other directories have mode 0o755, no owner and the time the
  origin was opened as mtime.
  When a delete, rename or rmdir empties a directory, its marker is written so that the
  directory does not vanish under the user (``rm -r`` works). A directory and a file of the
  same name can coexist on S3; the directory shadows the file in listings.
* obstore cannot address a key that ends in ``/`` (its paths drop empty segments), so marker
  objects, recursive key listings and cheap one-key probes go through ``RawS3`` (``_raw``), a small
  SigV4-signed HTTP client using the same credentials. It needs credentials it can read: the
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` variables, a profile of
  the shared credentials file, or boto3 (instance roles, SSO, ...) when installed. Without
  them (obstore then finds credentials on its own) reads and file writes work, and ``mkdir``,
  ``rmdir`` of a marker and directory renames raise :class:`NotSupported`.

Writes: :meth:`S3Origin.put` sends files up to ``single_put_max`` (64 MiB) in one PUT and
larger ones as a multipart upload; both are atomic for readers (the object appears only when
the PUT or the CompleteMultipartUpload finishes). Conditional puts (``if_match``) use
``If-Match``/``If-None-Match: *`` where the server supports them (probed once, on the first
conditional put; SeaweedFS 4.48 does, as tested; AWS S3 and MinIO document it). For multipart
uploads, which obstore cannot make conditional, and on servers without conditional writes the
condition is checked with a HEAD just before the upload: a writer that sneaks in between the
HEAD and the end of the upload is overwritten (a documented race, as for any last-writer-wins
store).

Not atomic: renames are copy + delete (a file; a copy is limited to 5 GiB by AWS; the copy
keeps the metadata), a directory rename moves object by object. ``rename(replace=False)`` checks
the destination first (race documented). Symbolic links are not supported
(:class:`NotSupported`), nor are special files (``mknod``). ``link`` is an atomic
create-if-absent copy (:mod:`._link`). Names that are not valid keys for
obstore (control characters) fail with EINVAL. SeaweedFS turns ``\\`` in a key into ``/``.

Structure: :class:`S3Origin` (``_origin``: construction from a URL, capabilities, the Origin
protocol) holds its parts as fields, each with its own state and contract: ``client``
(``_core``: the stores, the signing client, keys, HEADs, probes, markers, the known attributes
of objects), ``reads`` (``_reads``), ``writes`` (``_writes``: PUTs, conditional writes,
multipart clean-up), ``tree`` (``_tree``: directories, renames), ``attributes`` (``_attrs``:
``set_attrs``), ``links`` (``_link``: create-if-absent copies). Below them: ``_meta`` (the
metadata keys), ``_raw`` (the SigV4 client), ``_credentials``, ``_errors`` (error translation),
``_config`` (tunables).
"""

from ._config import (
    DEFAULT_PART_SIZE as DEFAULT_PART_SIZE,
)
from ._config import (
    DEFAULT_PUT_CONCURRENCY as DEFAULT_PUT_CONCURRENCY,
)
from ._config import (
    DEFAULT_SINGLE_PUT_MAX as DEFAULT_SINGLE_PUT_MAX,
)
from ._config import (
    DEFAULT_STALL_TIMEOUT as DEFAULT_STALL_TIMEOUT,
)
from ._config import (
    DEFAULT_TIMEOUT as DEFAULT_TIMEOUT,
)
from ._config import (
    PROBE_PREFIX as PROBE_PREFIX,
)
from ._meta import DEFAULT_MODE as DEFAULT_MODE
from ._meta import MODE_ATTR as MODE_ATTR
from ._origin import S3Origin as S3Origin

__all__ = [
    "DEFAULT_MODE",
    "DEFAULT_PART_SIZE",
    "DEFAULT_PUT_CONCURRENCY",
    "DEFAULT_SINGLE_PUT_MAX",
    "DEFAULT_STALL_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "MODE_ATTR",
    "PROBE_PREFIX",
    "S3Origin",
]
