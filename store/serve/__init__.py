"""`store serve`: the operator page (live map, hosts, caches, a running move, the last check).

Needs the ``serve`` extra (Starlette and Uvicorn): ``pip install 'shardstore[serve]'``.
Binds 127.0.0.1 unless told otherwise; any other address needs a token.
"""

from __future__ import annotations

import logging
from pathlib import Path

from store.exceptions import ConfigError
from store.store import Store

__all__ = ["LOCAL_HOSTS", "check_bind", "serve"]

log = logging.getLogger("store.admin.serve")

#: Addresses that only this machine reaches: no token needed there.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_bind(host: str, token: str | None) -> None:
    """Refuse to bind ``host`` beyond this machine without a token (`ConfigError` saying what to do)."""
    if host not in LOCAL_HOSTS and not token:
        raise ConfigError(
            f"store serve will not listen on {host} without a token: the page shows every host of the "
            "store; give --token SECRET (or STORE_SERVE_TOKEN), or keep the default 127.0.0.1"
        )


def serve(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    token: str | None = None,
    journal: str | Path | None = None,
    check_file: str | Path | None = None,
    metrics: bool = False,
) -> None:
    """Run the page over ``store`` until interrupted (Uvicorn, one process)."""
    check_bind(host, token)
    import uvicorn

    from store.serve.app import build_app
    from store.serve.panels import Panels

    render = None
    if metrics:
        from store.metrics import Metrics, instrument

        m = instrument(store, Metrics(move_journal=journal))
        render = m.render
    app = build_app(Panels(store, journal=journal, check_file=check_file), token=token, metrics=render)
    log.info(
        "serve: listening on http://%s:%d/",
        host,
        port,
        extra={"fields": {"host": host, "port": port, "metrics": metrics, "token": bool(token)}},
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
