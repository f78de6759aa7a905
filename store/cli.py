"""The `store` command: a thin layer over the library.

Each command builds the library object, calls one method and formats the
result. A `StoreError` becomes one line on stderr and exit code 1.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from store.backends import DEFAULT_BACKEND, backend_names
from store.cli_common import config_option as _config_option
from store.cli_common import echo_json as _echo_json
from store.cli_common import load_config as _load_config
from store.cli_common import open_admin as _open_admin
from store.cli_common import open_store as _open
from store.cli_common import parse_id as _parse_id
from store.cli_common import parse_shards as _parse_shards
from store.cli_common import require_type, type_option
from store.config import StoreConfig
from store.exceptions import ConfigError, IdError, LimitError, StoreError
from store.ids import (
    INSTAGRAM_EPOCH_MS,
    decode_instagram,
    decode_pinterest,
    encode_instagram,
    encode_pinterest,
)
from store.store import Store

__all__ = ["main"]


class _Group(click.Group):
    """A group that turns library errors into one clean line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StoreError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)


# -- logging ---------------------------------------------------------------------

#: Admin commands log their phases under this logger (``store.admin.move``, ``store.admin.check`` ...).
ADMIN_LOGGER = "store.admin"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


class _TextFormatter(logging.Formatter):
    """``2026-01-02T03:04:05.678Z INFO store.admin.move: message key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        extra = "".join(f" {k}={v}" for k, v in _fields(record).items())
        text = f"{ts} {record.levelname} {record.name}: {record.getMessage()}{extra}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg and the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        doc: dict[str, Any] = {
            "ts": ts,
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in _fields(record).items():
            doc.setdefault(k, v)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(*, json_lines: bool = False, level: int = logging.INFO) -> logging.Handler:
    """Send the ``store`` loggers to stderr with timestamps (``json_lines``: one JSON object a line).

    The library's request path logs nothing at INFO; admin commands log each
    phase under ``store.admin``. Called once per process; again, it only
    changes the format.
    """
    root = logging.getLogger("store")
    handler = next((h for h in root.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        root.addHandler(handler)
        root.propagate = False
    handler.setFormatter(_JsonFormatter() if json_lines else _TextFormatter())
    root.setLevel(level)
    return handler


def _admin_log(command: str) -> logging.Logger:
    return logging.getLogger(f"{ADMIN_LOGGER}.{command}")


@click.group(cls=_Group)
@click.version_option(package_name="store")
@click.option("--log-json", is_flag=True, help="Admin commands log one JSON object per line on stderr.")
def main(log_json: bool) -> None:
    """Sharded object/relation store over MariaDB: IDs, shard map, objects."""
    setup_logging(json_lines=log_json, level=logging.INFO)


# -- ids ---------------------------------------------------------------------


@main.group()
def ids() -> None:
    """Encode and decode 64-bit IDs (pure; no database)."""


@ids.command("decode")
@click.argument("id_text", metavar="ID")
@click.option(
    "--scheme", type=click.Choice(["pinterest", "instagram"]), default="pinterest", show_default=True
)
@click.option("--epoch-ms", type=int, default=INSTAGRAM_EPOCH_MS, show_default=True, help="Instagram epoch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ids_decode(id_text: str, scheme: str, epoch_ms: int, as_json: bool) -> None:
    """Split ID into its fields."""
    value = _parse_id(id_text)
    out: dict[str, Any]
    if scheme == "pinterest":
        out = {"id": value, **decode_pinterest(value)._asdict()}
    else:
        d = decode_instagram(value)
        out = {"id": value, **d._asdict(), "time": d.datetime(epoch_ms).isoformat()}
    if as_json:
        _echo_json(out)
    else:
        click.echo(" ".join(f"{k}={v}" for k, v in out.items()))


@ids.command("encode")
@click.option(
    "--scheme", type=click.Choice(["pinterest", "instagram"]), default="pinterest", show_default=True
)
@click.option("--shard", type=int, required=True, help="Shard id.")
@click.option("--type", "type_id", type=int, help="Type id (pinterest).")
@click.option("--local", "local_id", type=int, help="Local id (pinterest).")
@click.option("--ms", type=int, help="Milliseconds since the epoch (instagram).")
@click.option("--sequence", type=int, help="Sequence (instagram).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ids_encode(
    scheme: str,
    shard: int,
    type_id: int | None,
    local_id: int | None,
    ms: int | None,
    sequence: int | None,
    as_json: bool,
) -> None:
    """Build an ID from its fields."""
    if scheme == "pinterest":
        if type_id is None or local_id is None:
            raise IdError("a pinterest ID needs --shard, --type and --local")
        value = encode_pinterest(shard, type_id, local_id)
    else:
        if ms is None or sequence is None:
            raise IdError("an instagram ID needs --ms, --shard and --sequence")
        value = encode_instagram(ms, shard, sequence)
    click.echo(json.dumps({"id": value}) if as_json else str(value))


# -- provisioning and the map ------------------------------------------------


@main.command()
@_config_option
@click.option("--shards", "shard_text", help="Only these shards, A-B (default: all).")
def init(config_path: Path | None, shard_text: str | None) -> None:
    """Create every shard database and table on its master (idempotent)."""
    from store.admin import init_shards

    config = _load_config(config_path)
    wanted = _parse_shards(shard_text, config.shards) or range(config.shards)
    log = _admin_log("init")
    log.info("init: starting", extra={"fields": {"shards": f"{wanted.start}-{wanted.stop - 1}"}})
    with click.progressbar(length=len(wanted), label="shards", file=sys.stderr) as bar:
        report = init_shards(config, shards=wanted, on_shard=lambda _s: bar.update(1))
    log.info(
        "init: done",
        extra={
            "fields": {
                "shards": report.shards,
                "unique_shards": report.unique_shards,
                "hosts": len(report.per_host),
                "databases_created": report.databases_created,
                "tables_created": report.tables_created,
                "seconds": round(report.seconds, 3),
            }
        },
    )
    click.echo(
        f"{report.shards} shards checked on {len(report.per_host)} host(s) in {report.seconds:.1f} s: "
        f"{report.databases_created} databases and {report.tables_created} tables created"
    )
    if report.unique_shards:
        click.echo(
            f"unique keys hash over all {config.shards} shards: their unique_keys table was checked "
            f"(and made where missing) on the {report.unique_shards} shard(s) outside --shards too"
        )


@main.command()
@_config_option
@click.option("--full", is_flag=True, help="Check every list's count and every pair's inverse, not a sample.")
@click.option(
    "--sample", default=200, show_default=True, help="Lists and pairs checked per relation and shard."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--result-file",
    envvar="STORE_CHECK_RESULT",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also keep the result as JSON here, for `store serve --check-file` (default: $STORE_CHECK_RESULT).",
)
def check(config_path: Path | None, full: bool, sample: int, as_json: bool, result_file: Path | None) -> None:
    """Check every shard is live exactly once where the live map says, with its tables, counts and inverses.

    Exits 1 if anything is wrong; changes nothing.
    """
    from store.admin import check_store
    from store.admin.check import save_report

    with _open_admin(config_path) as store:
        shards = store.config.shards
        with click.progressbar(length=shards, label="shards", file=sys.stderr) as bar:
            report = check_store(store, full=full, sample=sample, on_shard=lambda _s: bar.update(1))
    if result_file is not None:
        save_report(report, result_file)
        _admin_log("check").info("check: result kept", extra={"fields": {"file": str(result_file)}})
    if as_json:
        _echo_json(report.as_dict())
    else:
        once = sum(1 for servers in report.live.values() if len(servers) == 1)
        click.echo(
            f"map version {report.map_version}: {once} of {report.shards} shards live exactly once; "
            f"{report.lists_checked} list counts and {report.pairs_checked} pairs checked"
            f"{' (all)' if full else ' (a sample)'}"
        )
        for finding in report.problems:
            click.echo("problem: " + finding.line())
        for finding in report.notes:
            click.echo("note: " + finding.line())
        click.echo("ok" if report.ok else f"{len(report.problems)} problem(s)")
    if not report.ok:
        sys.exit(1)


@main.command()
@_config_option
@click.option("--shard", default=0, show_default=True, help="Which shard's DDL to print.")
@click.option(
    "--backend",
    type=click.Choice(backend_names()),
    default=DEFAULT_BACKEND,
    show_default=True,
    help="SQL dialect.",
)
def schema(config_path: Path | None, shard: int, backend: str) -> None:
    """Print the DDL that `store init` runs for one shard."""
    from store.schema import render_shard_sql

    config = _load_config(config_path)
    click.echo(render_shard_sql(backend, shard, config), nl=False)


@main.group("map")
def map_() -> None:
    """Inspect the shard map."""


@map_.command("show")
@_config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def map_show(config_path: Path | None, as_json: bool) -> None:
    """List shard ranges, their hosts and the map version (live, from map_source if configured)."""
    config = _load_config(config_path)
    m = _live_map(config)
    if as_json:
        rows = [
            {"range": [r.start, r.end], "shards": len(r), "master": r.master, "slave": r.slave}
            for r in m.ranges
        ]
        _echo_json({"version": m.version, "shards": m.shards, "ranges": rows})
        return
    click.echo(f"shard map version {m.version}, {m.shards} shards, {len(m.ranges)} range(s)")
    click.echo(f"{'range':<16}{'shards':>8}  {'master':<16}{'slave'}")
    for r in m.ranges:
        click.echo(f"{f'{r.start}-{r.end}':<16}{len(r):>8}  {r.master:<16}{r.slave or '-'}")


def _live_map(config: StoreConfig) -> Any:
    if config.map_source is None:
        return config.shard_map
    with Store(config) as store:
        return store.shard_map


@map_.command("diff")
@_config_option
@click.option("--from", "from_version", type=int, help="Older version (default: the one before --to).")
@click.option("--to", "to_version", type=int, help="Newer version (default: the current one).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def map_diff(
    config_path: Path | None, from_version: int | None, to_version: int | None, as_json: bool
) -> None:
    """Show which shard spans changed master between two map versions (table map source)."""
    from store.mapsource import TableMapSource

    config = _load_config(config_path)
    if config.map_source is None or config.map_source[0] != "table":
        raise ConfigError("store map diff reads map history: configure map_source: {table: URL}")
    assert config.map_table is not None
    source = TableMapSource(config.map_table[1], database=config.names.meta_database)
    versions = source.versions()
    if not versions:
        raise ConfigError("the map table holds no map yet")
    new_v = to_version if to_version is not None else versions[-1]
    old_v = (
        from_version if from_version is not None else max([v for v in versions if v < new_v], default=new_v)
    )
    old, new = source.load(old_v), source.load(new_v)
    if old is None or new is None:
        raise ConfigError(f"no map version {old_v if old is None else new_v}; stored: {versions}")
    changes = old.diff(new)
    if as_json:
        _echo_json({"from": old_v, "to": new_v, "changes": [list(c) for c in changes]})
        return
    click.echo(f"map version {old_v} -> {new_v}: {len(changes)} span(s) changed master")
    for first, last, a, b in changes:
        click.echo(f"  shards {first}-{last}: {a} -> {b}")


@contextmanager
def _move_output() -> Iterator[tuple[Callable[[str], None], Callable[[dict[str, Any]], None] | None]]:
    """How a move talks: its lines, and on a terminal a live bar per phase under them (else no bar)."""
    if not sys.stdout.isatty():
        yield click.echo, None
        return
    from store.admin.move import TerminalProgress

    bar = TerminalProgress(sys.stdout)
    try:
        yield bar.say, bar.update
    finally:
        bar.close()


@main.command()
@_config_option
@click.option("--shards", "shard_text", help="The range to move, A-B.")
@click.option("--to", "to_host", help="The new master (a host name under hosts).")
@click.option("--slave", "slave_host", help="The new slave, if any.")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--resume", is_flag=True, help="Carry on a move that stopped.")
@click.option("--abort", "abort_", is_flag=True, help="Undo a move that has not switched the map.")
@click.option("--cleanup", is_flag=True, help="After a move: drop the source's archived copies.")
@click.option("--journal", default="store-move.json", show_default=True, help="The move's journal file.")
@click.option(
    "--status", is_flag=True, help="Print the journaled move's phase, timings and progress; change nothing."
)
@click.option("--json", "as_json", is_flag=True, help="With --status: print one JSON object.")
def move(
    config_path: Path | None,
    shard_text: str | None,
    to_host: str | None,
    slave_host: str | None,
    dry_run: bool,
    yes: bool,
    resume: bool,
    abort_: bool,
    cleanup: bool,
    journal: str,
    status: bool,
    as_json: bool,
) -> None:
    """Move shards A-B to another MariaDB (or PostgreSQL) host: copy, catch up, fence, verify, switch."""
    from store.admin.move import Mover

    if status:  # files only: no config or server needed
        from store.admin.status import format_move_status, move_status

        if any((shard_text, to_host, slave_host, dry_run, resume, abort_, cleanup)):
            raise ConfigError("store move --status takes only --journal and --json")
        found = move_status(journal)
        if as_json:
            click.echo(json.dumps(found, sort_keys=True, default=str))
        else:
            for line in format_move_status(found):
                click.echo(line)
        return
    if as_json:
        raise ConfigError("--json goes with store move --status")
    with _open_admin(config_path) as store, _move_output() as (say, watch):
        mover = Mover(store, journal, say=say)
        mover.watch = watch
        if resume or abort_ or cleanup:
            if sum((resume, abort_, cleanup)) > 1:
                raise ConfigError("give one of --resume, --abort, --cleanup")
            if resume:
                mover.resume()
            elif abort_:
                mover.abort()
            else:
                click.echo("dropped: " + ", ".join(mover.cleanup()))
            return
        if shard_text is None or to_host is None:
            raise ConfigError("store move needs --shards A-B and --to HOST (or --resume/--abort/--cleanup)")
        wanted = _parse_shards(shard_text, store.config.shards)
        assert wanted is not None
        from store.admin.pg_move import PgMover, is_postgres

        if not isinstance(mover, PgMover) and is_postgres(store, store.shard_map.master(wanted.start)):
            mover = PgMover(store, journal, say=say)  # PostgreSQL shards in a mixed config
            mover.watch = watch
        plan = mover.plan(wanted.start, wanted.stop - 1, to_host, slave_host)
        _admin_log("move").info(
            "move: planned",
            extra={
                "fields": {
                    "shards": f"{plan.low}-{plan.high}",
                    "source": plan.source,
                    "target": plan.target,
                    "tables": len(plan.tables),
                    "rows": plan.rows,
                    "bytes": plan.bytes,
                }
            },
        )
        click.echo(
            f"plan: shards {plan.low}-{plan.high} from {plan.source} to {plan.target}"
            f"{f' (slave {plan.slave})' if plan.slave else ''}: {len(plan.databases())} databases, "
            f"{len(plan.tables)} tables, about {plan.rows:,} rows, {plan.bytes / 1e6:.1f} MB"
        )
        if dry_run:
            return
        if not yes:
            click.confirm("start the move?", abort=True)
        mover.start(plan)


@main.command()
@_config_option
@click.option("--hosts", "hosts_text", help="The MariaDB hosts to spread the shards over, H1,H2,...")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--resume", is_flag=True, help="Carry on a rebalance that stopped (its journal holds the plan)."
)
@click.option(
    "--journal", default="store-rebalance.json", show_default=True, help="The rebalance's journal file."
)
@click.option(
    "--cleanup", is_flag=True, help="After a rebalance: drop every move's archived copies on its source."
)
def rebalance(
    config_path: Path | None,
    hosts_text: str | None,
    dry_run: bool,
    yes: bool,
    resume: bool,
    journal: str,
    cleanup: bool,
) -> None:
    """Spread the shards evenly over --hosts, moving the fewest rows, one store move at a time.

    Hosts holding shards that are not in --hosts are drained. Each move's
    own journal is the rebalance journal's name + .move. A moved range gets
    the target's slave (if all its ranges name one), never its old one.
    """
    from store.admin.rebalance import (
        check_hosts,
        cleanup_rebalance,
        estimate_shard_rows,
        plan_rebalance,
        plan_summary,
        run_rebalance,
    )

    log = _admin_log("rebalance")

    def say(msg: str) -> None:
        click.echo(msg)

    if cleanup:
        if hosts_text is not None or dry_run or resume:
            raise ConfigError("store rebalance --cleanup takes only --journal (and --config)")
        with _open_admin(config_path) as store:
            dropped = cleanup_rebalance(store, journal, say)
        click.echo(f"dropped: {len(dropped)} archive database(s)")
        return
    if resume:
        if hosts_text is not None or dry_run:
            raise ConfigError("store rebalance --resume takes the plan from its journal: give no --hosts")
        with _open_admin(config_path) as store, _move_output() as (say_, watch):
            run_rebalance(store, None, journal, say_, watch)
        return
    if hosts_text is None:
        raise ConfigError("store rebalance needs --hosts H1,H2,... (or --resume)")
    hosts = list(dict.fromkeys(h.strip() for h in hosts_text.split(",") if h.strip()))
    if not hosts:
        raise ConfigError(f"--hosts takes host names separated by commas, got {hosts_text!r}")
    with _open_admin(config_path) as store:
        store.refresh_map(force=True)
        m = store.shard_map
        check_hosts(store.config, hosts, m)
        rows, why = estimate_shard_rows(store, m)
        plan = plan_rebalance(m, hosts, rows)
        summary = plan_summary(m, hosts, plan)
        log.info(
            "rebalance: planned",
            extra={
                "fields": {
                    "hosts": ",".join(hosts),
                    "moves": summary["moves"],
                    "shards_moved": summary["shards_moved"],
                    "rows_moved": summary["rows_moved"],
                    "map_version": m.version,
                }
            },
        )
        measured = (
            f"{summary['rows_moved']} rows"
            if rows is not None
            else f"rows not measured: {why}; counting shards"
        )
        click.echo(
            f"plan (map version {m.version}): {summary['moves']} move(s), "
            f"{summary['shards_moved']} of {summary['shards']} shards, {measured}"
        )
        for host in summary["drained"]:
            click.echo(f"drain: {host} is not in --hosts; its shards move to the given hosts")
        for mv in plan:
            click.echo(mv.line())
        click.echo(f"{'host':<16}{'before':>8}{'after':>8}")
        for host, n in summary["hosts"].items():
            click.echo(f"{host:<16}{n['before']:>8}{n['after']:>8}")
        if dry_run:
            return
        if not plan:
            click.echo("nothing to move: the shards are spread evenly already")
            return
        if not yes:
            click.confirm(f"run {len(plan)} move(s)?", abort=True)
        with _move_output() as (say_, watch):
            run_rebalance(store, plan, journal, say_, watch)


@main.command()
@_config_option
@click.option("--shards", "shard_text", required=True, help="The range whose slave becomes master, A-B.")
@click.option("--force", is_flag=True, help="Promote even if the slave may lack writes (they are lost).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def promote(config_path: Path | None, shard_text: str, force: bool, yes: bool) -> None:
    """After a master dies: make its slave the master of shards A-B in the live map."""
    from store.admin.promote import promote as run_promote

    with _open_admin(config_path) as store:
        wanted = _parse_shards(shard_text, store.config.shards)
        assert wanted is not None
        if not yes:
            click.confirm(f"promote the slave of shards {shard_text}?", abort=True)
        log = _admin_log("promote")
        log.info("promote: starting", extra={"fields": {"shards": shard_text, "force": force}})

        def say(msg: str) -> None:
            log.info(msg, extra={"fields": {"shards": shard_text}})
            click.echo(msg)

        run_promote(store, wanted.start, wanted.stop - 1, force=force, say=say)


@main.command()
@_config_option
@click.option("--app-user", required=True, help="The application's account (it must exist).")
@click.option("--app-host", default="%", show_default=True, help="MariaDB: the account's host part.")
@click.option("--apply", "apply_", is_flag=True, help="Run the GRANTs with each server's admin URL.")
def grants(config_path: Path | None, app_user: str, app_host: str, apply_: bool) -> None:
    """Print (or --apply) the GRANTs the application account needs: rows of the shards, nothing more.

    The account may then read and write rows of every shard's tables, the
    invalidation log and the map table; it cannot CREATE, DROP, ALTER or
    GRANT. Run after `store init` (PostgreSQL grants on existing schemas).
    """
    from store.grants import apply_grants, grant_plan

    config = _load_config(config_path)
    plan = grant_plan(config, app_user, app_host)
    _admin_log("grants").info(
        "grants: planned", extra={"fields": {"servers": len(plan), "app_user": app_user, "apply": apply_}}
    )
    if not plan:
        click.echo("-- no server here has accounts (SQLite): protect the shard files with file permissions")
        return
    if apply_:

        def granted(server: str) -> None:
            _admin_log("grants").info("grants: applied", extra={"fields": {"server": server}})
            click.echo(f"granted on {server}")

        ran = apply_grants(plan, app_user, app_host, on_server=granted)
        click.echo(f"{ran} statements on {len(plan)} server(s)")
        return
    for g in plan:
        hosts = f" (hosts {', '.join(g.hosts)})" if g.hosts else " (the shard map table)"
        click.echo(f"-- {g.server}{hosts}: {len(g.statements)} statements")
        for stmt in g.statements:
            click.echo(stmt + ";")


@main.command()
@_config_option
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (others need --token)."
)
@click.option("--port", default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--token",
    envvar="STORE_SERVE_TOKEN",
    help="Every request must carry it (?token=, X-Store-Token or Bearer); needed beyond 127.0.0.1.",
)
@click.option(
    "--journal",
    default="store-move.json",
    show_default=True,
    help="The journal of the move to show (as given to store move --journal).",
)
@click.option(
    "--check-file",
    envvar="STORE_CHECK_RESULT",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The result `store check --result-file` keeps (default: $STORE_CHECK_RESULT).",
)
@click.option("--metrics", "with_metrics", is_flag=True, help="Also serve Prometheus metrics on /metrics.")
def serve(
    config_path: Path | None,
    host: str,
    port: int,
    token: str | None,
    journal: str,
    check_file: Path | None,
    with_metrics: bool,
) -> None:
    """Serve the operator page: live map, hosts, caches, a running move, the last check (JSON under /api)."""
    from store.serve import check_bind
    from store.serve import serve as run_serve

    check_bind(host, token)
    with _open_admin(config_path) as store:
        click.echo(f"serving on http://{host}:{port}/", err=True)
        run_serve(
            store,
            host=host,
            port=port,
            token=token,
            journal=journal,
            check_file=check_file,
            metrics=with_metrics,
        )


# -- objects -------------------------------------------------------------------


@main.command()
@click.argument("name")
@click.argument("value")
@_config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the key, value and ID (null if free).")
def lookup(name: str, value: str, config_path: Path | None, as_json: bool) -> None:
    """Print the ID whose unique key NAME (config unique:) is VALUE (exit 1 if none holds it)."""
    with _open(config_path) as store:
        found = store.lookup(name, value)
    if as_json:
        _echo_json({"key": name, "value": value, "id": found})
    elif found is not None:
        click.echo(found)
    if found is None:
        if not as_json:
            click.echo(f"no live object holds {name} {value!r}", err=True)
        sys.exit(1)


@main.command()
@click.argument("type_name", metavar="TYPE")
@click.argument("data_text", metavar="JSON")
@_config_option
@click.option("--near", "near_text", help="Put the object on this ID's shard.")
@click.option("--shard", type=int, help="Put the object on this shard.")
def create(
    type_name: str, data_text: str, config_path: Path | None, near_text: str | None, shard: int | None
) -> None:
    """Create an object of TYPE from a JSON object; print its ID."""
    data = _parse_json(data_text)
    with _open(config_path) as store:
        near = None if near_text is None else _parse_id(near_text)
        click.echo(store.create(type_name, data, near=near, shard=shard))


@main.command()
@click.argument("id_text", metavar="ID")
@click.argument("data_text", metavar="JSON")
@_config_option
@type_option
def update(id_text: str, data_text: str, config_path: Path | None, type_name: str | None) -> None:
    """Merge a JSON object of changes into the object with ID; print the result."""
    changes = _parse_json(data_text)
    value = _parse_id(id_text)
    with _open(config_path) as store:
        require_type(store.config, type_name, value)
        click.echo(json.dumps(store.update(value, changes, type_name=type_name), ensure_ascii=False))


@main.command()
@click.argument("id_text", metavar="ID")
@_config_option
@type_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(id_text: str, config_path: Path | None, type_name: str | None, yes: bool) -> None:
    """Soft-delete the object with ID (the row stays, marked inactive)."""
    value = _parse_id(id_text)
    require_type(_load_config(config_path), type_name, value)  # before asking
    if not yes:
        click.confirm(f"soft-delete object {value}?", abort=True)
    with _open(config_path) as store:
        click.echo("deleted" if store.delete(value, type_name=type_name) else "nothing to delete")


# -- relations -----------------------------------------------------------------


@main.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@_config_option
@click.option("--limit", default=50, show_default=True, help="Entries per page.")
@click.option("--cursor", help="Continue after this cursor (printed by the previous page).")
@click.option("--offset", type=int, help="Use LIMIT/OFFSET paging instead of a cursor.")
@click.option("--newest-first", is_flag=True, help="Highest sequence first.")
@click.option("--since", type=int, help="Only entries with sequence >= SINCE (microseconds by default).")
@click.option("--until", type=int, help="Only entries with sequence < UNTIL (exclusive).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {ids, next_cursor}.")
def links(
    relation: str,
    from_text: str,
    config_path: Path | None,
    limit: int,
    cursor: str | None,
    offset: int | None,
    newest_first: bool,
    since: int | None,
    until: int | None,
    as_json: bool,
) -> None:
    """List the IDs FROM_ID links to through RELATION, in sequence order.

    --since/--until keep to a sequence range (since inclusive, until
    exclusive); a --cursor from such a page needs the same range.
    """
    from_id = _parse_id(from_text)
    with _open(config_path) as store:
        if offset is not None:
            if cursor is not None:
                raise IdError("give --cursor or --offset, not both")
            if since is not None or until is not None:
                raise LimitError("--since/--until page by cursor: leave out --offset")
            ids = store.links(relation, from_id, limit=limit, offset=offset, newest_first=newest_first)
            next_cursor = None
        else:
            page = store.page(
                relation,
                from_id,
                limit=limit,
                cursor=cursor,
                newest_first=newest_first,
                since=since,
                until=until,
            )
            ids, next_cursor = page.ids, page.next_cursor
    if as_json:
        _echo_json({"ids": ids, "next_cursor": next_cursor})
        return
    for i in ids:
        click.echo(i)
    if next_cursor is not None:
        click.echo(f"next page: --cursor {next_cursor}", err=True)


@main.command("has-link")
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@click.argument("to_text", metavar="TO_ID")
@_config_option
@click.option("--json", "as_json", is_flag=True, help="Print the answer as a JSON boolean.")
def has_link(relation: str, from_text: str, to_text: str, config_path: Path | None, as_json: bool) -> None:
    """Print true if TO_ID is in FROM_ID's RELATION list, else false (exit 0 either way)."""
    with _open(config_path) as store:
        linked = store.has_link(relation, _parse_id(from_text), _parse_id(to_text))
    click.echo(json.dumps(linked) if as_json else ("true" if linked else "false"))


