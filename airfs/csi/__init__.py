"""The Kubernetes CSI node plugin (``airfs csi serve``): the Container Storage Interface's
Identity and Node services over gRPC, publishing ``/Volumes/<catalog>/<schema>/<volume>`` of
the node's airfs mount into pods by bind mounts.

Parts: :mod:`~airfs.csi.spec` (the vendored ``csi.proto``, compiled at first use),
:mod:`~airfs.csi.mounts` (the mount table, bind/unmount), :mod:`~airfs.csi.node` (what the Node
service does, without gRPC), :mod:`~airfs.csi.server` (the gRPC services over it),
:mod:`~airfs.csi.supervisor` (the node's mount as a child process), :mod:`~airfs.csi.serve`
(the process) and :mod:`~airfs.csi.cli` (the parser). Needs the ``csi`` extra.
"""
