"""What one side of a pair write, and one list fill, cost MariaDB and the client, statement by statement.

Each variant runs ``CALLS`` times on one connection, one request per call,
for ``ROUNDS`` rounds (the variants take turns). It reports the server's CPU
per call (every MariaDB process's user + system time, from /proc: run it on
a quiet machine) and the client's (`time.process_time`). The side variants
write a new pair each call into a list of their own; the fill variants read
a list of 4,000 entries and lists of 60.

    .venv/bin/python scripts/bench_side.py
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pymysql
from pymysql.constants import CLIENT

from store.tools.mix.servers_cpu import server_cpu_s

CALLS = 2000
ROUNDS = 3
DB = "store_bench_side"
F = 144115325514809473  # a board's ID

SCHEMA = [
    f"DROP DATABASE IF EXISTS {DB}",
    f"CREATE DATABASE {DB}",
    f"USE {DB}",
    "CREATE TABLE rel (from_id BIGINT UNSIGNED NOT NULL, to_id BIGINT UNSIGNED NOT NULL, "
    "sequence BIGINT NOT NULL, PRIMARY KEY (from_id, to_id), KEY s (from_id, sequence, to_id))",
    "CREATE TABLE rel2 LIKE rel",
    "CREATE TABLE relation_counts (relation VARCHAR(64) NOT NULL, from_id BIGINT UNSIGNED NOT NULL, "
    "n BIGINT NOT NULL, version BIGINT NOT NULL DEFAULT 1, PRIMARY KEY (relation, from_id))",
    "CREATE TABLE boards (local_id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, "
    "data MEDIUMTEXT NOT NULL, active TINYINT(1) NOT NULL DEFAULT 1)",
    "CREATE TABLE cache_log (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, "
    "at_ms BIGINT NOT NULL, entries MEDIUMTEXT NOT NULL)",
    "INSERT INTO boards (local_id, data) VALUES (129, '{}')",
    "CREATE TRIGGER rel2_count AFTER INSERT ON rel2 FOR EACH ROW "
    "INSERT INTO relation_counts (relation, from_id, n, version) VALUES ('t', NEW.from_id, 1, 1) "
    "ON DUPLICATE KEY UPDATE n = n + 1, version = (@side_version := version + 1)",
]

# One side as the store sends it on MariaDB (see store.backends.statements), and its parts.
GUARDED = (
    f"INSERT INTO {DB}.rel (from_id, to_id, sequence) SELECT {F} AS anon_1, {{t}} AS anon_2, "
    f"{{t}} AS anon_3 FROM {DB}.boards WHERE {DB}.boards.local_id = 129 AND {DB}.boards.active = 1 "
    f"LOCK IN SHARE MODE ON DUPLICATE KEY UPDATE from_id = {DB}.rel.from_id"
)
COUNT = (
    f"INSERT INTO {DB}.relation_counts (relation, from_id, n, version) SELECT 'r' AS anon_1, "
    f"{F} AS anon_2, 1 AS anon_3, last_insert_id(1) AS v FROM DUAL WHERE row_count() = 1 "
    f"ON DUPLICATE KEY UPDATE n = ({DB}.relation_counts.n + VALUES(n)), "
    f"version = last_insert_id({DB}.relation_counts.version + 1)"
)
LOG = (
    f"INSERT INTO {DB}.cache_log (at_ms, entries) SELECT 1795552864428, "
    f"CONCAT('l:board_has_pins:{F}@', LAST_INSERT_ID()) FROM DUAL WHERE ROW_COUNT() > 0"
)
SHORT = (
    f"INSERT INTO rel (from_id, to_id, sequence) SELECT {F}, {{t}}, {{t}} FROM boards "
    "WHERE local_id = 129 AND active = 1 LOCK IN SHARE MODE ON DUPLICATE KEY UPDATE from_id = from_id"
)
SHORT_COUNT = (
    f"INSERT INTO relation_counts (relation, from_id, n, version) SELECT 'r', {F}, 1, last_insert_id(1) "
    "FROM DUAL WHERE row_count() = 1 ON DUPLICATE KEY UPDATE n = n + 1, version = last_insert_id(version + 1)"
)
TRIGGERED = SHORT.replace("INTO rel ", "INTO rel2 ")
SIDES = {
    "floor: autocommit INSERT IGNORE": f"INSERT IGNORE INTO rel VALUES ({F}, {{t}}, {{t}})",
    "store: BEGIN, guarded insert, count, log row, COMMIT": f"BEGIN; {GUARDED}; {COUNT}; {LOG}; COMMIT",
    "the same without the log row": f"BEGIN; {GUARDED}; {COUNT}; COMMIT",
    "the same, SQL without aliases or schema names": f"BEGIN; {SHORT}; {SHORT_COUNT}; COMMIT",
    "guarded insert and count, two autocommit statements": f"{GUARDED}; {COUNT}",
    "count kept by a trigger, autocommit, no log row": TRIGGERED,
    "the trigger, plus the log row, in a transaction": (
        f"BEGIN; {TRIGGERED}; {LOG.replace('LAST_INSERT_ID()', '@side_version')}; COMMIT"
    ),
}

_PACKED = (
    "UNHEX(CONCAT(LPAD(HEX(CAST(sequence AS UNSIGNED) ^ 9223372036854775808), 16, '0'), "
    "LPAD(HEX(to_id), 16, '0')))"
)
_KEPT = "(SELECT CONCAT(n, ':', version) FROM relation_counts WHERE relation = 'r' AND from_id = {f})"
_TOP = "(SELECT sequence, to_id{m} FROM rel WHERE from_id = {f} ORDER BY sequence, to_id LIMIT 102) AS q"
FILLS = {
    "floor: 50 ids": "SELECT to_id FROM rel WHERE from_id = {f} ORDER BY sequence, to_id LIMIT 50",
    "store: count, version, 102 entries packed": (
        f"SELECT {_KEPT}, GROUP_CONCAT(q.m ORDER BY q.sequence, q.to_id SEPARATOR '') "
        f"FROM {_TOP.replace('{m}', ', ' + _PACKED + ' AS m')}"
    ),
    "entries as decimal text": (
        f"SELECT {_KEPT}, GROUP_CONCAT(q.sequence, ' ', q.to_id ORDER BY q.sequence, q.to_id SEPARATOR ' ') "
        f"FROM {_TOP.replace('{m}', '')}"
    ),
    "no ORDER BY inside GROUP_CONCAT": (
        f"SELECT {_KEPT}, GROUP_CONCAT(q.m SEPARATOR '') FROM {_TOP.replace('{m}', ', ' + _PACKED + ' AS m')}"
    ),
    "two result sets: the count row, 102 rows": (
        f"{_KEPT[1:-1]}; "
        "SELECT sequence, to_id FROM rel WHERE from_id = {f} ORDER BY sequence, to_id LIMIT 102"
    ),
}


def run(cur: pymysql.cursors.Cursor, sql: str) -> None:
    """One request, every result read."""
    cur.execute(sql)
    cur.fetchall()
    while cur.nextset():
        cur.fetchall()


def mariadb_s() -> float:
    """CPU seconds of the MariaDB processes so far."""
    cpu = server_cpu_s(("mariadbd", "mysqld"))
    return sum(cpu.values())


def measure(
    cur: pymysql.cursors.Cursor,
    variants: dict[str, str],
    args: Callable[[int], dict[str, int]],
    reset: str | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """Per variant, each round's (server us, client us) per call; ``args(i)`` formats call i."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, sql in variants.items():
            if reset:
                run(cur, reset)
            server, client = mariadb_s(), time.process_time()
            for i in range(CALLS):
                run(cur, sql.format(**args(i)))
            out[name].append(
                ((mariadb_s() - server) / CALLS * 1e6, (time.process_time() - client) / CALLS * 1e6)
            )
    return out


