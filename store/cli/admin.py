"""Provisioning and the map: `store init`, `check`, `schema`, `map`, `rebalance`, `promote`, `grants`.

Each calls the library (`store.admin`, `store.grants`) and reports; those that
touch servers log their phases under `store.admin.COMMAND` (`store.cli.logs`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from store.backends import DEFAULT_BACKEND, backend_names
from store.cli.common import (
    config_option,
    echo_json,
    load_config,
    move_output,
    open_admin,
    parse_shards,
    progress_bar,
)
from store.cli.logs import admin_log
from store.config import StoreConfig
from store.exceptions import ConfigError, IdError
from store.store import Store

__all__ = ["check", "grants", "init", "map_", "promote", "rebalance", "schema"]


@click.command()
@config_option
@click.option("--shards", "shard_text", help="Only these shards, A-B (default: all).")
def init(config_path: Path | None, shard_text: str | None) -> None:
    """Create every shard database and table on its master (idempotent)."""
    from store.admin import init_shards

    config = load_config(config_path)
    wanted = parse_shards(shard_text, config.shards) or range(config.shards)
    log = admin_log("init")
    log.info("init: starting", extra={"fields": {"shards": f"{wanted.start}-{wanted.stop - 1}"}})
    with progress_bar(len(wanted), "shards") as step:
        report = init_shards(config, shards=wanted, on_shard=lambda _s: step(1))
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


@click.command()
@config_option
@click.option("--full", is_flag=True, help="Check every list's count and every pair's inverse, not a sample.")
@click.option(
    "--sample",
    default=200,
    show_default=True,
    type=click.IntRange(min=0),
    help="Lists and pairs checked per relation and shard.",
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

    with open_admin(config_path) as store:
        shards = store.config.shards
        with progress_bar(shards, "shards") as step:
            report = check_store(store, full=full, sample=sample, on_shard=lambda _s: step(1))
    if result_file is not None:
        save_report(report, result_file)
        admin_log("check").info("check: result kept", extra={"fields": {"file": str(result_file)}})
    if as_json:
        echo_json(report.as_dict())
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


@click.command()
@config_option
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
    from store.ids import INSTAGRAM, PINTEREST
    from store.schema import render_shard_sql

    config = load_config(config_path)
    layout = PINTEREST if config.ids == "pinterest" else INSTAGRAM
    top = next(seg.max for seg in layout.segments if seg.name == "shard_id")
    if not 0 <= shard <= top:
        raise IdError(f"--shard {shard} must lie within 0-{top} (the shard numbers of {config.ids} IDs)")
    click.echo(render_shard_sql(backend, shard, config), nl=False)


@click.group("map")
def map_() -> None:
    """Inspect the shard map."""


@map_.command("show")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def map_show(config_path: Path | None, as_json: bool) -> None:
    """List shard ranges, their hosts and the map version (live, from map_source if configured)."""
    config = load_config(config_path)
    m = _live_map(config)
    if as_json:
        rows = [
            {"range": [r.start, r.end], "shards": len(r), "master": r.master, "slave": r.slave}
            for r in m.ranges
        ]
        echo_json({"version": m.version, "shards": m.shards, "ranges": rows})
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
@config_option
@click.option("--from", "from_version", type=int, help="Older version (default: the one before --to).")
@click.option("--to", "to_version", type=int, help="Newer version (default: the current one).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def map_diff(
    config_path: Path | None, from_version: int | None, to_version: int | None, as_json: bool
) -> None:
    """Show which shard spans changed master between two map versions (table map source)."""
    from store.mapsource import TableMapSource

    config = load_config(config_path)
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
        echo_json({"from": old_v, "to": new_v, "changes": [list(c) for c in changes]})
        return
    click.echo(f"map version {old_v} -> {new_v}: {len(changes)} span(s) changed master")
    for first, last, a, b in changes:
        click.echo(f"  shards {first}-{last}: {a} -> {b}")


@click.command()
@config_option
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
    from store.mapsource import require_changeable

    log = admin_log("rebalance")

    def say(msg: str) -> None:
        click.echo(msg)

    if cleanup:
        if hosts_text is not None or dry_run or resume:
            raise ConfigError("store rebalance --cleanup takes only --journal (and --config)")
        with open_admin(config_path) as store:
            dropped = cleanup_rebalance(store, journal, say)
        click.echo(f"dropped: {len(dropped)} archive database(s)")
        return
    if resume:
        if hosts_text is not None or dry_run:
            raise ConfigError("store rebalance --resume takes the plan from its journal: give no --hosts")
        with open_admin(config_path) as store, move_output() as (say_, watch):
            run_rebalance(store, None, journal, say_, watch)
        return
    if hosts_text is None:
        raise ConfigError("store rebalance needs --hosts H1,H2,... (or --resume)")
    hosts = list(dict.fromkeys(h.strip() for h in hosts_text.split(",") if h.strip()))
    if not hosts:
        raise ConfigError(f"--hosts takes host names separated by commas, got {hosts_text!r}")
    with open_admin(config_path) as store:
        store.refresh_map(force=True)
        m = store.shard_map
        check_hosts(store.config, hosts, m)
        # A dry run refuses what the real run would: a plan that cannot run is not printed.
        require_changeable(store.map_source, "a rebalance")
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
        with move_output() as (say_, watch):
            run_rebalance(store, plan, journal, say_, watch)


@click.command()
@config_option
@click.option("--shards", "shard_text", required=True, help="The range whose slave becomes master, A-B.")
@click.option(
    "--force",
    is_flag=True,
    help="Promote even if the master may be up or the slave may lack writes (they are lost); warns.",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def promote(config_path: Path | None, shard_text: str, force: bool, yes: bool) -> None:
    """After a master dies: make its slave the master of shards A-B in the live map.

    The slave is a MariaDB/MySQL replica or a PostgreSQL streaming standby. Refused while the
    master answers, or while the slave is not replicating or has not applied all it received.
    """
    from store.admin.promote import promote as run_promote

    with open_admin(config_path) as store:
        wanted = parse_shards(shard_text, store.config.shards)
        assert wanted is not None
        if not yes:
            click.confirm(f"promote the slave of shards {shard_text}?", abort=True)
        log = admin_log("promote")
        log.info("promote: starting", extra={"fields": {"shards": shard_text, "force": force}})

        def say(msg: str) -> None:
            log.info(msg, extra={"fields": {"shards": shard_text}})
            click.echo(msg)

        run_promote(store, wanted.start, wanted.stop - 1, force=force, say=say)


@click.command()
@config_option
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

    config = load_config(config_path)
    plan = grant_plan(config, app_user, app_host)
    admin_log("grants").info(
        "grants: planned", extra={"fields": {"servers": len(plan), "app_user": app_user, "apply": apply_}}
    )
    if not plan:
        click.echo("-- no server here has accounts (SQLite): protect the shard files with file permissions")
        return
    if apply_:

        def granted(server: str) -> None:
            admin_log("grants").info("grants: applied", extra={"fields": {"server": server}})
            click.echo(f"granted on {server}")

        ran = apply_grants(plan, app_user, app_host, on_server=granted)
        click.echo(f"{ran} statements on {len(plan)} server(s)")
        return
    for g in plan:
        hosts = f" (hosts {', '.join(g.hosts)})" if g.hosts else " (the shard map table)"
        click.echo(f"-- {g.server}{hosts}: {len(g.statements)} statements")
        for stmt in g.statements:
            click.echo(stmt + ";")
