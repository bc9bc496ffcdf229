"""The control socket: a Unix socket per mount speaking JSON lines (status, warm, flush,
prefetch). ``client`` is what the CLI and :mod:`airfs.data` use; ``server`` runs in the daemon."""
