"""TLS settings read from a host URL's query parameters (MariaDB and PostgreSQL).

MariaDB (``mysql+pymysql://`` and ``mysql+mysqldb://``)::

    mysql+pymysql://app@db1:3306?ssl_ca=/etc/store/ca.pem&ssl_cert=/etc/store/client.pem
        &ssl_key=/etc/store/client-key.pem

``ssl_ca``, ``ssl_cert`` and ``ssl_key`` name PEM files; ``ssl``,
``ssl_verify_cert`` and ``ssl_verify_identity`` are booleans (true, false, 1
or 0). Any of them but ``ssl=false`` turns TLS on, and then a server that
offers no TLS is refused. With ``ssl_ca`` the server's certificate must chain
to it and carry the URL's host name, unless ``ssl_verify_identity=false``
(the chain alone) or ``ssl_verify_cert=false`` (nothing); see `MySQLTLS`.

PostgreSQL (psycopg): ``sslmode``, ``sslrootcert``, ``sslcert`` and ``sslkey``,
passed to libpq; see `postgres_tls`.

Relative file names are taken from the config file's folder when the URL
is a host of the config (`store.backends.Backend.check_url`). Parse errors
are `ConfigError`s that name the parameter, never the URL (it may hold a
password).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL

from store.exceptions import ConfigError

__all__ = [
    "MYSQL_TLS_PARAMS",
    "MYSQL_URL_PARAMS",
    "POSTGRES_SSLMODES",
    "POSTGRES_URL_PARAMS",
    "MySQLTLS",
    "absolute_files",
    "mysql_ssl_context",
    "mysql_tls",
    "parse_bool",
    "postgres_tls",
]

#: The TLS parameters of a MariaDB URL.
MYSQL_TLS_PARAMS = ("ssl", "ssl_ca", "ssl_cert", "ssl_key", "ssl_verify_cert", "ssl_verify_identity")
#: Every query parameter a MariaDB URL may carry.
MYSQL_URL_PARAMS = frozenset({"unix_socket", *MYSQL_TLS_PARAMS})
_MYSQL_FILES = ("ssl_ca", "ssl_cert", "ssl_key")

#: libpq's sslmode values, weakest first.
POSTGRES_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: Every query parameter a PostgreSQL URL may carry.
POSTGRES_URL_PARAMS = frozenset({"sslmode", "sslrootcert", "sslcert", "sslkey"})
_POSTGRES_FILES = ("sslrootcert", "sslcert", "sslkey")
# Modes that may fall back to (or stay on) an unencrypted connection.
_PG_WEAK = frozenset({"disable", "allow", "prefer"})

_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})


def parse_bool(name: str, value: str) -> bool:
    """``true``/``1`` or ``false``/``0`` (any case); `ConfigError` naming ``name`` otherwise."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"URL parameter {name} must be true, false, 1 or 0, got {value!r}")


def _single(query: Mapping[str, str | Sequence[str]], known: frozenset[str], what: str) -> dict[str, str]:
    """The query as name -> value; `ConfigError` for an unknown name or one given twice."""
    unknown = sorted(set(query) - known)
    if unknown:
        raise ConfigError(
            f"unknown {what} URL parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    out: dict[str, str] = {}
    for name, value in query.items():
        if not isinstance(value, str):
            raise ConfigError(f"URL parameter {name} is given {len(value)} times; give it once")
        if not value:
            raise ConfigError(f"URL parameter {name} is empty")
        out[name] = value
    return out


def _file(name: str, value: str) -> str:
    """``value``, a path; `ConfigError` unless it names a file this user can read."""
    path = Path(value)
    if not path.is_file():
        raise ConfigError(f"URL parameter {name}: no such file {str(path)!r}")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"URL parameter {name}: file {str(path)!r} is not readable by this user")
    return value


