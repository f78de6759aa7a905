"""MariaDB / MySQL admin SQL: what `store init` and a move run besides the dialect's statements.

The Instagram ID counter and its trigger (made by `store init`, put back by a
move on a table it renamed), the triggers of a shard's tables, the tombstone a
moved shard leaves on its old host (and reading one back from its error), and
a consistent dump of shard databases and its load, through MariaDB's
command-line clients; and what `store promote` asks of a slave (how far it is
behind what it received, stopping it) and of a dead master's connect error.
"""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy.engine import URL

from store.backends.inventory import shard_number
from store.exceptions import BackendError
from store.naming import DEFAULT_NAMES, TOMBSTONE_TABLE, Names, parse_tombstone, tombstone_message
from store.tls import mysql_tls

__all__ = [
    "STASH_SUFFIX",
    "TOMBSTONE_ERRNO",
    "UNREACHABLE_ERRNOS",
    "dump_databases",
    "id_trigger",
    "leave_tombstones",
    "load_dump",
    "parse_tombstone",
    "not_replicating",
    "slave_lag",
    "slave_status",
    "unapplied",
    "stop_slaves",
    "table_triggers",
    "tombstone_statements",
    "unreachable",
]

#: The error number every read of a tombstone raises (a user SIGNAL; MariaDB's own numbers stay below).
TOMBSTONE_ERRNO = 9451


# -- Instagram IDs: a counter row and a trigger per object table -----------------------------
#
# The shard's counter, in units of (ms since the epoch) * 1024 +
# sequence, kept in a one-row table (MariaDB's SETVAL takes only a literal,
# so a sequence cannot jump to the clock inside a trigger). Every insert's
# trigger moves the row under its row lock, so the shard's inserts take turns
# for the moment of their commit, and the counter is shared by every table of
# the shard: no two objects of a shard, of any types, share an ID. A burst of
# more than 1,024 in one millisecond borrows the next; a clock that steps back
# leaves the ms field running ahead until it catches up. A row in a table also
# travels with the shard when it moves. Tests may pin the clock: @store_clock_ms.
_ID_COUNTER = """\
CREATE TABLE IF NOT EXISTS `{db}`.`id_counter` (
  `one` TINYINT NOT NULL PRIMARY KEY,
  `v` BIGINT NOT NULL
) ENGINE=InnoDB"""
_ID_COUNTER_ROW = "INSERT IGNORE INTO `{db}`.`id_counter` (`one`, `v`) VALUES (1, 0)"

# The time is read when the row is made (SYSDATE, not the statement's NOW).
_IG_TRIGGER = """\
CREATE TRIGGER IF NOT EXISTS `{db}`.`{table}_next_id` BEFORE INSERT ON `{db}`.`{on}` FOR EACH ROW
BEGIN
  DECLARE units BIGINT;
  DECLARE nv BIGINT;
  IF NEW.id = 0 THEN
    SET units = COALESCE(@store_clock_ms, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)) - {epoch};
    SET units = units * 1024;
    IF units < 0 THEN
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'clock before the Instagram ID epoch';
    END IF;
    UPDATE `{db}`.`id_counter` SET `v` = GREATEST(`v` + 1, units) WHERE `one` = 1;
    SELECT c.`v` INTO nv FROM `{db}`.`id_counter` c WHERE c.`one` = 1;
    IF (nv >> 10) >= 1099511627776 THEN
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'Instagram ID space of shard {shard} exhausted (2**40 ms)';
    END IF;
    SET NEW.id = ((nv >> 10) << 23) | ({shard} << 10) | (nv & 1023);
  END IF;
END"""


def id_trigger(shard: int, table: str, epoch_ms: int, *, on: str | None = None, db: str | None = None) -> str:
    """``CREATE TRIGGER IF NOT EXISTS`` of the Instagram ID trigger of ``table`` in shard ``shard``.

    The trigger is named after ``table`` (``pins_next_id``); ``on`` names the
    table it is made on when that is not ``table`` itself (a move puts it back
    on a table under its `STASH_SUFFIX` name, then renames the table). ``db``:
    the shard's database, where it is not ``db00042`` (a namespace's).
    """
    return _IG_TRIGGER.format(
        db=db or DEFAULT_NAMES.database_name(shard), table=table, on=on or table, shard=shard, epoch=epoch_ms
    )


# -- moving tables that carry triggers -------------------------------------------------------
#
# MariaDB refuses to rename a table with triggers into another database
# (error 1435, "Trigger in wrong schema"), yet renames it within its own
# database, triggers and all. So a move fences such a table by renaming it to
# ``<table>__moving`` in its own database (still under the fence's lock: from
# then on a write finds no table, as after an archive rename), and only then
# drops its triggers and renames it into the archive, from another session
# (a renamed table leaves the lock). A table that has lost its trigger is never
# reachable under its own name; an abort puts the trigger back on the stashed
# name before the rename that makes it live again.

