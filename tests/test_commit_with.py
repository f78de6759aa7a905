"""`Cursor.commit_with`: statements and their COMMIT in one request where the backend can, the
cursor then in a new transaction, on a backend that batches (MariaDB) and one that does not (SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from store import Store, StoreConfig
from store.engines import Cursor, ShardHandle
from store.exceptions import StoreError
from tests.conftest import sqlite_config


class _RefusedError(StoreError):
    """A refusal between statements: the transaction is rolled back."""


def _counts(h: ShardHandle, from_id: int) -> list[tuple[int, int]]:
    sql = f"SELECT n, version FROM {h.table('relation_counts')} WHERE relation = {h.backend.params(1)} "
    sql += f"AND from_id = {h.backend.params(1)}"
    return [(int(n), int(v)) for n, v in h.read(sql, ("commit_with", from_id), one=False)]


def _check(h: ShardHandle) -> None:
    table, four = h.table("relation_counts"), h.backend.params(4)
    insert = f"INSERT INTO {table} (relation, from_id, n, version) VALUES ({four})"
    one = h.backend.params(1)
    update = f"UPDATE {table} SET n = n + 1 WHERE relation = {one} AND from_id = {one}"
    h.transaction(lambda cur: cur.execute(f"DELETE FROM {table} WHERE relation = {one}", ("commit_with",)))

    # Committed with its statements; what follows is a transaction of its own, rolled back here.
    def refused(cur: Cursor) -> None:
        got = cur.commit_with([(insert, ("commit_with", 1, 5, 1)), (insert, ("commit_with", 2, 6, 1))])
        assert [rowcount for rowcount, _id in got] == [1, 1]
        cur.execute(update, ("commit_with", 1))
        raise _RefusedError("after the commit")

    with pytest.raises(_RefusedError):
        h.transaction(refused)
    assert _counts(h, 1) == [(5, 1)]
    assert _counts(h, 2) == [(6, 1)]

    # ... and committed by the transaction's end, when it ends well.
    def kept(cur: Cursor) -> int:
        got = cur.commit_with([(update, ("commit_with", 1))])
        cur.execute(update, ("commit_with", 2))
        return got[0][0]

    assert h.transaction(kept) == 1
    assert _counts(h, 1) == [(6, 1)]
    assert _counts(h, 2) == [(7, 1)]

    # Nothing after it: the transaction's own end sends nothing more, and a refusal rolls back nothing.
    def only(cur: Cursor) -> None:
        cur.commit_with([(update, ("commit_with", 1))])
        raise _RefusedError("nothing left to roll back")

    with pytest.raises(_RefusedError):
        h.transaction(only)
    assert _counts(h, 1) == [(7, 1)]
    assert h.transaction(lambda cur: cur.commit_with([(update, ("commit_with", 9))])) == [(0, 0)]


def _handle(store: Store, shard: int) -> ShardHandle:
    engines: Any = store.admin_context().engines
    return engines.shard(shard, store.shard_map.master(shard))  # type: ignore[no-any-return]


@pytest.mark.mariadb
def test_commit_with_on_mariadb(mariadb_ready: StoreConfig) -> None:
    with Store(mariadb_ready) as store:
        _check(_handle(store, 5))


def test_commit_with_on_sqlite(tmp_path: Path) -> None:
    config = StoreConfig.from_dict(sqlite_config(tmp_path))
    with Store(config) as store:
        _check(_handle(store, 2))
