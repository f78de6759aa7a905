"""Every error `store` raises on purpose, under one root.

The tree::

    StoreError
    ├── ConfigError            (also ValueError)  the config file or dict is wrong
    ├── IdError                (also ValueError)  an ID or ID field is out of range
    │   └── WrongTypeError                        an ID of another type than expected
    ├── UnknownTypeError       (also LookupError) a type name not in the config
    ├── UnknownRelationError   (also LookupError) a relation name not in the config
    ├── RoutingError           (also LookupError) a shard that no map range covers
    ├── StaleMapError                             this process's map, or a map write, is out of date
    │   └── ShardMovedError                       the host holds only a tombstone of the shard
    ├── DataError              (also ValueError)  an object that cannot be stored
    │   ├── NotSerializableError                  not plain JSON (set, NaN, datetime, ...)
    │   ├── ObjectTooLargeError                   larger than `limits.max_object_bytes`
    │   └── BadRecordError                        lines of an import that cannot be imported
    ├── LimitError             (also ValueError)  a page limit or offset out of range
    ├── CursorError            (also ValueError)  a page cursor that is not for this list
    ├── NotFound               (also LookupError) no live object with that ID
    ├── ConflictError                             the object changed since the version given
    ├── WriteTimeoutError      (also TimeoutError) a write could not land within write_timeout_s
    ├── DuplicateKeyError      (also ValueError)  a unique key another object holds
    ├── ShardFullError                            a shard table ran out of local ids
    ├── BackendError                              a database failed; `.orig` is the driver error
    │   ├── ConnectionLostError                   the connection broke (reads retry once)
    │   └── ShardNotInitializedError              the shard database or table is missing
    ├── MoveError                                 a shard move cannot start or go on
    ├── PromoteError                              promoting a slave was refused
    └── TicketError                               no ticket server could hand out an ID

Driver exceptions never escape the public API unwrapped: they become a
`BackendError` raised ``from`` the original, which stays on ``.orig``.

Messages quote what the caller passed through `brief`: short, and safe for
any value (an int of more than 4,300 digits cannot even be printed).
"""

from __future__ import annotations

import reprlib

__all__ = [
    "BackendError",
    "BadRecordError",
    "ConfigError",
    "ConflictError",
    "ConnectionLostError",
    "CursorError",
    "DataError",
    "DuplicateKeyError",
    "IdError",
    "LimitError",
    "MoveError",
    "NotFound",
    "NotSerializableError",
    "ObjectTooLargeError",
    "PromoteError",
    "RoutingError",
    "ShardFullError",
    "ShardMovedError",
    "ShardNotInitializedError",
    "StaleMapError",
    "StoreError",
    "TicketError",
    "UnknownRelationError",
    "UnknownTypeError",
    "WriteTimeoutError",
    "WrongTypeError",
    "brief",
]

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlong = 40
_BIG_INT_BITS = 128


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message: at most ``limit`` characters, and never an error itself.

    A huge int is described by its size (Python refuses to print more than
    4,300 digits), a long string or list is cut short, and an object whose
    ``repr`` fails is named by its type.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _BIG_INT_BITS:
        return f"an int of {value.bit_length()} bits"
    try:
        text = _REPR.repr(value)
    except Exception:  # a repr that raises, or ints too long to print inside a container
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class StoreError(Exception):
    """Root of every error raised by `store` on purpose."""


class ConfigError(StoreError, ValueError):
    """The configuration is invalid; the message names the key and the fix."""


class IdError(StoreError, ValueError):
    """An ID, or one of its fields, is malformed or out of range."""


class WrongTypeError(IdError):
    """An ID whose type bits name another type than the operation expects."""


class UnknownTypeError(StoreError, LookupError):
    """A type name or type id that the configuration does not define."""


class UnknownRelationError(StoreError, LookupError):
    """A relation name that the configuration does not define."""


class RoutingError(StoreError, LookupError):
    """No range of the shard map covers the shard an ID points to."""


class StaleMapError(StoreError):
    """A shard map that is out of date: a map write based on an older version, or routing by one.

    Reload the map and redo the call (a `Store` does this by itself for reads
    and writes routed by an old map).
    """


