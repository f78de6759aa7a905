"""An update whose transaction is run again after a deadlock applies its function once per change.

InnoDB rolls a deadlock victim's whole transaction back (error 1213), and the store runs it
again (`store.engines.ShardHandle.transaction`). The victim here is the update's COMMIT, made
to fail once with that error on a real MariaDB, after the function ran under the row lock:
- if nobody wrote the object meanwhile, the second run finds it at the version the first run
  read, and writes what the function made then (the function is not called again);
- if another writer's update committed meanwhile, the function is called again, on the object
  as that writer left it, and both changes land.
"""

from __future__ import annotations

import threading
from typing import Any

import pymysql
import pytest

from store import Store, StoreConfig, transactions
from store.transactions import _Txn
from tests.conftest import mariadb_config


def _deadlock_once(monkeypatch: pytest.MonkeyPatch, before: Any = None) -> list[int]:
    """Make the next COMMIT fail as a deadlock victim's statement does (calling ``before`` first);
    the error codes still to raise (empty once it was)."""
    real = _Txn.commit
    pending = [1213]

    def commit(self: _Txn) -> None:
        if pending:
            if before is not None:
                before()
            raise pymysql.err.OperationalError(
                pending.pop(), "Deadlock found when trying to get lock; try restarting transaction"
            )
        real(self)

    monkeypatch.setattr(_Txn, "commit", commit)
    return pending


def test_a_deadlocked_update_writes_what_its_function_made_without_calling_it_again(
    mariadb_ready: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.from_config(mariadb_config()) as store:
        oid = store.create("board", {"n": 0})
        seen: list[int] = []

        def bump(old: dict[str, Any]) -> dict[str, Any]:
            seen.append(old["n"])
            return {"n": old["n"] + 1}

        pending = _deadlock_once(monkeypatch)
        assert store.update(oid, bump) == {"n": 1}
        assert pending == [], "the deadlock was injected"
        assert seen == [0]
        monkeypatch.undo()
        assert store.get_with_version(oid) == ({"n": 1}, 2)


def test_a_deadlocked_update_sees_a_write_made_meanwhile_and_both_land(
    mariadb_ready: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.from_config(mariadb_config()) as store, Store.from_config(mariadb_config()) as other:
        oid = store.create("board", {"n": 0, "tags": []})
        seen: list[int] = []

        def bump(old: dict[str, Any]) -> dict[str, Any]:
            seen.append(old["n"])
            return {**old, "n": old["n"] + 1}

        # The other writer waits for the row lock the update holds; once the deadlock has
        # rolled the update back it commits, before the update runs again (its backoff waits).
        writer = threading.Thread(target=lambda: other.update(oid, {"tags": ["other"]}))
        pending = _deadlock_once(monkeypatch, before=writer.start)
        real_sleep = transactions.green.sleep
        monkeypatch.setattr(transactions.green, "sleep", lambda s: (writer.join(10), real_sleep(0)))
        result = store.update(oid, bump)
        assert pending == []
        assert not writer.is_alive()
        assert seen == [0, 0]  # (the other write changed the object: the function runs on it again)
        assert result == {"n": 1, "tags": ["other"]}
        monkeypatch.undo()
        assert store.get_with_version(oid) == ({"n": 1, "tags": ["other"]}, 3)