def _private_key(path: str) -> None:
    """libpq's rule for a client key: 0600 or less if the user's own, 0640 or less if root's."""
    info = os.stat(path)
    if info.st_uid == os.geteuid():
        allowed = 0o600
    elif info.st_uid == 0:
        allowed = 0o640
    else:
        raise ConfigError(f"URL parameter sslkey: libpq takes only a key file of this user or root, {path!r}")
    if info.st_mode & 0o777 & ~allowed:
        raise ConfigError(
            f"URL parameter sslkey: libpq refuses {path!r}, which others may read: chmod {allowed:o} it"
        )


def absolute_files(url: URL, base: Path) -> URL:
    """``url`` with the relative file names of its TLS parameters taken from ``base``.

    The file parameters are MariaDB's ``ssl_ca``, ``ssl_cert`` and ``ssl_key`` and
    PostgreSQL's ``sslrootcert`` (but ``system``), ``sslcert`` and ``sslkey``; ``~`` is
    expanded. Nothing else is checked here.
    """
    changed: dict[str, str] = {}
    for name in (*_MYSQL_FILES, *_POSTGRES_FILES):
        value = url.query.get(name)
        if not isinstance(value, str) or not value or (name == "sslrootcert" and value == "system"):
            continue
        path = Path(value).expanduser()
        path = path if path.is_absolute() else base / path
        if str(path) != value:
            changed[name] = str(path)
    return url.update_query_dict(changed) if changed else url


@dataclass(frozen=True)
class MySQLTLS:
    """The TLS settings of a MariaDB URL.

    ``required``: TLS is on (any ``ssl*`` parameter but ``ssl=false``); a
    server that offers none is refused. ``disabled``: ``ssl=false``, TLS never
    used. Neither: no parameter given, the driver's default.

    ``verify_cert`` (``ssl_verify_cert``, default true when ``ssl_ca`` is
    given): the server's certificate must chain to ``ssl_ca`` (to the
    system's trusted CAs if ``ssl_ca`` is not given). ``verify_identity``
    (``ssl_verify_identity``, default: as ``verify_cert``): the certificate
    must also carry the URL's host name or IP address. ``ssl=true`` alone
    encrypts without checking who answers: weak, it stops only a passive
    eavesdropper. ``ca`` is None when the certificate is not verified.
    """

    required: bool = False
    disabled: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    verify_cert: bool = False
    verify_identity: bool = False


def mysql_tls(url: URL) -> MySQLTLS:
    """The TLS settings of the MariaDB URL ``url``; `ConfigError` naming the parameter if they are wrong.

    Refuses query parameters other than `MYSQL_URL_PARAMS`, a parameter given
    twice, a boolean that is not true/false/1/0, a file that does not exist
    or cannot be read (a relative name is taken from the working folder:
    see `absolute_files`), and contradictions: ``ssl=false`` with another
    ``ssl_*`` parameter, ``ssl_verify_identity=true`` with
    ``ssl_verify_cert=false``, ``ssl_key`` without ``ssl_cert``, and a
    certificate to verify without its name (``ssl_verify_identity=false``)
    but with no ``ssl_ca`` to verify it against (MariaDB's clients check
    the system's CAs only together with the name).
    """
    query = _single(url.query, MYSQL_URL_PARAMS, "MariaDB")
    given = {k: v for k, v in query.items() if k in MYSQL_TLS_PARAMS}
    if not given:
        return MySQLTLS()
    flags = {
        k: parse_bool(k, given[k]) for k in ("ssl", "ssl_verify_cert", "ssl_verify_identity") if k in given
    }
    files = {k: _file(k, given[k]) for k in _MYSQL_FILES if k in given}
    if flags.get("ssl") is False:
        if len(given) > 1:
            others = ", ".join(sorted(set(given) - {"ssl"}))
            raise ConfigError(f"URL parameter ssl=false turns TLS off, but {others} asks for it")
        return MySQLTLS(disabled=True)
    if "ssl_key" in files and "ssl_cert" not in files:
        raise ConfigError("URL parameter ssl_key needs ssl_cert (the client certificate it belongs to)")
    ca = files.get("ssl_ca")
    identity_flag = flags.get("ssl_verify_identity")
    verify_cert = flags.get("ssl_verify_cert", ca is not None or identity_flag is True)
    verify_identity = verify_cert if identity_flag is None else identity_flag
    if verify_identity and not verify_cert:
        raise ConfigError(
            "URL parameter ssl_verify_identity=true checks the name of a certificate that "
            "ssl_verify_cert=false does not check: drop one of them"
        )
    if verify_cert and not verify_identity and ca is None:
        raise ConfigError(
            "URL parameter ssl_verify_cert=true without ssl_verify_identity needs ssl_ca "
            "(the CA file to check the server's certificate against)"
        )
    return MySQLTLS(
        required=True,
        ca=ca if verify_cert else None,
        cert=files.get("ssl_cert"),
        key=files.get("ssl_key"),
        verify_cert=verify_cert,
        verify_identity=verify_identity,
    )


