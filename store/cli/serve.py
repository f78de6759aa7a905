"""`store serve`: the operator page (`store.serve`)."""

from __future__ import annotations

from pathlib import Path

import click

from store.cli.common import config_option, open_admin
from store.exceptions import ConfigError

__all__ = ["serve"]


@click.command()
@config_option
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (others need --token)."
)
@click.option(
    "--port", default=8080, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on."
)
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
    _check_free(host, port)
    with open_admin(config_path) as store:
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


def _check_free(host: str, port: int) -> None:
    """`ConfigError` if nothing can listen on ``host``:``port`` (in use, or not this machine's address)."""
    import socket

    try:
        family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
            sock.bind(address)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port (or --host)"
        ) from None
