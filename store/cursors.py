"""Page cursors: opaque strings that say which list, which direction and where to go on.

A cursor is the key ``(sequence, to_id)`` of the last entry a page returned,
with the list (relation, from_id) and the direction it belongs to, so that
a cursor from another list or direction is refused (`CursorError`) rather
than silently paging the wrong list.
"""

from __future__ import annotations

import base64

import orjson

from store.exceptions import CursorError

__all__ = ["decode_cursor", "encode_cursor"]


def encode_cursor(relation: str, from_id: int, newest_first: bool, sequence: int, to_id: int) -> str:
    """An opaque cursor: the list it belongs to and the (sequence, to_id) to continue after."""
    raw = orjson.dumps([1, relation, from_id, int(newest_first), sequence, to_id])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str, relation: str, from_id: int, newest_first: bool) -> tuple[int, int]:
    """(sequence, to_id) from a cursor made for this same list and direction."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        version, rel, frm, newest, sequence, to_id = orjson.loads(raw)
    except (ValueError, TypeError) as exc:
        raise CursorError(f"cursor {cursor!r} is not a cursor that page() returned") from exc
    if version != 1 or not all(type(v) is int for v in (frm, newest, sequence, to_id)):
        raise CursorError(f"cursor {cursor!r} is not a cursor that page() returned")
    if (rel, frm, bool(newest)) != (relation, from_id, newest_first):
        raise CursorError(
            f"cursor was made for {rel} of {frm} ({'newest' if newest else 'oldest'} first), "
            f"not for {relation} of {from_id} ({'newest' if newest_first else 'oldest'} first)"
        )
    return sequence, to_id
