"""Lists of IDs as calls give them: checked, each once, bounded by ``limits.max_ids``.

Every call that takes many IDs or pairs (`Store.get_many`, `Store.has_links`,
`Store.link_many`, ...) turns its argument into a list here first, before
any I/O: a str, bytes or lone int is refused, and so is anything that is not
an iterable of IDs, with a message that says what to pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from store.exceptions import IdError, LimitError, brief

__all__ = ["id_list", "pair_list"]


def id_list(values: Iterable[int], what: str, *, unique: bool = True, limit: int | None = None) -> list[int]:
    """``values`` as a list (each once if ``unique``, in order); `IdError` unless an iterable of IDs.

    A str, bytes or a lone int is refused here, and so is an unhashable item
    where ``unique``; the IDs themselves are checked by routing. More than
    ``limit`` values (``limits.max_ids``) is a `LimitError`, raised before any
    query and without reading an iterator further than ``limit + 1`` items.
    A list passed with ``unique=False`` comes back as it is (no copy).
    """
    if isinstance(values, str | bytes | bytearray | int) or not isinstance(values, Iterable):
        raise IdError(f"{what} must be an iterable of IDs (a list), got {type(values).__name__}")
    if type(values) is list:
        out: list[Any] = values
    else:
        out = list(values if limit is None else islice(values, limit + 1))
    if limit is not None and len(out) > limit:
        held = f"{len(out)} IDs" if out is values else f"more than {limit} IDs"
        raise LimitError(f"{what} holds {held}, over limits.max_ids ({limit}); split the call")
    if not unique:
        return out
    try:
        return list(dict.fromkeys(out))
    except TypeError:
        raise IdError(_unhashable(out, what)) from None


def pair_list(pairs: Iterable[tuple[int, int]], *, limit: int | None = None) -> list[tuple[int, int]]:
    """``pairs`` as a list of (from_id, to_id), each once; `IdError` for anything else.

    More than ``limit`` pairs (``limits.max_ids``) is a `LimitError`, as in `id_list`.
    """
    if isinstance(pairs, str | bytes | bytearray | int) or not isinstance(pairs, Iterable):
        raise IdError(f"pairs must be an iterable of (from_id, to_id), got {type(pairs).__name__}")
    given = pairs if type(pairs) is list or limit is None else list(islice(pairs, limit + 1))
    if limit is not None and isinstance(given, list) and len(given) > limit:
        held = f"{len(given)} pairs" if given is pairs else f"more than {limit} pairs"
        raise LimitError(f"pairs holds {held}, over limits.max_ids ({limit}); split the call")
    if type(given) is list and set(map(type, given)) <= {tuple} and set(map(len, given)) <= {2}:
        try:  # (a list of 2-tuples, the usual call: each pair kept once without a loop)
            return list(dict.fromkeys(given))
        except TypeError:
            pass  # (an unhashable ID: the loop below names it)
    out: dict[tuple[int, int], None] = {}
    for pair in given:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise IdError(f"pairs must hold (from_id, to_id) tuples, got {brief(pair)}")
        try:
            out[(pair[0], pair[1])] = None
        except TypeError:
            raise IdError(_unhashable(list(pair), "a pair")) from None
    return list(out)


def _unhashable(values: list[Any], what: str) -> str:
    """The message for a list of IDs holding something unhashable (a list, a dict)."""
    for v in values:
        try:
            hash(v)
        except TypeError:
            return f"{what} must hold int IDs, got {type(v).__name__} {brief(v)}"
    return f"{what} must hold int IDs"
