"""store: objects and ordered relations sharded over many MariaDB hosts.

The public API is what ``__all__`` lists; every other module is an
implementation detail. Start with `Store.from_config`.
"""

from store.config import CacheConfig, RelationSpec, StoreConfig, TypeSpec
from store.exceptions import (
    BackendError,
    BadRecordError,
    ConfigError,
    ConflictError,
    ConnectionLostError,
    CursorError,
    DataError,
    DuplicateKeyError,
    IdError,
    LimitError,
    MoveError,
    NotFound,
    NotSerializableError,
    ObjectTooLargeError,
    PromoteError,
    RoutingError,
    ShardFullError,
    ShardMovedError,
    ShardNotInitializedError,
    StaleMapError,
    StoreError,
    TicketError,
    UnknownRelationError,
    UnknownTypeError,
    WriteTimeoutError,
    WrongTypeError,
)
from store.ids import (
    InstagramId,
    PinterestId,
    decode_instagram,
    decode_pinterest,
    encode_instagram,
    encode_pinterest,
    instagram_datetime,
)
from store.objects import Versioned
from store.relations.repository import Page
from store.scan import Scan
from store.serde import JsonSerde, Serde
from store.shardmap import ShardMap, ShardRange
from store.store import AdminContext, Location, Store

__version__ = "0.1.0"

__all__ = [
    "AdminContext",
    "BackendError",
    "BadRecordError",
    "CacheConfig",
    "ConfigError",
    "ConflictError",
    "ConnectionLostError",
    "CursorError",
    "DataError",
    "DuplicateKeyError",
    "IdError",
    "InstagramId",
    "JsonSerde",
    "LimitError",
    "Location",
    "MoveError",
    "NotFound",
    "NotSerializableError",
    "ObjectTooLargeError",
    "Page",
    "PinterestId",
    "PromoteError",
    "RelationSpec",
    "RoutingError",
    "Scan",
    "Serde",
    "ShardFullError",
    "ShardMap",
    "ShardMovedError",
    "ShardNotInitializedError",
    "ShardRange",
    "StaleMapError",
    "Store",
    "StoreConfig",
    "StoreError",
    "TicketError",
    "TypeSpec",
    "UnknownRelationError",
    "UnknownTypeError",
    "Versioned",
    "WriteTimeoutError",
    "WrongTypeError",
    "__version__",
    "decode_instagram",
    "decode_pinterest",
    "encode_instagram",
    "encode_pinterest",
    "instagram_datetime",
]
