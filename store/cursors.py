"""Page cursors: opaque strings that say which list, which direction and where to go on.

A cursor is the key ``(sequence, to_id)`` of the last entry a page returned,
with the list (relation, from_id) and the direction it belongs to, so that
a cursor from another list or direction is refused (`CursorError`) rather
than silently paging the wrong list. A page of a sequence range (``since``,
``until``) binds its range into its cursor the same way: the cursor goes on
within that range only, and is refused with any other range (or none).

Unsigned (no ``cursor_secret`` in the config), a cursor is a position in a
list, not a permission: a forged one names at most another position in the
same list (its key must fit the columns, or it is refused); a cursor of
another store with the same relation and from_id is such a position.

Signed (``cursor_secret``, ``cursor_secret_env`` or ``cursor_secret_file``), a
cursor ends in ``.`` and an HMAC-SHA256 of the rest under the secret, cut to
`SIGNATURE_BYTES`: a cursor this store did not make, or one changed by a
single character, is refused (`CursorError`) before anything in it is used,
so a client can hand back only positions a page gave it. A store without a
secret reads a signed cursor as it reads an unsigned one (it checks nothing).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import orjson

from store.exceptions import CursorError, brief

__all__ = ["DEFAULT_MAX_CURSOR_BYTES", "SIGNATURE_BYTES", "decode_cursor", "encode_cursor"]

#: The longest cursor `decode_cursor` reads unless told otherwise (``limits.max_cursor_bytes``).
DEFAULT_MAX_CURSOR_BYTES = 1024
_SEQ_MIN, _SEQ_MAX = -(1 << 63), (1 << 63) - 1
#: Bytes of the HMAC-SHA256 a signed cursor carries (128 bits: 22 characters of base64).
SIGNATURE_BYTES = 16


def _signature(key: bytes, body: str) -> str:
    """The signature of a cursor's ``body`` under ``key``, in URL-safe base64 without padding."""
    mac = hmac.new(key, body.encode("ascii"), hashlib.sha256).digest()[:SIGNATURE_BYTES]
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def encode_cursor(
    relation: str,
    from_id: int,
    newest_first: bool,
    sequence: int,
    to_id: int,
    *,
    since: int | None = None,
    until: int | None = None,
    key: bytes | None = None,
) -> str:
    """An opaque cursor: the list, direction and sequence range it is for, and the key to go on after.

    With ``key`` (the config's ``cursor_secret``) the cursor is signed.
    """
    if since is None and until is None:
        raw = orjson.dumps([1, relation, from_id, int(newest_first), sequence, to_id])
    else:
        raw = orjson.dumps([2, relation, from_id, int(newest_first), sequence, to_id, since, until])
    body = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return body if key is None else f"{body}.{_signature(key, body)}"


def decode_cursor(
    cursor: str,
    relation: str,
    from_id: int,
    newest_first: bool,
    *,
    since: int | None = None,
    until: int | None = None,
    max_bytes: int = DEFAULT_MAX_CURSOR_BYTES,
    key: bytes | None = None,
) -> tuple[int, int]:
    """(sequence, to_id) from a cursor made for this same list, direction and sequence range.

    A cursor longer than ``max_bytes`` (``limits.max_cursor_bytes``) is refused
    before it is decoded; one that decodes to anything but a key (a sequence
    and a to_id that fit a signed BIGINT) is refused as not a cursor. With
    ``key``, a cursor whose signature is missing or wrong is refused before
    it is decoded.
    """
    if type(cursor) is not str:
        raise CursorError(
            f"cursor must be a str (a page's next_cursor), got {type(cursor).__name__} {brief(cursor)}"
        )
    if len(cursor) > max_bytes:
        raise CursorError(
            f"cursor is {len(cursor)} characters, over limits.max_cursor_bytes ({max_bytes}): "
            "pass the next_cursor of a page, unchanged"
        )
    body, dot, signature = cursor.partition(".")
    if key is not None and not (
        dot and signature.isascii() and hmac.compare_digest(signature, _signature(key, body))
    ):
        raise CursorError(
            f"cursor {brief(cursor)} is not signed by this store (cursor_secret): it was forged or "
            "altered, or made by a store with another secret or none; pass a page's next_cursor unchanged"
        )
    try:
        if not body.isascii():
            raise ValueError("not base64")
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        fields = orjson.loads(raw)
    except (ValueError, TypeError) as exc:
        raise CursorError(_not_a_cursor(cursor)) from exc
    if not isinstance(fields, list) or not fields:
        raise CursorError(_not_a_cursor(cursor))
    made_for: tuple[object, object] = (None, None)
    if fields[0] == 1 and len(fields) == 6:
        _v, rel, frm, newest, sequence, to_id = fields
    elif fields[0] == 2 and len(fields) == 8:
        _v, rel, frm, newest, sequence, to_id, low, high = fields
        made_for = (low, high)
    else:
        raise CursorError(_not_a_cursor(cursor))
    if (
        type(rel) is not str
        or type(frm) is not int
        or type(newest) is not int
        or type(sequence) is not int
        or type(to_id) is not int
        or newest not in (0, 1)
        or not _SEQ_MIN <= sequence <= _SEQ_MAX
        or not 0 <= to_id <= _SEQ_MAX
        or (
            made_for != (None, None)
            and not all(v is None or (type(v) is int and _SEQ_MIN <= v <= _SEQ_MAX) for v in made_for)
        )
    ):
        raise CursorError(_not_a_cursor(cursor))
    if (rel, frm, bool(newest)) != (relation, from_id, newest_first):
        raise CursorError(
            f"cursor was made for {_name(rel)} of {frm} ({'newest' if newest else 'oldest'} first), "
            f"not for {_name(relation)} of {brief(from_id)} ({'newest' if newest_first else 'oldest'} first)"
        )
    if made_for != (since, until):
        raise CursorError(
            f"cursor was made for {_span(*made_for)}, not for {_span(since, until)}: "
            "page on with the since/until of the page that returned it"
        )
    return sequence, to_id


def _not_a_cursor(cursor: str) -> str:
    """The refusal of a string that is no cursor (made only when one is refused: brief() costs)."""
    return f"cursor {brief(cursor)} is not a cursor that page() returned; pass a page's next_cursor unchanged"


def _name(relation: object) -> str:
    """A relation name for a message: as it is if it is a short printable str, else quoted and cut."""
    if type(relation) is str and len(relation) <= 64 and relation.isprintable():
        return relation
    return brief(relation)


def _span(since: object, until: object) -> str:
    """A sequence range in words, for errors."""
    if since is None and until is None:
        return "the whole list (no since/until)"
    return f"sequences since={since} until={until}"
