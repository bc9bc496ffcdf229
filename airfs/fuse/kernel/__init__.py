"""airfs's own FUSE transport: the kernel protocol over /dev/fuse, no libfuse.

``proto`` (structs, opcodes), ``negotiate`` (INIT), ``session`` (the request loop over the
core), ``mount`` (mount(2) / fusermount3). :class:`KernelTransport` in
:mod:`airfs.fuse.transport` puts them together for the daemon.
"""
