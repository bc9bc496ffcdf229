"""The daemon: what one mount runs.

* :mod:`.build` — the one place that builds the object graph (origin → read path → write-back
  → core), used by the process and by the tests;
* :mod:`.config` — :class:`~.config.MountConfig` and the checks before a mount;
* :mod:`.process` — the process (``python -m airfs.daemon.process``): origin, build, FUSE
  transport, control socket, periodic tasks, signals;
* :mod:`.control` — :class:`~.control.Daemon`, the facade the control socket talks to;
* :mod:`.heap`, :mod:`.memdebug` — the process's memory (malloc arenas, trims, reports).
"""