#: What a fenced table with triggers is called in its own database until it reaches the archive.
STASH_SUFFIX = "__moving"


def table_triggers(cur: Any, databases: Sequence[str]) -> dict[tuple[str, str], list[str]]:
    """(database, table) -> the names of its triggers, for each table of ``databases`` that has any."""
    if not databases:
        return {}
    cur.execute(
        "SELECT event_object_schema, event_object_table, trigger_name FROM information_schema.triggers "
        "WHERE event_object_schema IN (" + ", ".join(["%s"] * len(databases)) + ") ORDER BY 1, 2, 3",
        list(databases),
    )
    out: dict[tuple[str, str], list[str]] = {}
    for db, table, name in cur.fetchall():
        out.setdefault((str(db), str(table)), []).append(str(name))
    return out


# -- tombstones: what a moved shard leaves on its old host -------------------------------------
#
# The moved tables are renamed into the archive database; in their place
# stand views of the same names and columns whose every read calls a function
# that raises TOMBSTONE_ERRNO, naming the new host and map version. A view
# cannot be written to (MariaDB answers 1471 / 1288), so every statement the
# store sends to a tombstone fails: the fence holds whether or not a table of
# that name is ever created again, and `CREATE TABLE IF NOT EXISTS` (an init
# run by an old config) finds the name taken. Live shards keep plain tables:
# no cost on the request path.

_TOMBSTONE_FUNCTION = "store_moved"
_TOMBSTONE_MARKER = """\
CREATE TABLE IF NOT EXISTS `{db}`.`{table}` (
  `shard` INT NOT NULL PRIMARY KEY,
  `moved_to` VARCHAR(255) NOT NULL,
  `map_version` BIGINT NOT NULL,
  `moved_at` TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

_TOMBSTONE_FUNCTION_SQL = """\
CREATE OR REPLACE FUNCTION `{db}`.`{fn}`() RETURNS BIGINT NOT DETERMINISTIC NO SQL
BEGIN
  SIGNAL SQLSTATE '45000' SET MYSQL_ERRNO = {errno}, MESSAGE_TEXT = '{message}';
  RETURN 0;
