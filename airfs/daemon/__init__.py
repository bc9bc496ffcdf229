"""The daemon: what one mount runs.

* :mod:`.build` — the one place that builds the object graph (origin → read path → write-back
  → core), used by the process and by the tests;
* :mod:`.config` — :class:`~.config.MountConfig` and the checks before a mount;
* :mod:`.process` — the process (``python -m airfs.daemon.process``): origin, build, FUSE
  transport, control socket, periodic tasks, signals;
* :mod:`.origins` — what a mount opens before it serves: its origin and its read path;
* :mod:`.holder`, :mod:`.takeover` — a restartable mount's holder process and a daemon's
  take-over of the kernel's connection;
* :mod:`.control` — :class:`~.control.Daemon`, the facade the control socket talks to;
* :mod:`.heap`, :mod:`.memdebug` — the process's memory (malloc arenas, trims, reports).
"""
