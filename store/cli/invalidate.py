"""`store invalidate`: the invalidation daemon (`store.invalidate`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from store.cli.common import config_option, load_config

__all__ = ["invalidate"]


@click.command()
@config_option
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
    help="Start each binlog at its end instead of the saved position, and make each WAL slot anew "
    "(entries are trusted from the start on, as after any gap; a takeover later resumes).",
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

    daemon = Daemon(load_config(path=config_path), hosts=host_names, from_now=from_now)
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