END"""


def tombstone_statements(
    shard: int,
    moved_to: str,
    map_version: int,
    tables: dict[str, list[str]],
    *,
    names: Names = DEFAULT_NAMES,
) -> list[str]:
    """Statements that leave a tombstone of ``shard`` (idempotent), in the namespace of ``names``.

    ``tables`` maps each moved table to its columns, in order. Host names
    are config keys (checked by the config) and are quoted for SQL here.
    """
    db = names.database_name(shard)
    fn = f"`{db}`.`{_TOMBSTONE_FUNCTION}`()"
    quoted = moved_to.replace("\\", "\\\\").replace("'", "''")
    message = tombstone_message(shard, moved_to, map_version)
    out = [
        _TOMBSTONE_MARKER.format(db=db, table=TOMBSTONE_TABLE),
        f"REPLACE INTO `{db}`.`{TOMBSTONE_TABLE}` (shard, moved_to, map_version) "
        f"VALUES ({shard}, '{quoted}', {map_version})",
        _TOMBSTONE_FUNCTION_SQL.format(
            db=db, fn=_TOMBSTONE_FUNCTION, errno=TOMBSTONE_ERRNO, message=message.replace("'", "''")
        ),
    ]
    for table, columns in sorted(tables.items()):
        listed = ", ".join(f"`{c}`" for c in columns)
        values = ", ".join(fn for _c in columns)
        # TEMPTABLE: the view is computed before any WHERE applies, so a
        # primary-key read of a row that "is not there" raises too.
        out.append(
            f"CREATE OR REPLACE ALGORITHM=TEMPTABLE SQL SECURITY INVOKER VIEW `{db}`.`{table}` "
            f"({listed}) AS SELECT {values}"
        )
    return out


def leave_tombstones(
    cur: Any, shards: Iterable[int], moved_to: str, map_version: int, *, names: Names = DEFAULT_NAMES
) -> int:
    """Leave a tombstone of each of ``shards`` whose tables were moved into the archive; how many.

    The views take the names and columns of the archived tables. Runs off the
    binlog (the renames were too), so replicas of this host never see half a
    switch. Idempotent: a resumed move runs it again.
    """
    wanted = sorted(set(shards))
    if not wanted:
        return 0
    archives = [names.archive(names.database_name(s)) for s in wanted]
    cur.execute(
        "SELECT table_schema, table_name, column_name FROM information_schema.columns "
        "WHERE table_schema IN (" + ", ".join(["%s"] * len(archives)) + ") "
        "ORDER BY table_schema, table_name, ordinal_position",
        archives,
    )
    columns: dict[int, dict[str, list[str]]] = {}
    for db, table, column in cur.fetchall():
        shard = shard_number(str(db), names.archive_database_prefix, 5)
        assert shard is not None
        columns.setdefault(shard, {}).setdefault(str(table), []).append(str(column))
    cur.execute("SET SESSION sql_log_bin = 0")
    try:
        for shard in wanted:
            tables = columns.get(shard)
            if not tables:
                continue  # nothing was archived: nothing there to fence
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{names.database_name(shard)}`")
            for stmt in tombstone_statements(shard, moved_to, map_version, tables, names=names):
                cur.execute(stmt)
    finally:
        cur.execute("SET SESSION sql_log_bin = 1")
    return len(columns)


def _client(url: URL) -> tuple[list[str], dict[str, str]]:
    """Arguments and environment for MariaDB's command-line clients (the password not on argv).

    The URL's TLS settings become ``--ssl``, ``--ssl-ca``, ``--ssl-cert``,
    ``--ssl-key`` and ``--ssl-verify-server-cert`` (chain and name: these
    clients refuse a server without TLS only with it), or ``--skip-ssl``.
    """
    args = [f"-h{url.host or '127.0.0.1'}", f"-P{url.port or 3306}", f"-u{url.username or 'root'}"]
    tls = mysql_tls(url)
    if tls.disabled:
        args.append("--skip-ssl")
    elif tls.required:
        args.append("--ssl")
        files = (("ssl-ca", tls.ca), ("ssl-cert", tls.cert), ("ssl-key", tls.key))
        args += [f"--{flag}={path}" for flag, path in files if path is not None]
        if tls.verify_identity:
            args.append("--ssl-verify-server-cert")
    return args, {**os.environ, "MYSQL_PWD": url.password or ""}


#: How long `dump_databases` waits for mariadb-dump to print its position (its snapshot begun).
DUMP_BEGIN_TIMEOUT_S = 10.0
#: The lines (comments: ``--master-data=2``) in which mariadb-dump prints its position: the GTID
#: position, and the binlog file and offset, which it prints before the tables (10.11 "defers" the
#: GTID position to the end of the dump). Whole lines: a value in the dump cannot hold a line break.
_GTID_LINE = re.compile(rb"^-- SET GLOBAL gtid_slave_pos\s*=\s*'([^']*)';$", re.MULTILINE)
_BEGUN = re.compile(
    rb"^-- (?:CHANGE MASTER TO MASTER_LOG_FILE='[^']*', MASTER_LOG_POS=\d+|SET GLOBAL gtid_slave_pos\b.*);$",
    re.MULTILINE,
)


def dump_databases(
    url: URL,
    databases: Sequence[str],
    *,
    begun: Callable[[], object] | None = None,
    begin_timeout_s: float = DUMP_BEGIN_TIMEOUT_S,
) -> tuple[bytes, str]:
    """A consistent dump of ``databases`` (``mariadb-dump --single-transaction``) and the GTID
    position mariadb-dump printed for it; `BackendError` if the dump fails or the server has no binlog.

    mariadb-dump starts its snapshot, reads the snapshot's position, prints it (``--master-data=2``:
    a comment, ``-- CHANGE MASTER TO MASTER_LOG_FILE=..., MASTER_LOG_POS=...``) and only then
    dumps the tables; 10.11 prints the GTID position (``--gtid``) at the end. ``begun`` is called
    as soon as the first of those lines has arrived, before the rest is read: by then the
    snapshot has begun. `BackendError` if that takes longer than ``begin_timeout_s`` (the dump is
    killed). Whatever fails, no mariadb-dump is left running.

    The printed position can be wrong: mariadb-dump reads it from ``Binlog_snapshot_file`` and
    ``_position``, which MariaDB keeps in globals of the server that any session's ``SHOW
    STATUS`` writes, so it can be handed another session's position. A move takes its own
    (`store.admin.move.mariadb`).
    """
    args, env = _client(url)
    with subprocess.Popen(
        ["mariadb-dump", *args, "--single-transaction", "--gtid", "--master-data=2",
         "--skip-lock-tables", "--triggers", "--skip-routines", "--skip-events", "--databases", *databases],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:  # fmt: skip
        try:
            head, ended = _read_until(proc, _BEGUN, time.monotonic() + begin_timeout_s)
            printed = _BEGUN.search(head) is not None
            if not (ended or printed):
                raise BackendError(f"mariadb-dump printed no position within {begin_timeout_s:.0f} s")
            if begun is not None and printed:
                begun()
            rest, err = proc.communicate()
        finally:
            if proc.poll() is None:  # an error above, or an interrupt
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        raise BackendError(f"mariadb-dump failed: {err.decode(errors='replace').strip()[:500]}")
    dump = head + rest
    found = _GTID_LINE.search(dump)
    if found is None:
        raise BackendError("mariadb-dump printed no GTID position: is the source's binlog on?")
    # Triggers are dumped with their definer (``DEFINER=`admin`@`10.0.0.5```), an account the
    # target may not have: a trigger whose definer is missing refuses every insert there.
    # Without the clause the account that loads the dump becomes the definer, as when
    # `store init` makes the trigger.
    return _DEFINER.sub(b"", dump), found.group(1).decode()


def _read_until(
    proc: subprocess.Popen[bytes], pattern: re.Pattern[bytes], deadline: float
) -> tuple[bytes, bool]:
    """What ``proc`` wrote to its stdout until that matches ``pattern``, the output ended, or
    ``deadline`` passed; and whether it ended."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    got = b""
    while pattern.search(got) is None:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return got, False
        chunk = os.read(fd, 65536)
        if not chunk:
            return got, True
        got += chunk
    return got, False


