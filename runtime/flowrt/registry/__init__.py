"""flowrt.registry: which replicas are up, where they listen, and how loaded they are.

A replica registers (role, replica, incarnation, address) and renews a heartbeat carrying its
load; a gateway's `Directory` turns what it hears into "up" and "down" events and drops a
replica whose heartbeat lapsed. Two stores carry the records: `embedded` (the supervisor's own
socket, one machine, the default) and `redis` (`--registry redis://...`, many machines). It
imports only flowrt.transport (the message structs).
"""

from flowrt.registry.directory import DEFAULT_HEARTBEAT_TTL, Directory, Record, load_score
from flowrt.registry.stores import RegistryError, open_client, open_source, parse_registry

__all__ = [
    "DEFAULT_HEARTBEAT_TTL",
    "Directory",
    "Record",
    "RegistryError",
    "load_score",
    "open_client",
    "open_source",
    "parse_registry",
]