@main.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@_config_option
def count(relation: str, from_text: str, config_path: Path | None) -> None:
    """Print how many entries FROM_ID's RELATION list has."""
    with _open(config_path) as store:
        click.echo(store.count(relation, _parse_id(from_text)))


@main.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@click.argument("to_text", metavar="TO_ID")
@_config_option
@click.option("--sequence", type=int, help="Position (default: now in microseconds; moves an existing pair).")
def link(relation: str, from_text: str, to_text: str, config_path: Path | None, sequence: int | None) -> None:
    """Add TO_ID to FROM_ID's RELATION list (and the inverse, if configured)."""
    with _open(config_path) as store:
        new = store.link(relation, _parse_id(from_text), _parse_id(to_text), sequence=sequence)
    click.echo("linked" if new else "already linked")


@main.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@click.argument("to_text", metavar="TO_ID")
@_config_option
def unlink(relation: str, from_text: str, to_text: str, config_path: Path | None) -> None:
    """Remove TO_ID from FROM_ID's RELATION list (and the inverse)."""
    with _open(config_path) as store:
        gone = store.unlink(relation, _parse_id(from_text), _parse_id(to_text))
    click.echo("unlinked" if gone else "not linked")


@main.group()
def relations() -> None:
    """Maintain relation tables."""