def mysql_ssl_context(tls: MySQLTLS) -> ssl.SSLContext:
    """A client `ssl.SSLContext` for ``tls`` (PyMySQL's ``ssl=``): TLS 1.2 or later.

    Raises `OSError` or `ssl.SSLError` if a file cannot be read or loaded.
    X.509 strict mode stays off, as in PyMySQL and MariaDB's own clients
    (many private CAs predate it).
    """
    if tls.verify_cert:
        ctx = ssl.create_default_context(cafile=tls.ca)  # the system's CAs when ca is None
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT
    ctx.check_hostname = tls.verify_identity
    ctx.verify_mode = ssl.CERT_REQUIRED if tls.verify_cert else ssl.CERT_NONE
    if tls.cert is not None:
        ctx.load_cert_chain(tls.cert, keyfile=tls.key)
    return ctx


def postgres_tls(url: URL) -> dict[str, str]:
    """libpq's TLS keywords from the PostgreSQL URL ``url``; `ConfigError` naming the parameter if wrong.

    ``sslmode`` is one of `POSTGRES_SSLMODES`. ``sslrootcert`` (a CA file,
    or ``system`` for the system's CAs), ``sslcert`` and ``sslkey`` (the
    client certificate and its key, given together) name files that must
    exist (relative names: see `absolute_files`). Without
    ``sslmode``, a URL with ``sslrootcert`` gets ``verify-full`` and one with
    only a client certificate ``require`` (libpq's default, ``prefer``, would
    fall back to an unencrypted connection); naming files together with
    ``sslmode`` disable, allow or prefer is refused for that reason. (libpq
    checks ``require`` with a ``sslrootcert`` as ``verify-ca``.) A client key
    others may read is refused, as libpq would. Without any parameter the
    result is empty: libpq's defaults (and ``PGSSLMODE``) apply.
    """
    query = _single(url.query, POSTGRES_URL_PARAMS, "PostgreSQL")
    out: dict[str, str] = {}
    mode = query.get("sslmode")
    if mode is not None and mode not in POSTGRES_SSLMODES:
        raise ConfigError(
            f"URL parameter sslmode must be one of {', '.join(POSTGRES_SSLMODES)}, got {mode!r}"
        )
    if ("sslcert" in query) != ("sslkey" in query):
        raise ConfigError(
            "URL parameters sslcert and sslkey go together (the client certificate and its key)"
        )
    for name in _POSTGRES_FILES:
        if name in query:
            value = query[name]
            out[name] = value if name == "sslrootcert" and value == "system" else _file(name, value)
    if "sslkey" in out:
        _private_key(out["sslkey"])
    if out:
        if mode is None:
            mode = "verify-full" if "sslrootcert" in out else "require"
        elif mode in _PG_WEAK:
            raise ConfigError(
                f"URL parameter sslmode={mode} may connect without TLS, which makes "
                f"{', '.join(sorted(out))} pointless: use require, verify-ca or verify-full"
            )
        if out.get("sslrootcert") == "system" and mode != "verify-full":
            raise ConfigError("URL parameter sslrootcert=system needs sslmode=verify-full (libpq's rule)")
    if mode is not None:
        out["sslmode"] = mode
    return out
