"""Governed volumes: catalogs, schemas, volumes and grants with Unity Catalog's names, stored
at the origin and enforced by the daemon (see the README, "Governed volumes")."""

from .commands import apply as apply
from .guard import CatalogGuard as CatalogGuard
from .model import RESERVED as RESERVED
from .model import CatalogError as CatalogError
from .model import Decision as Decision
from .model import Metastore as Metastore
from .model import Privilege as Privilege
from .model import Who as Who
from .model import allowed as allowed
from .store import CATALOG_PATH as CATALOG_PATH
from .store import CatalogCache as CatalogCache
from .store import CatalogStore as CatalogStore
