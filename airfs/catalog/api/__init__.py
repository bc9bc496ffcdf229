"""The catalog's REST API: Unity Catalog's ``/api/2.1/unity-catalog/`` endpoints and the Files
API (``/api/2.0/fs/``) for volumes, served by ``airfs catalog serve`` over the catalog at the
origin (see the README, "REST API").

Modules: :mod:`.errors` (Unity Catalog's error shape), :mod:`.tokens` (bearer tokens, stored
hashed at the origin), :mod:`.context` (what a handler gets and returns), :mod:`.resources`
(catalogs, schemas, volumes, permissions), :mod:`.tables` (tables), :mod:`.files` (the Files
API), :mod:`.uploads` (multipart upload sessions and download URLs), :mod:`.server` (HTTP,
auth, TLS), :mod:`.cli` (``airfs catalog serve`` and ``airfs catalog token``).
"""
