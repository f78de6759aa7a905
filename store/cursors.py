"""Page cursors: opaque strings that say which list, which direction and where to go on.

A cursor is the key ``(sequence, to_id)`` of the last entry a page returned,
with the list (relation, from_id) and the direction it belongs to, so that
a cursor from another list or direction is refused (`CursorError`) rather
than silently paging the wrong list. A page of a sequence range (``since``,
``until``) binds its range into its cursor the same way: the cursor goes on
within that range only, and is refused with any other range (or none).
"""

from __future__ import annotations

import base64

import orjson

from store.exceptions import CursorError

__all__ = ["decode_cursor", "encode_cursor"]


def encode_cursor(
    relation: str,
    from_id: int,
    newest_first: bool,
    sequence: int,
    to_id: int,
    *,
    since: int | None = None,
    until: int | None = None,
) -> str:
    """An opaque cursor: the list, direction and sequence range it is for, and the key to go on after."""
    if since is None and until is None:
        raw = orjson.dumps([1, relation, from_id, int(newest_first), sequence, to_id])
    else:
        raw = orjson.dumps([2, relation, from_id, int(newest_first), sequence, to_id, since, until])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(
    cursor: str,
    relation: str,
    from_id: int,
    newest_first: bool,
    *,
    since: int | None = None,
    until: int | None = None,
) -> tuple[int, int]:
    """(sequence, to_id) from a cursor made for this same list, direction and sequence range."""
    bad = CursorError(f"cursor {cursor!r} is not a cursor that page() returned")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        fields = orjson.loads(raw)
    except (ValueError, TypeError) as exc:
        raise bad from exc
    if not isinstance(fields, list) or not fields:
        raise bad
    made_for: tuple[object, object] = (None, None)
    if fields[0] == 1 and len(fields) == 6:
        _v, rel, frm, newest, sequence, to_id = fields
    elif fields[0] == 2 and len(fields) == 8:
        _v, rel, frm, newest, sequence, to_id, low, high = fields
        made_for = (low, high)
    else:
        raise bad
    if not all(type(v) is int for v in (frm, newest, sequence, to_id)) or not all(
        v is None or type(v) is int for v in made_for
    ):
        raise bad
    if (rel, frm, bool(newest)) != (relation, from_id, newest_first):
        raise CursorError(
            f"cursor was made for {rel} of {frm} ({'newest' if newest else 'oldest'} first), "
            f"not for {relation} of {from_id} ({'newest' if newest_first else 'oldest'} first)"
        )
    if made_for != (since, until):
        raise CursorError(
            f"cursor was made for {_span(*made_for)}, not for {_span(since, until)}: "
            "page on with the since/until of the page that returned it"
        )
    return sequence, to_id


def _span(since: object, until: object) -> str:
    """A sequence range in words, for errors."""
    if since is None and until is None:
        return "the whole list (no since/until)"
    return f"sequences since={since} until={until}"
