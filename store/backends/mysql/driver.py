"""MariaDB / MySQL drivers: opening a connection with PyMySQL or mysqlclient, and TLS on it.

`mysql_connector` makes the function that opens one connection to a host
(timeouts, TLS from the URL's query, the store's own cursor and connection
classes on PyMySQL: `store.backends.mysql.pymysql_fast`);
`mysql_driver_error` names the driver's error class. What a MariaDB shard
holds, and what the store does to it, is `store.backends.mysql.dialect`'s
and `store.backends.mysql.admin`'s.
"""

from __future__ import annotations

import importlib
import math
import ssl
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from sqlalchemy.engine import URL

from store.backends.mysql import pymysql_fast
from store.exceptions import ConfigError
from store.green import active as on_the_loop
from store.green import connect_tcp
from store.tls import MySQLTLS, mysql_ssl_context, mysql_tls

__all__ = ["CONNECT_TIMEOUT_S", "READ_TIMEOUT_S", "mysql_connector", "mysql_driver_error"]

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
# URL driver name -> (module to import, the package that provides it).
_DRIVERS = {"pymysql": ("pymysql", "pymysql"), "mysqldb": ("MySQLdb", "mysqlclient")}


def _mysql_driver(url: URL) -> tuple[str, Any]:
    """(driver name, its imported module); `ConfigError` if the driver is unknown or not installed."""
    driver = url.get_driver_name() if "+" in url.drivername else "pymysql"
    if driver not in _DRIVERS:
        raise ConfigError(f"unsupported MariaDB driver {driver!r}; use mysql+pymysql or mysql+mysqldb")
    module, package = _DRIVERS[driver]
    try:
        return driver, importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{url.drivername}:// URLs need the {module} module, which cannot be imported ({exc}): "
            f"pip install {package}"
        ) from None


def mysql_driver_error(url: URL) -> type[Exception]:
    """The base class of the errors ``url``'s driver raises (to tell them from bugs)."""
    error: type[Exception] = _mysql_driver(url)[1].Error
    return error