def show(title: str, results: dict[str, list[tuple[float, float]]]) -> None:
    """One line per variant: the rounds' range of server and client us per call."""
    print(f"\n{title}: us per call, server / client, range over {ROUNDS} rounds")
    for name, rounds in results.items():
        s, c = [r[0] for r in rounds], [r[1] for r in rounds]
        print(f"  {name:55s} {min(s):5.0f}-{max(s):<5.0f} / {min(c):4.0f}-{max(c):<4.0f}")


def main() -> None:
    conn = pymysql.connect(
        host="127.0.0.1", port=3306, user="root", client_flag=CLIENT.MULTI_STATEMENTS, autocommit=True
    )
    cur = conn.cursor()
    try:
        for sql in SCHEMA:
            run(cur, sql)
        next_to = iter(range(10, 10**9))
        sides = measure(cur, SIDES, lambda i: {"t": next(next_to)}, reset="DELETE FROM rel; DELETE FROM rel2")
        show("one side of a new pair", sides)
        rng = random.Random(7)
        for b in range(20):
            rows = ", ".join(
                f"({F + b}, {144185625539510865 + rng.randrange(1 << 30)}, {1795552864413582 + i})"
                for i in range(4000 if b == 0 else 60)
            )
            run(cur, f"INSERT IGNORE INTO rel VALUES {rows}")
            run(cur, f"REPLACE INTO relation_counts VALUES ('r', {F + b}, 4000, 7)")
        run(cur, "SET SESSION group_concat_max_len = 1048576")
        fills = measure(cur, FILLS, lambda i: {"f": F + i % 20})
        show("a list fill's read (one list of 4,000, 19 of 60)", fills)
    finally:
        run(cur, f"DROP DATABASE IF EXISTS {DB}")
        conn.close()


if __name__ == "__main__":
    main()
