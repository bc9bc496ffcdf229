"""The ``airfs`` command line: the parser and dispatch (:mod:`.app`), ``airfs mount``
(:mod:`.mount`), the control commands (:mod:`.control`), the status text (:mod:`.status`),
value types and usage errors (:mod:`.options`) and the ``mount.fuse.airfs`` helper for
``/etc/fstab`` (:mod:`.fstab`). The console script is :func:`main`."""

from .app import main as main
