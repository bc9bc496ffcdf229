"""Governed volumes: catalogs, schemas, volumes and grants with Unity Catalog's names, stored
at the origin and enforced by the daemon (see the README, "Governed volumes").

Modules: :mod:`.model` (objects, privileges, the pure :func:`~.model.allowed`),
:mod:`.commands` (the catalog commands, pure), :mod:`.store` (the document at the origin,
conditional updates, the daemon's TTL cache), :mod:`.guard` (the core's
:class:`~airfs.core.context.Guard`), :mod:`.service` (what the control socket asks),
:mod:`.cli` (``airfs catalog``), :mod:`.explain` (clear errors for the torch package). Only
the model is imported here, so that the CLI stays light.
"""

from .model import RESERVED as RESERVED
from .model import CatalogError as CatalogError
from .model import Decision as Decision
from .model import Metastore as Metastore
from .model import Privilege as Privilege
from .model import Who as Who
from .model import allowed as allowed