_DEFINER = re.compile(rb"/\*!50017 DEFINER=(?:`[^`]*`|[^ @*]+)@(?:`[^`]*`|[^ *]+)\s*\*/ ?")


def load_dump(url: URL, dump: bytes) -> None:
    """Run a dump made by `dump_databases` on the server at ``url``; `BackendError` if it fails."""
    args, env = _client(url)
    load = subprocess.run(["mariadb", *args], input=dump, capture_output=True, env=env)
    if load.returncode != 0:
        raise BackendError(f"loading failed: {load.stderr.decode(errors='replace').strip()[:500]}")


# -- promoting a slave (`store promote`) -------------------------------------------------------

#: Client errors of a connect that no server answered: can't connect through the socket (2002) or
#: TCP, refused or timed out (2003), gone (2006), lost in the handshake, a hung server's (2013, 2055).
#: Not 2005 (unknown host), nor a 2003 whose cause is a name that does not resolve: a config's
#: typo, not a dead server.
UNREACHABLE_ERRNOS = frozenset({2002, 2003, 2006, 2013, 2055})


def unreachable(exc: BaseException) -> bool:
    """True if ``exc`` (a driver's error opening a connection) says no server answered there."""
    if isinstance(exc, socket.gaierror):
        return False
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    args = getattr(exc, "args", ())
    code = args[0] if args and isinstance(args[0], int) else None
    # PyMySQL reports a failed lookup as 2003 too, the socket's error kept beside it.
    return code in UNREACHABLE_ERRNOS and not isinstance(
        getattr(exc, "original_exception", None), socket.gaierror
    )


def slave_lag(cur: Any) -> list[str]:
    """Each replication connection of the slave on ``cur`` that has not executed all it read from
    its master (its relay log behind its read position), as ``NAME read POS executed POS``."""
    return unapplied(slave_status(cur))


def slave_status(cur: Any) -> list[dict[str, Any]]:
    """``SHOW ALL SLAVES STATUS``: one dict per replication connection of the server on ``cur``."""
    cur.execute("SHOW ALL SLAVES STATUS")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=False)) for row in cur.fetchall()]


def unapplied(rows: list[dict[str, Any]]) -> list[str]:
    """Of `slave_status`'s ``rows``, each whose relay log is behind its read position, in words."""
    return [
        f"{row.get('Connection_name') or 'default'} read {row.get('Read_Master_Log_Pos')} "
        f"executed {row.get('Exec_Master_Log_Pos')}"
        for row in rows
        if (row.get("Master_Log_File"), row.get("Read_Master_Log_Pos"))
        != (row.get("Relay_Master_Log_File"), row.get("Exec_Master_Log_Pos"))
    ]


def not_replicating(rows: list[dict[str, Any]]) -> str | None:
    """Why a server whose `slave_status` is ``rows`` receives nothing from a master, or None: it has
    no replication connection, or one whose IO thread is stopped (by an error or by hand: what it
    has may end long before the master's last write). A master that died leaves the IO thread
    connecting again, not stopped."""
    if not rows:
        return "SHOW ALL SLAVES STATUS lists no master: it is no slave"
    for row in rows:
        if str(row.get("Slave_IO_Running") or "").lower() == "no":
            why = row.get("Last_IO_Error") or "stopped, no error"
            return f"{row.get('Connection_name') or 'default'}: its IO thread is not running ({why})"
    return None


def stop_slaves(cur: Any) -> None:
    """Stop every replication connection of the server on ``cur`` (``STOP ALL SLAVES``)."""
    cur.execute("STOP ALL SLAVES")
