"""FUSE transports over the core: ``kernel`` (airfs's own, :mod:`airfs.fuse.kernel`) and
``pyfuse3`` (libfuse, :mod:`airfs.fuse.ops`); :mod:`airfs.fuse.transport` builds either."""

#: the transports ``--fuse`` accepts
TRANSPORTS = ("kernel", "pyfuse3")
#: the transport a mount uses unless ``--fuse`` says otherwise (the one place to change it)
DEFAULT_TRANSPORT = "kernel"
