"""A write statement sent on its own is run again after a deadlock, as a transaction is.

`ShardHandle.write` serves the store's one-statement writes (unique keys'
claims, takes and releases; activations; removals; a delete's mark). On the
test MariaDB a heavier transaction makes one of them the deadlock's victim:
the statement is rolled back whole by the server, runs again, and lands
once the other commits.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pymysql
import pytest

from store import Store, StoreConfig
from tests.conftest import NAMESPACE, mariadb_config, root_sql


def _deadlocks() -> int:
    return int(root_sql("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")[0][1])


def test_a_write_chosen_as_a_deadlocks_victim_runs_again(mariadb_ready: StoreConfig) -> None:
    db = f"{NAMESPACE}_db00000"
    root_sql(f"CREATE TABLE IF NOT EXISTS {db}.retry_scratch (id INT PRIMARY KEY, v INT NOT NULL)")
    root_sql(f"CREATE TABLE IF NOT EXISTS {db}.retry_weight (id INT PRIMARY KEY)")
    root_sql(f"DELETE FROM {db}.retry_scratch")
    root_sql(f"DELETE FROM {db}.retry_weight")
    root_sql(f"INSERT INTO {db}.retry_scratch VALUES (1, 0), (2, 0)")
    other = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=False)
    try:
        with Store(StoreConfig.from_dict(mariadb_config())) as store:
            h = store.admin_context().engines.shard(0, store.shard_map.master(0))
            before = _deadlocks()
            with other.cursor() as cur:
                # The other transaction weighs more (200 rows written): InnoDB rolls back the lighter.
                cur.execute(
                    f"INSERT INTO {db}.retry_weight VALUES " + ", ".join(f"({i})" for i in range(200))
                )
                cur.execute(f"UPDATE {db}.retry_scratch SET v = v + 1 WHERE id = 2")
            done: list[int] = []
            errors: list[BaseException] = []

            def write() -> None:
                try:
                    done.append(h.write(f"UPDATE {db}.retry_scratch SET v = v + 10 WHERE id IN (1, 2)", ()))
                except BaseException as exc:
                    errors.append(exc)

            writer = threading.Thread(target=write)
            writer.start()
            time.sleep(0.5)  # the write holds row 1 and waits for row 2
            with other.cursor() as cur:
                cur.execute(f"UPDATE {db}.retry_scratch SET v = v + 1 WHERE id = 1")  # the cycle
            other.commit()
            writer.join(30)
            assert errors == [], errors
            assert done == [2]
            assert _deadlocks() > before, "no deadlock happened: the test proved nothing"
            rows = root_sql(f"SELECT id, v FROM {db}.retry_scratch ORDER BY id")
            assert rows == [(1, 11), (2, 11)], "the write landed once, after the other transaction"
    finally:
        other.close()
        root_sql(f"DROP TABLE IF EXISTS {db}.retry_scratch")
        root_sql(f"DROP TABLE IF EXISTS {db}.retry_weight")


def test_a_transaction_that_loses_six_deadlocks_in_a_row_still_lands_once(mariadb_ready: StoreConfig) -> None:
    """Each attempt of a transaction meets a fresh cycle with a heavier one (which InnoDB keeps):
    six lost attempts in a row, as a hot key on a loaded host makes, and the seventh commits. Its
    effect is there once."""
    db = f"{NAMESPACE}_db00000"
    root_sql(f"CREATE TABLE IF NOT EXISTS {db}.retry_chain (id INT PRIMARY KEY, v INT NOT NULL)")
    root_sql(f"CREATE TABLE IF NOT EXISTS {db}.retry_chain_weight (id INT PRIMARY KEY)")
    root_sql(f"DELETE FROM {db}.retry_chain")
    root_sql(f"INSERT INTO {db}.retry_chain VALUES (1, 0), (2, 0)")
    losses = 6
    attempts: list[int] = []
    ready = threading.Event()  # the heavier transaction holds row 2: the attempt may start
    holding = threading.Event()  # the attempt holds row 1
    other = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=False)
    try:
        with Store(StoreConfig.from_dict(mariadb_config())) as store:
            h = store.admin_context().engines.shard(0, store.shard_map.master(0))

            def body(cur: Any) -> int:
                attempts.append(len(attempts) + 1)
                if len(attempts) <= losses:
                    assert ready.wait(30)
                    ready.clear()
                cur.execute(f"UPDATE {db}.retry_chain SET v = v + 10 WHERE id = 1", ())
                holding.set()
                cur.execute(f"UPDATE {db}.retry_chain SET v = v + 10 WHERE id = 2", ())
                return len(attempts)

            done: list[int] = []
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    done.append(h.transaction(body))
                except BaseException as exc:
                    errors.append(exc)

            writer = threading.Thread(target=run)
            writer.start()
            before = _deadlocks()
            for _ in range(losses):
                with other.cursor() as cur:
                    cur.execute(f"DELETE FROM {db}.retry_chain_weight")
                    cur.execute(
                        f"INSERT INTO {db}.retry_chain_weight VALUES "
                        + ", ".join(f"({i})" for i in range(200))
                    )
                    cur.execute(f"UPDATE {db}.retry_chain SET v = v + 1 WHERE id = 2")
                ready.set()
                deadline = time.monotonic() + 30
                while not holding.wait(0.1) and writer.is_alive() and time.monotonic() < deadline:
                    pass
                assert holding.is_set(), f"the attempt never came: {errors or 'it hung'}"
                holding.clear()
                time.sleep(0.2)  # the attempt now waits for row 2
                with other.cursor() as cur:
                    cur.execute(f"UPDATE {db}.retry_chain SET v = v + 1 WHERE id = 1")  # the cycle
                other.commit()
            writer.join(30)
            assert errors == [], errors
            assert _deadlocks() - before == losses, "each attempt but the last was to lose a deadlock"
            assert done == [losses + 1]
            rows = root_sql(f"SELECT id, v FROM {db}.retry_chain ORDER BY id")
            assert rows == [(1, losses + 10), (2, losses + 10)], "the transaction landed once, last"
    finally:
        other.close()
        root_sql(f"DROP TABLE IF EXISTS {db}.retry_chain")
        root_sql(f"DROP TABLE IF EXISTS {db}.retry_chain_weight")


def test_other_errors_are_raised_at_once(mariadb_ready: StoreConfig) -> None:
    from store import BackendError

    with Store(StoreConfig.from_dict(mariadb_config())) as store:
        h = store.admin_context().engines.shard(0, store.shard_map.master(0))
        with pytest.raises(BackendError) as err:
            h.write(f"UPDATE {NAMESPACE}_db00000.no_such_table SET v = 1", ())
        assert not err.value.retryable
        assert "no_such_table" in str(err.value)
