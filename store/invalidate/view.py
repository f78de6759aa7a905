"""The invalidators as an operator sees them: their first place; they are `store.cache.invalidators`.

Each invalidator publishes its status in the caches, and the operator's
view reads it from there alone, so it lives beside the caches.
"""

from store.cache.invalidators import (
    ROLES,
    STATUS_TTL_S,
    decode_status,
    encode_status,
    invalidators,
    servers_of,
    status_key,
)

__all__ = [
    "ROLES",
    "STATUS_TTL_S",
    "decode_status",
    "encode_status",
    "invalidators",
    "servers_of",
    "status_key",
]