@relations.command("repair")
@click.argument("relation", required=False)
@_config_option
@click.option("--shards", "shard_text", help="Only tables on these shards, A-B (default: all).")
@click.option("--dry-run", is_flag=True, help="Report what is wrong; change nothing.")
@click.option("--json", "as_json", is_flag=True, help='Print JSON (an error too: {"error": ...}, exit 1).')
def relations_repair(
    relation: str | None, config_path: Path | None, shard_text: str | None, dry_run: bool, as_json: bool
) -> None:
    """Restore missing inverse pairs, drop dangling ones, fix counts; fix unique-key rows (config unique:).

    With --shards, only the tables stored on those shards are scanned (the
    other end of a pair, or a key's row, is read where it lives).
    """
    try:
        _relations_repair(relation, config_path, shard_text, dry_run, as_json)
    except StoreError as exc:
        if not as_json:
            raise
        _echo_json({"error": str(exc), "error_type": type(exc).__name__})
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def _relations_repair(
    relation: str | None, config_path: Path | None, shard_text: str | None, dry_run: bool, as_json: bool
) -> None:
    from store.admin import repair_relations

    with _open_admin(config_path) as store:
        only = _parse_shards(shard_text, store.config.shards)
        wanted = only or range(store.config.shards)
        if relation is not None:
            store.admin_context().router.relation(relation)  # fail before the progress bar starts
        with click.progressbar(length=len(wanted), label="shards", file=sys.stderr) as bar:
            log = _admin_log("repair")
            log.info("repair: starting", extra={"fields": {"relation": relation, "dry_run": dry_run}})
            report = repair_relations(
                store, relation, shards=wanted, dry_run=dry_run, on_shard=lambda _s: bar.update(1)
            )
            log.info(
                "repair: done",
                extra={"fields": {"rows_scanned": report.rows_scanned, "changes": report.changes}},
            )
        unique = bool(store.config.unique)
    if as_json:
        doc: dict[str, Any] = {
            "dry_run": report.dry_run, "rows_scanned": report.rows_scanned,
            "inverse_added": report.inverse_added, "inverse_removed": report.inverse_removed,
            "counts_fixed": report.counts_fixed, "unroutable": report.unroutable,
        }  # fmt: skip
        if relation is None and unique:
            from store.admin.repair import repair_unique

            with _open_admin(config_path) as store:
                found = repair_unique(store, dry_run=dry_run, shards=only)
            doc["unique_keys"] = {
                "checked": found.checked, "removed": found.removed, "added": found.added,
                "repointed": found.repointed, "conflicts": found.conflicts,
            }  # fmt: skip
        _echo_json(doc)
        return
    verb = "would " if dry_run else ""
    for name, f, t in report.inverse_added:
        click.echo(f"{verb}add {name} {f} -> {t} (its primary pair exists)")
    for name, f, t in report.inverse_removed:
        click.echo(f"{verb}remove {name} {f} -> {t} (its primary pair is gone)")
    for name, f, kept, actual in report.counts_fixed:
        click.echo(f"{verb}set count of {name} {f} from {kept} to {actual}")
    for name, f, t, why in report.unroutable:
        click.echo(f"cannot check {name} {f} -> {t}: {why}")
    click.echo(f"{report.rows_scanned} rows scanned on {len(wanted)} shard(s): {report.changes} fix(es)")
    if relation is None and unique:
        _repair_unique(config_path, dry_run, only)


