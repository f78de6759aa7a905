"""Signed page cursors: ``cursor_secret`` / ``cursor_secret_env`` / ``cursor_secret_file``.

A store with a secret refuses every cursor it did not make (forged, altered
by one character, unsigned, or signed with another secret) with
`CursorError`, on every call that takes or makes a cursor; a store without
one reads signed and unsigned cursors alike. SQLite only: signing happens
above the backends.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from store import ConfigError, CursorError, Store, StoreConfig
from store.cursors import decode_cursor, encode_cursor
from tests.conftest import sqlite_config

BHP = "board_has_pins"
SECRET = "a-cursor-secret-of-some-length-0123"


def _flip(text: str, at: int) -> str:
    """``text`` with the character at ``at`` changed (still URL-safe base64)."""
    c = text[at]
    return text[:at] + ("A" if c != "A" else "B") + text[at + 1 :]


def test_a_signed_cursor_round_trips_and_any_change_is_refused() -> None:
    key = SECRET.encode()
    cursor = encode_cursor(BHP, 7, False, 123, 456, key=key)
    body, _dot, signature = cursor.partition(".")
    assert len(signature) == 22  # 16 bytes of HMAC-SHA256
    assert decode_cursor(cursor, BHP, 7, False, key=key) == (123, 456)
    assert decode_cursor(cursor, BHP, 7, False) == (123, 456)  # no secret: nothing checked
    forged_body = base64.urlsafe_b64encode(orjson.dumps([1, BHP, 7, 0, 999, 456])).rstrip(b"=").decode()
    refused = [
        body,  # unsigned
        f"{forged_body}.{signature}",  # another position, the old signature
        *(_flip(cursor, i) for i in range(0, len(cursor), 5) if cursor[i] != "."),
        cursor + "A",
        cursor[:-1],
        f"{body}.",
        encode_cursor(BHP, 7, False, 123, 456, key=b"another-secret-0123456789"),
        cursor.replace(".", "é"),
    ]
    for bad in refused:
        with pytest.raises(CursorError, match="not signed by this store") as info:
            decode_cursor(bad, BHP, 7, False, key=key)
        assert isinstance(info.value, ValueError)  # old `except ValueError` still catches it
        assert SECRET not in str(info.value)
    with pytest.raises(CursorError, match="made for board_has_pins of 7"):
        decode_cursor(cursor, BHP, 8, False, key=key)  # signed, but for another list


@pytest.fixture
def signed(tmp_path: Path) -> Iterator[Store]:
    raw = sqlite_config(tmp_path)
    raw["cursor_secret"] = SECRET
    raw["cache"] = {"memory": True}
    with Store.from_config(raw) as s:
        yield s


def test_every_call_signs_and_checks(signed: Store, tmp_path: Path) -> None:
    s = signed
    board = s.create("board", {})
    pins = [s.create("pin", {"k": k}, near=board) for k in range(5)]
    for p in pins:
        s.link(BHP, board, p)
    firsts = [
        s.page(BHP, board, limit=2).next_cursor,
        s.page_objects(BHP, board, limit=2).next_cursor,
        s.pages_many(BHP, [board], limit=2)[board].next_cursor,
        s.pages_objects_many(BHP, [board], limit=2)[board].next_cursor,
        s.board_pins(board, limit=2).next_cursor,
        s.board_pins_many([board], limit=2)[board].next_cursor,
    ]
    for cursor in firsts:
        assert cursor is not None
        assert "." in cursor
        assert s.page(BHP, board, limit=2, cursor=cursor).ids == pins[2:4]
        assert s.page_objects(BHP, board, limit=5, cursor=cursor).ids == pins[2:]
        assert s.board_pins(board, limit=5, cursor=cursor).ids == pins[2:]
        for bad in (cursor.partition(".")[0], _flip(cursor, 3), _flip(cursor, len(cursor) - 2)):
            with pytest.raises(CursorError, match="not signed by this store"):
                s.page(BHP, board, cursor=bad)
            with pytest.raises(CursorError, match="not signed by this store"):
                s.page_objects(BHP, board, cursor=bad)
            with pytest.raises(CursorError, match="not signed by this store"):
                s.board_pins(board, cursor=bad)
    # A store without the secret reads the signed cursors too (nothing to check).
    raw = sqlite_config(tmp_path)
    with Store.from_config(raw) as plain:
        cursor = firsts[0]
        assert cursor is not None
        assert plain.page(BHP, board, limit=2, cursor=cursor).ids == pins[2:4]
        unsigned = plain.page(BHP, board, limit=2).next_cursor
    with pytest.raises(CursorError):
        s.page(BHP, board, cursor=unsigned)


def _config(tmp_path: Path, **keys: Any) -> StoreConfig:
    raw = sqlite_config(tmp_path)
    raw.update(keys)
    return StoreConfig.from_dict(raw, base_dir=tmp_path, environ={"CURSOR_KEY": SECRET, "SHORT": "abc"})


def test_the_secret_comes_from_one_of_three_keys(tmp_path: Path) -> None:
    (tmp_path / "cursor.key").write_text(SECRET + "\n")
    assert _config(tmp_path).cursor_secret is None
    for keys in (
        {"cursor_secret": SECRET},
        {"cursor_secret_env": "CURSOR_KEY"},
        {"cursor_secret_file": "cursor.key"},  # relative to the config's folder; the newline dropped
        {"cursor_secret_file": str(tmp_path / "cursor.key")},
    ):
        config = _config(tmp_path, **keys)
        assert config.cursor_secret == SECRET.encode()
        assert SECRET not in repr(config)
    failures: list[tuple[dict[str, Any], str]] = [
        (
            {"cursor_secret": SECRET, "cursor_secret_env": "CURSOR_KEY"},
            "keep exactly one of cursor_secret, cursor_secret_env .* and cursor_secret_file",
        ),
        ({"cursor_secret_env": "UNSET_VAR"}, r"cursor_secret_env names \$UNSET_VAR, which is not set"),
        ({"cursor_secret_env": "not a name"}, "cursor_secret_env must name an environment variable"),
        ({"cursor_secret_file": "missing.key"}, "cursor_secret_file: cannot read"),
        ({"cursor_secret_env": "SHORT"}, "cursor_secret_env gives a secret of 3 bytes; .* at least 16"),
        ({"cursor_secret": "short"}, "cursor_secret gives a secret of 5 bytes"),
        ({"cursor_secret": 12345678901234567890}, "cursor_secret must be a string"),
        ({"cursor_secret_file": ""}, "cursor_secret_file must be a non-empty string"),
    ]
    for keys, message in failures:
        with pytest.raises(ConfigError, match=message) as info:
            _config(tmp_path, **keys)
        assert "abc" not in str(info.value)
