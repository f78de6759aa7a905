"""Heartbeats' first place: they are `store.cache.heartbeat`, beside the caches that hold them.

The daemon (`store.invalidate.daemon`) publishes them; store processes read
them through `store.cache.heartbeat.HeartbeatTrust`.
"""

from store.cache.heartbeat import (
    HEARTBEAT_EVERY_S,
    HEARTBEAT_TTL_S,
    Heartbeat,
    HeartbeatTrust,
    Peeker,
    decode_heartbeat,
    encode_heartbeat,
    heartbeat_key,
)

__all__ = [
    "HEARTBEAT_EVERY_S",
    "HEARTBEAT_TTL_S",
    "Heartbeat",
    "HeartbeatTrust",
    "Peeker",
    "decode_heartbeat",
    "encode_heartbeat",
    "heartbeat_key",
]