def _repair_unique(config_path: Path | None, dry_run: bool, shards: range | None) -> None:
    from store.admin.repair import repair_unique

    with _open_admin(config_path) as store:
        found = repair_unique(store, dry_run=dry_run, shards=shards)
    verb = "would " if dry_run else ""
    for what, counts in (("remove", found.removed), ("add", found.added), ("repoint", found.repointed)):
        for name, n in counts.items():
            click.echo(f"unique key {name}: {verb}{what} {n} row(s)")
    for name, value, ids in found.conflicts:
        click.echo(
            f"unique key {name}: {value!r} is held by {len(ids)} live objects {ids}; change all but one"
        )
    where = "" if shards is None else f" on shards {shards.start}-{shards.stop - 1}"
    click.echo(f"unique keys: {found.checked} row(s) checked{where}")


# -- tickets -------------------------------------------------------------------


@main.group()
def tickets() -> None:
    """Flickr-style ticket servers: dense unique IDs from two MariaDB servers."""


def _ticket_allocator(path: Path | None) -> Any:
    import yaml

    from store.config import TicketsConfig
    from store.tickets import TicketAllocator

    if path is None:
        raise ConfigError("store tickets needs --config (or $STORE_CONFIG) with a tickets: section")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(raw, dict) or "tickets" not in raw:
        raise ConfigError(f"{path} has no tickets: section (servers: [URL, URL], counters: [...])")
    from store.naming import Names

    names = Names(raw.get("namespace"))
    return TicketAllocator(TicketsConfig.from_dict(raw["tickets"], path.resolve().parent, names=names))