def mysql_connector(
    url: URL,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    query_timeout_s: float = READ_TIMEOUT_S,
    setup: str | None = None,
    multi_statements: bool = False,
) -> Callable[[], Any]:
    """A function that opens an autocommit, utf8mb4 DBAPI connection to ``url``.

    Opening it waits at most ``connect_timeout_s``; each read or write of a
    reply at most ``query_timeout_s`` (then the connection is lost to the
    caller). ``setup`` is a statement run on every new connection. Both
    drivers are opened alike: neither sets CLIENT.FOUND_ROWS, so ``rowcount``
    counts changed rows on both (a no-op ``ON DUPLICATE KEY UPDATE`` reports
    0), and neither allows several statements in one ``execute`` unless
    ``multi_statements``.

    TLS comes from the URL's query (`store.tls.mysql_tls`). When it is on, a
    server that offers no TLS is refused with the driver's error 2026, as is
    a certificate that fails verification. PyMySQL refuses before it logs in.
    mysqlclient (MariaDB Connector/C) does so only with ``ssl_verify_identity``;
    otherwise it may log in unencrypted and the connection is closed at once,
    before any statement: the login exchange may have crossed in the clear.
    PyMySQL connections get the store's cursor and connection classes
    (`store.backends.mysql.pymysql_fast`), or the driver's own where its internals
    are not what those classes were tested with.
    `ConfigError` if the URL's driver is not installed or its query is wrong.
    """
    driver, module = _mysql_driver(url)
    tls = mysql_tls(url)

    def whole(seconds: float) -> float:
        return max(1, math.ceil(seconds)) if driver == "mysqldb" else seconds  # mysqlclient: whole seconds

    kwargs: dict[str, Any] = {
        "host": url.host or "127.0.0.1",
        "port": url.port or 3306,
        "user": url.username or "root",
        "password": url.password or "",
        "charset": "utf8mb4",
        "autocommit": True,
        "connect_timeout": whole(connect_timeout_s),
        "read_timeout": whole(query_timeout_s),
        "write_timeout": whole(query_timeout_s),
        # The inverse-pair protocol relies on InnoDB locking the gap of an
        # absent key, which READ COMMITTED (a common server default) skips.
        "init_command": "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    }
    if "unix_socket" in url.query:
        kwargs["unix_socket"] = url.query["unix_socket"]
    if driver == "mysqldb":
        kwargs.update(_mysqldb_tls(tls))
        # mysqlclient turns on CLIENT.MULTI_STATEMENTS, and libmariadb LOAD DATA LOCAL,
        # by default; PyMySQL does neither.
        kwargs["multi_statements"] = multi_statements
        kwargs["local_infile"] = 0
    else:
        kwargs["cursorclass"] = pymysql_fast.cursor_class(module)
        if multi_statements:
            from pymysql.constants import CLIENT

            kwargs["client_flag"] = CLIENT.MULTI_STATEMENTS

    def connect() -> Any:
        if driver == "mysqldb":
            conn = module.connect(**kwargs)
            if tls.required:
                _require_mysqldb_tls(conn, module)
        elif tls.required:
            conn = module.connect(**kwargs, ssl=_pymysql_context(tls, module))
        elif tls.disabled:
            conn = module.connect(**kwargs, ssl_disabled=True)
        elif on_the_loop() and "unix_socket" not in kwargs:
            # Inside an event loop's call (`store.green`): a socket whose waits are the loop's.
            conn = pymysql_fast.connection_class(module)(**kwargs, defer_connect=True)
            try:
                sock = connect_tcp(kwargs["host"], kwargs["port"], kwargs["connect_timeout"])
            except OSError as exc:
                raise module.OperationalError(
                    2003, f"Can't connect to MySQL server on {kwargs['host']!r} ({exc})"
                ) from exc
            conn.host_info = f"socket {kwargs['host']}:{kwargs['port']}"
            conn.connect(sock)
        else:
            conn = pymysql_fast.connection_class(module)(**kwargs)
        if driver == "pymysql":
            pymysql_fast.adopt(conn, module)
        if setup is not None:
            try:
                cur = conn.cursor()
                cur.execute(setup)
                cur.close()
            except BaseException:
                with suppress(Exception):
                    conn.close()
                raise
        return conn

    return connect


def _load_tls_files(tls: MySQLTLS) -> None:
    """Load ``tls``'s CA, certificate and key once; `ConfigError` if they are not usable PEM."""
    if tls.required:
        try:
            mysql_ssl_context(tls)
        except (OSError, ssl.SSLError) as exc:
            names = [n for n, f in (("ssl_ca", tls.ca), ("ssl_cert", tls.cert), ("ssl_key", tls.key)) if f]
            raise ConfigError(
                f"URL parameter(s) {', '.join(names)}: the files cannot be loaded ({exc})"
            ) from None


def _pymysql_context(tls: MySQLTLS, module: Any) -> ssl.SSLContext:
    """PyMySQL's ``ssl=``, made for each connection (so renewed files are read); a file that
    cannot be loaded is the driver's error 2026, like mysqlclient's."""
    try:
        return mysql_ssl_context(tls)
    except (OSError, ssl.SSLError) as exc:
        raise module.OperationalError(2026, f"TLS setup failed: {exc}") from exc


def _mysqldb_tls(tls: MySQLTLS) -> dict[str, Any]:
    """mysqlclient's TLS arguments.

    With MariaDB Connector/C, ``ssl_mode`` VERIFY_CA and VERIFY_IDENTITY both
    check the chain and the name, and only they refuse a server without TLS
    before logging in; REQUIRED turns TLS on but lets such a server through
    (`_require_mysqldb_tls` closes that connection). A CA passed in ``ssl``
    is always checked against, so it is passed only when the certificate is
    to be verified.
    """
    if tls.disabled:
        return {"ssl_mode": "DISABLED"}
    if not tls.required:
        return {}
    files = {"ca": tls.ca, "cert": tls.cert, "key": tls.key}
    out: dict[str, Any] = {"ssl_mode": "VERIFY_IDENTITY" if tls.verify_identity else "REQUIRED"}
    if any(files.values()):
        out["ssl"] = {k: v for k, v in files.items() if v is not None}
    return out


def _require_mysqldb_tls(conn: Any, module: Any) -> None:
    """Close ``conn`` and raise error 2026 unless it is encrypted (by the flags the client saw)."""
    flag = 2048  # CLIENT.SSL
    if conn.server_capabilities & flag and conn.client_flag & flag:
        return
    with suppress(Exception):
        conn.close()
    raise module.OperationalError(2026, "TLS/SSL error: SSL is required, but the server does not support it")