class ShardMovedError(StaleMapError):
    """The host holds only a tombstone of the shard: it moved away, this process routed by an old map.

    A `Store` reloads its map and retries on the new host by itself; this
    reaches the caller only if no newer map appears in time. ``moved_to`` and
    ``map_version`` say where the shard went and in which map version, when
    the tombstone says so.
    """

    def __init__(
        self,
        message: str,
        *,
        shard: int,
        host: str,
        moved_to: str | None = None,
        map_version: int | None = None,
        orig: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.shard = shard
        self.host = host
        self.moved_to = moved_to
        self.map_version = map_version
        self.orig = orig


class DataError(StoreError, ValueError):
    """Object data that cannot be stored; nothing was written."""


class NotSerializableError(DataError):
    """Object data that is not plain JSON (dict with str keys, list, str, int, float, bool, None)."""


class ObjectTooLargeError(DataError):
    """Serialised object data larger than the configured limit."""


class BadRecordError(DataError):
    """Lines of an import (`store.exchange`) that cannot be imported; nothing of their batch was written.

    ``lines`` holds (line number, what is wrong) for every bad line of the batch.
    """

    def __init__(self, lines: list[tuple[int, str]], *, shown: int = 20) -> None:
        self.lines = list(lines)
        listed = "; ".join(f"line {n}: {why}" for n, why in self.lines[:shown])
        more = f"; and {len(self.lines) - shown} more" if len(self.lines) > shown else ""
        super().__init__(f"{len(self.lines)} bad line(s), nothing of their batch written: {listed}{more}")


class LimitError(StoreError, ValueError):
    """A page limit above ``limits.max_page`` (or below 1), or a negative offset."""


class CursorError(StoreError, ValueError):
    """A page cursor that is malformed or was made for another list or direction."""


class NotFound(StoreError, LookupError):  # noqa: N818 - the name the API promises
    """No live (not deleted) object has this ID."""


class ConflictError(StoreError):
    """``update(..., if_version=V)`` found the object at another version: it changed since V.

    Nothing was written. ``.expected`` is V, ``.actual`` the version now:
    read the object again (`Store.get_with_version`) and decide.
    """

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class WriteTimeoutError(StoreError, TimeoutError):
    """A write could not land within ``write_timeout_s``: nothing of it was written.

    An update of an object's unique values that kept meeting other writers
    changing those values, or a create abandoned again and again before it
    went live. Plain updates never raise `ConflictError` for contention:
    they retry until they land or this is raised.
    """


class DuplicateKeyError(StoreError, ValueError):
    """A unique key (config ``unique:``) that another live object holds; nothing was written.

    ``.key`` is the unique key's name, ``.value`` the value asked for and
    ``.owner`` the ID of the object that holds it (or is being created with
    it; 0 for a row an earlier version's create left, which repair fixes).
    ``.index`` is the item's index in a `Store.create_many` call's ``items``
    (None for `create` and `update`).
    """

    def __init__(self, message: str, *, key: str, value: str, owner: int, index: int | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.value = value
        self.owner = owner
        self.index = index


class ShardFullError(StoreError):
    """A shard table has used every local id its ID layout can carry."""


class BackendError(StoreError):
    """A database call failed. The driver's exception is kept on ``.orig``.

    ``retryable`` is True when the server rolled the whole transaction back
    (a deadlock, a lock wait timeout): running it again is safe.
    ``duplicate`` is True when a primary or unique key refused the row.
    """

    def __init__(self, message: str, *, orig: BaseException | None = None) -> None:
        super().__init__(message)
        self.orig = orig
        self.retryable = False
        self.duplicate = False


class ConnectionLostError(BackendError):
    """The server could not be reached or the connection broke mid-call.

    A read that finds its pooled connection dead is retried once on a new
    connection; a read that cannot connect is not (one ``connect_timeout_s`` per
    failed call). A write is never retried (it may or may not have committed),
    so the caller decides.
    """


class ShardNotInitializedError(BackendError):
    """The shard database or one of its tables does not exist on its host."""


class MoveError(StoreError):
    """A move cannot start or go on; the message says what to do (often --resume or --abort)."""


class PromoteError(StoreError):
    """Promotion refused; the message says why and what to do."""


class TicketError(StoreError):
    """No ticket server could hand out an ID, or the servers disagree on their setup."""