@tickets.command("init")
@_config_option
def tickets_init(config_path: Path | None) -> None:
    """Set up the tickets database: each server's place, a counter row per counter; switch REPLACE tables."""
    allocator = _ticket_allocator(config_path)
    try:
        allocator.init()
    finally:
        allocator.close()
    cfg = allocator.config
    click.echo(
        f"{len(cfg.servers)} ticket server(s) ready: counters {', '.join(cfg.counters)}, block {cfg.block}"
    )


@tickets.command("next")
@click.argument("counter", required=False, default=None)
@_config_option
@click.option("-n", "count", default=1, show_default=True, help="How many IDs.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def tickets_next(counter: str | None, config_path: Path | None, count: int, as_json: bool) -> None:
    """Print new IDs from COUNTER (default: the first configured counter)."""
    allocator = _ticket_allocator(config_path)
    try:
        ids = allocator.next_many(counter or allocator.config.counters[0], count)
    finally:
        allocator.close()
    if as_json:
        _echo_json(ids)
    else:
        for i in ids:
            click.echo(i)


def _parse_json(text: str) -> dict[str, Any]:
    from store.exceptions import NotSerializableError

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotSerializableError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise NotSerializableError(
            "JSON nested too deeply to read; an object may nest limits.max_depth levels"
        ) from None
    except ValueError:  # an integer of more than 4,300 digits
        raise NotSerializableError(
            "JSON holds an integer too long to read; objects hold 64-bit integers "
            "(write big numbers as strings)"
        ) from None
    if not isinstance(data, dict):
        raise NotSerializableError(f"expected a JSON object, got {type(data).__name__}")
    return data


# -- demo and bench -------------------------------------------------------------


@main.command()
@_config_option
def demo(config_path: Path | None) -> None:
    """Create users, boards and pins, read them back, time each step."""
    from store.tools.demo import run_demo

    with _open(config_path) as store:
        run_demo(store, say=click.echo)


@main.group(invoke_without_command=True)
@_config_option
@click.option("-n", "--iterations", default=2000, show_default=True, help="Calls per case.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Run with metrics on, served on 127.0.0.1:PORT/metrics, and time get and warm get "
    "with metrics on against off (needs the metrics extra).",
)
@click.pass_context
def bench(
    ctx: click.Context, config_path: Path | None, iterations: int, as_json: bool, metrics_port: int | None
) -> None:
    """Time store operations next to the raw driver doing the same work.

    `store bench mix` runs a mixed workload over threads instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    from store.tools.bench import format_results, run_bench

    say: Callable[[str], None] = lambda msg: click.echo(f"running {msg} ...", err=True)  # noqa: E731
    metrics = None
    if metrics_port is not None:
        from prometheus_client import start_http_server

        from store.metrics import Metrics

        metrics = Metrics()
        start_http_server(metrics_port, addr="127.0.0.1", registry=metrics.registry)
        click.echo(f"metrics on http://127.0.0.1:{metrics_port}/metrics", err=True)
    with _open(config_path) as store:
        results = run_bench(store, n=iterations, progress=say, metrics=metrics)
        stats = store.stats()
        last_errors = store.admin_context().caches.last_errors()
    if as_json:
        _echo_json({"results": [r.as_dict() for r in results], "cache_stats": stats})
        return
    click.echo(format_results(results))
    for name, counters in stats.items():
        click.echo(f"cache {name}: " + ", ".join(f"{k} {v}" for k, v in counters.items()))
        if name in last_errors:
            click.echo(f"cache {name} last error: {last_errors[name]}")


def _thread_counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= c <= 256 for c in counts):
        raise click.BadParameter(
            f"give thread counts in 1..256 separated by commas, like 1,4,16; got {text!r}"
        )
    return counts


def _task_counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= c <= 10_000 for c in counts):
        raise click.BadParameter(
            f"give task counts in 1..10000 separated by commas, like 16,64,256; got {text!r}"
        )
    return counts


@bench.command("mix")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A Pinterest-ID MariaDB or Instagram-ID PostgreSQL config with memcached and Redis (default: "
    "the mix's own, 64 shards on 2 host names on 127.0.0.1:3306; STORE_MIX_URL, STORE_MIX_URL_A/B "
    "override, a postgresql+psycopg:// URL naming a database for 64 schema shards).",
)
@click.option("--threads", "threads_text", default="1,4,16", show_default=True, help="Thread counts to run.")
@click.option(
    "--processes",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes per phase, each with the phase's threads, on the same data (P x T callers).",
)
@click.option("--seconds", default=10.0, show_default=True, help="Length of each phase.")
@click.option("--requests", type=int, default=None, help="Calls per thread per phase instead of --seconds.")
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    help="Slices of each warm phase, the systems taking turns (noise lands on all alike).",
)
@click.option("--shards", default=64, show_default=True, help="Shards the data set spreads over.")
@click.option("--users", default=2000, show_default=True, help="Users (2 boards each; 20 pins per user).")
@click.option(
    "--systems",
    default="floor,horizontal_shard,store,store:follow=true",  # store.tools.mix.bench.DEFAULT_SYSTEMS
    show_default=True,
    help="Which systems to run, in order: floor, horizontal_shard, store, store-mysqldb (see --mysqldb), "
    "or the store with cache settings changed, store:KEY=VALUE[,...] "
    "(store:follow=true: with the invalidation log followed by every process; store:invalidation=log or "
    "store:invalidation=binlog: with a `store invalidate` daemon of its own, started for the run).",
)
@click.option(
    "--idle-seconds",
    "idle_s",
    type=click.FloatRange(0, 60),
    default=4.0,
    show_default=True,
    help="After the run, hold each system open this long with no calls and report the database queries a "
    "second its background work costs (followers, daemons, map checks); 0: skip.",
)
@click.option(
    "--mysqldb",
    "mysqldb_url",
    default=None,
    help="A mysql+mysqldb:// URL: also run the store on the mysqlclient driver.",
)
@click.option(
    "--async",
    "run_async",
    is_flag=True,
    help="Also run store:async: AsyncStore awaited by --concurrency tasks on one event loop.",
)
@click.option(
    "--concurrency",
    "concurrency_text",
    default="16,64,256",
    show_default=True,
    help="Task counts of store:async's phases (with --async; --quick: 4,32).",
)
@click.option("--quick", is_flag=True, help="A small data set, threads 1,2, 2 s phases: under a minute.")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("mix-results"),
    show_default=True,
    help="Where mix.json and the PNG charts go.",
)
@click.option("--keep", is_flag=True, help="Keep the loaded data sets (removed by default).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON instead of the tables.")
def bench_mix(
    config_path: Path | None,
    threads_text: str,
    processes: int,
    seconds: float,
    requests: int | None,
    rounds: int,
    shards: int,
    users: int,
    systems: str,
    idle_s: float,
    mysqldb_url: str | None,
    run_async: bool,
    concurrency_text: str,
    quick: bool,
    out: Path,
    keep: bool,
    as_json: bool,
) -> None:
    """A LinkBench-style mix over threads: the store, a hand-written floor, SQLAlchemy's horizontal_shard.

    Each system loads its own copy of the same data set and replays the
    same request streams, cold and warm, at each thread count; afterwards its
    answers are checked against the databases and its round trips counted.
    Each phase reports the client's CPU per call and the CPU the machine's
    server processes (MariaDB, Redis, memcached, PostgreSQL) spent per call:
    run it on a quiet machine. With --processes P each phase runs in P worker processes (spawned, each
    building its own system) of T threads each, on the same loaded data;
    ops/s is all their calls over the wall time of the whole phase.
    With --async, store:async (the same store through store.aio.AsyncStore) runs C tasks on one
    event loop for each C of --concurrency, and each store's database connections are reported.
    """
    from store.tools.mix.bench import QUICK_SHAPE, MixOptions, data_set_summary, run_mix
    from store.tools.mix.workload import Shape, make_data_set

    shape = QUICK_SHAPE if quick else Shape(users=users, pins=20 * users)
    options = MixOptions(
        config=None if config_path is None else _load_config(config_path),
        shards=shards,
        shape=shape,
        threads=[1, 2] if quick else _thread_counts(threads_text),
        seconds=2.0 if quick else seconds,
        requests=requests,
        rounds=rounds,
        systems=tuple(s.strip() for s in systems.split(",") if s.strip())
        + (("store:async",) if run_async and "store:async" not in systems else ()),
        concurrency=[4, 32] if quick and concurrency_text == "16,64,256" else _task_counts(concurrency_text),
        mysqldb_url=mysqldb_url,
        trips=100 if quick else 400,
        out=out,
        keep=keep,
        processes=processes,
        idle_s=1.0 if quick and idle_s == 4.0 else idle_s,
    )
    click.echo(f"data set: {data_set_summary(make_data_set(shape))}", err=True)
    doc = run_mix(options, say=lambda msg: click.echo(msg, err=True))
    if as_json:
        _echo_json(doc)
        return
    click.echo(doc["report"])
    charts = ", ".join(doc["charts"]) or "none"
    click.echo(f"\nraw numbers: {out / 'mix.json'}; tables: {out / 'mix.md'}; charts: {charts}")


@main.command()
@_config_option
@click.option(
    "--host", "host_names", multiple=True, help="Only this host (repeatable; default: every followed host)."
)
@click.option(
    "--status-every",
    type=float,
    default=0.0,
    help="Print each server's invalidator as one JSON line every N seconds (0: never).",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve Prometheus gauges per host (role, heartbeat age, lag) on 127.0.0.1:PORT/metrics.",
)
@click.option(
    "--from-now",
    is_flag=True,
    help="Start each binlog at its end instead of the saved position (entries are trusted from the start "
    "on, as after any gap; a takeover later resumes from the saved position).",
)
def invalidate(
    config_path: Path | None,
    host_names: tuple[str, ...],
    status_every: float,
    metrics_port: int | None,
    from_now: bool,
) -> None:
    """Run the invalidation daemon: read each host's commit log and delete the keys each write changed.

    One instance per host leads (a lock on the host, on its own connection);
    others wait as standbys and take over when it dies. Runs until SIGTERM
    or Ctrl-C.
    """
    import signal

    from store.invalidate import Daemon

    daemon = Daemon(_load_config(path=config_path), hosts=host_names, from_now=from_now)
    signal.signal(signal.SIGTERM, lambda *_: daemon.request_stop())
    if metrics_port is not None:
        from prometheus_client import CollectorRegistry, start_http_server

        from store.invalidate.metrics import DaemonCollector

        registry = CollectorRegistry()
        registry.register(DaemonCollector(daemon))
        start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
    daemon.start()
    try:
        while not daemon.wait(status_every or None):
            if status_every:
                click.echo(json.dumps({"invalidators": daemon.status()}, sort_keys=True, default=str))
    except KeyboardInterrupt:
        pass
    finally:
        daemon.stop()


# -- export and import ---------------------------------------------------------------------


@contextmanager
def _progress(length: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal (else nothing); yields its ``update``."""
    if not sys.stderr.isatty():
        yield lambda _n: None
        return
    bar: Any
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


@main.command()
@_config_option
@click.option("--shards", "shard_text", help="Only these shards, A-B (default: all).")
@click.option(
    "--out", "out", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE (default: stdout)."
)
@click.option("--resume", is_flag=True, help="Go on with the partial export in --out after its last line.")
def export(config_path: Path | None, shard_text: str | None, out: Path | None, resume: bool) -> None:
    """Every object (deleted ones marked) and relation entry as NDJSON, one JSON object a line."""
    with _open_admin(config_path) as store:
        wanted = _parse_shards(shard_text, store.config.shards)
        if resume and out is None:
            raise ConfigError("--resume goes on with the export in --out FILE: give --out")
        total = len(store.config.types) + len(store.config.relations)
        with _progress(total * len(wanted or range(store.config.shards)), "export") as step:
            seen = [0]

            def progress(done: int, _total: int) -> None:
                step(done - seen[0])
                seen[0] = done

            target: Any = out if out is not None else sys.stdout
            report = store.export(target, shards=wanted, resume=resume, progress=progress)
    if out is not None:
        state = (
            "already complete" if report.complete_already else ("resumed" if report.resumed else "written")
        )
        click.echo(f"{out}: {report.objects} objects, {report.links} entries ({state})", err=True)


@main.command("import")
@_config_option
@click.argument("file", type=click.File("rb"))
@click.option("--batch", default=1000, show_default=True, help="Lines checked, then written, at a time.")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def import_(config_path: Path | None, file: Any, batch: int, as_json: bool) -> None:
    """Add what an export FILE holds (- reads stdin), IDs kept; run again, it adds nothing.

    Each batch of lines is checked whole before anything of it is written: a
    bad line refuses its batch, naming every bad line's number.
    """
    import os

    try:
        length: int | None = os.fstat(file.fileno()).st_size or None
    except (OSError, ValueError, AttributeError):  # stdin from a pipe, or a test runner's stream
        length = None
    with _open_admin(config_path) as store, _progress(length, "import") as step:
        report = store.import_records(file, batch=batch, progress=step)
    if as_json:
        _echo_json({k: v for k, v in vars(report).items() if k != "shards"})
    else:
        click.echo(
            f"{report.objects_added} objects added ({report.objects_present} there already), "
            f"{report.links_added} entries added ({report.links_present} there already)"
            + (f", {report.unique_added} unique key rows" if report.unique_added else "")
        )
    if not report.complete:
        click.echo(
            "error: the file has an export's header but no end line: the export was cut short", err=True
        )
        sys.exit(1)


def _add_read_commands() -> None:
    """`store get`, `page` and `ping` live in `store.cli_reads` (this module is long enough)."""
    from store.cli_reads import get, page, ping

    for command in (get, page, ping):
        main.add_command(command)


_add_read_commands()


if __name__ == "__main__":  # python -m store.cli
    main()
