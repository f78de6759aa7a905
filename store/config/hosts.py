"""The ``hosts:`` section and everything else that names a server or a secret.

Host URLs (with ``password_env`` / ``password_file`` and the ``STORE_HOST_*``
overrides), admin URLs, ``replication_host``, ``map_source``, the cursor
secret, and the TLS files of MariaDB URLs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from store.backends import backend_for, backend_named, backend_names
from store.config.checks import _ENV_NAME, _HOST_NAME, _host_port, _keys
from store.exceptions import ConfigError, brief


def host_env_var(host: str) -> str:
    """The environment variable that overrides ``host``'s URL."""
    return "STORE_HOST_" + re.sub(r"[^A-Za-z0-9]", "_", host).upper()


def admin_host_env_var(host: str) -> str:
    """The environment variable that overrides ``host``'s admin URL."""
    return "STORE_ADMIN_HOST_" + re.sub(r"[^A-Za-z0-9]", "_", host).upper()


_HOST_KEYS = frozenset({"url", "password_env", "password_file", "admin"})
_CREDENTIAL_KEYS = frozenset({"url", "password_env", "password_file"})
#: Keys of a ``hosts:`` entry: the credentials, ``admin`` and where replicas reach the server.
_HOST_ENTRY_KEYS = _HOST_KEYS | {"replication_host"}
_REPLICATION_HOST = re.compile(
    r"^(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9_.\-]{1,253}))(?::(?P<port>[0-9]{1,5}))?$"
)


def _replication_host(raw: object, where: str, url: URL) -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT`` or ``[IPv6]:PORT``: where a replica reaches this server."""
    shape = (
        f"{where} must be HOST or HOST:PORT, the address a replica uses to reach this server "
        "(e.g. mariadb-a or mariadb-a:3306; [::1]:3306 for IPv6)"
    )
    if backend_for(url).made_on_first_use:
        raise ConfigError(
            f"{where} is for MariaDB and PostgreSQL hosts: a {url.get_backend_name()} host has no replicas"
        )
    match = _REPLICATION_HOST.fullmatch(raw) if isinstance(raw, str) else None
    if match is None:
        raise ConfigError(f"{shape}, got {brief(raw)}")
    port = None if match["port"] is None else int(match["port"])
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"{where} has port {port}, outside 1..65535")
    return match["ip6"] or match["name"], port


def _hosts(
    raw: object, env: Mapping[str, str], base: Path
) -> tuple[dict[str, URL], dict[str, URL], dict[str, tuple[str, int | None]]]:
    """Each host's application URL, admin URL (the same where no ``admin`` is given), replication_host."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(
            "hosts must map host names to SQLAlchemy URLs, "
            "e.g. {MySQL001A: 'mysql+pymysql://root@127.0.0.1:3306'}"
        )
    app: dict[str, URL] = {}
    admin: dict[str, URL] = {}
    replication: dict[str, tuple[str, int | None]] = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not _HOST_NAME.fullmatch(name):
            raise ConfigError(
                "host names under hosts must be 1-64 letters, digits, '_', '.' or '-' "
                f"(a tombstone records them), got {brief(name)}"
            )
        where = f"hosts.{name}"
        admin_entry: object = None
        replication_entry: object = None
        if isinstance(entry, Mapping):
            extra = set(entry) - _HOST_ENTRY_KEYS
            if extra:
                raise ConfigError(
                    f"{where} has unknown key(s) {_keys(extra)}; known: {_keys(_HOST_ENTRY_KEYS)}"
                )
            admin_entry = entry.get("admin")
            replication_entry = entry.get("replication_host")
            entry = {k: v for k, v in entry.items() if k != "replication_host"}
        url = _credentialed_url(entry, where, env.get(host_env_var(name)), env, base)
        app[name] = _checked(name, url, base)
        if replication_entry is not None:
            replication[name] = _replication_host(replication_entry, f"{where}.replication_host", app[name])
        if admin_entry is None:
            admin_url = env.get(admin_host_env_var(name))
            admin[name] = (
                app[name] if admin_url is None else _checked(name, _parse_url(admin_url, where), base)
            )
        else:
            if isinstance(admin_entry, Mapping) and "admin" in admin_entry:
                raise ConfigError(f"{where}.admin cannot itself have an admin")
            url = _credentialed_url(
                admin_entry, f"{where}.admin", env.get(admin_host_env_var(name)), env, base
            )
            admin[name] = _checked(name, url, base)
            if backend_for(admin[name]) is not backend_for(app[name]):
                raise ConfigError(f"{where}.admin must name the same kind of server as {where}.url")
    return app, admin, replication


def _checked(name: str, url: URL, base: Path) -> URL:
    try:
        backend = backend_for(url)
    except ConfigError as exc:
        raise ConfigError(f"hosts.{name}: {exc}") from None
    return backend.check_url(name, url, base)


def _parse_url(text: object, where: str) -> URL:
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{where} must be a URL string, got {type(text).__name__}")
    try:
        return make_url(text)
    except ArgumentError:
        # The text may hold a password: name the key, never echo the value.
        raise ConfigError(
            f"{where} is not a valid SQLAlchemy URL (dialect+driver://user@host:port)"
        ) from None


def _credentialed_url(
    entry: object, where: str, override: str | None, env: Mapping[str, str], base: Path
) -> URL:
    """A URL from ``URL`` or ``{url, password_env | password_file}``, the password filled in.

    ``override`` (an environment variable's value) replaces the URL text. A
    password is given once: in the URL, or by ``password_env`` (the name of
    an environment variable), or by ``password_file`` (a file holding it; one
    trailing newline is dropped; relative to the config's folder).
    """
    if isinstance(entry, str):
        return _parse_url(override or entry, where)
    if not isinstance(entry, Mapping):
        raise ConfigError(
            f"{where} must be a URL string or a mapping {{url: URL, password_env: VAR}} / "
            f"{{url: URL, password_file: PATH}}, got {type(entry).__name__}"
        )
    extra = set(entry) - _CREDENTIAL_KEYS - {"admin"}
    if extra:
        raise ConfigError(f"{where} has unknown key(s) {_keys(extra)}; known: {_keys(_CREDENTIAL_KEYS)}")
    if "url" not in entry and override is None:
        raise ConfigError(f"{where} needs url: the SQLAlchemy URL, without its password")
    url = _parse_url(override or entry["url"], f"{where}.url")
    sources = [k for k in ("password_env", "password_file") if entry.get(k) is not None]
    if not sources:
        return url
    if len(sources) > 1 or url.password is not None:
        raise ConfigError(
            f"{where} gives its password more than once; keep one of the URL's password, "
            "password_env and password_file"
        )
    key = sources[0]
    password = read_secret(f"{where}.{key}", entry[key], from_file=key == "password_file", env=env, base=base)
    if not password:
        raise ConfigError(f"{where}.{key} gives an empty password; leave the key out for none")
    return url.set(password=password)


def read_secret(where: str, ref: object, *, from_file: bool, env: Mapping[str, str], base: Path) -> str:
    """The secret a ``*_env`` key (``ref`` names an environment variable) or a ``*_file`` key (``ref``
    is a path, relative to ``base``: one trailing newline is dropped) points at; ``where`` is the key."""
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{where} must be a non-empty string, got {type(ref).__name__}")
    if not from_file:
        if not _ENV_NAME.fullmatch(ref):
            raise ConfigError(f"{where} must name an environment variable (A-Z, 0-9, _), got {brief(ref)}")
        secret = env.get(ref)
        if secret is None:
            other = where[: -len("_env")] + "_file" if where.endswith("_env") else "a file"
            raise ConfigError(f"{where} names ${ref}, which is not set: export it or use {other}")
        return secret
    path = Path(ref)
    path = path if path.is_absolute() else base / path
    try:
        secret = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{where}: cannot read {path}: {why}") from None
    secret = secret[:-1] if secret.endswith("\n") else secret
    return secret[:-1] if secret.endswith("\r") else secret


#: The config's keys that give the secret page cursors are signed with (one at most).
CURSOR_SECRET_KEYS = ("cursor_secret", "cursor_secret_env", "cursor_secret_file")
#: The shortest cursor secret accepted, in bytes (UTF-8).
MIN_CURSOR_SECRET_BYTES = 16


def _cursor_secret(raw: Mapping[str, Any], env: Mapping[str, str], base: Path) -> bytes | None:
    """The secret of ``cursor_secret``, ``cursor_secret_env`` or ``cursor_secret_file`` (None: unsigned)."""
    given = [k for k in CURSOR_SECRET_KEYS if raw.get(k) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ConfigError(
            f"{', '.join(given)} given together: keep exactly one of cursor_secret, "
            "cursor_secret_env (an environment variable's name) and cursor_secret_file (a file's path)"
        )
    key = given[0]
    if key == "cursor_secret":
        secret = raw[key]
        if not isinstance(secret, str):
            raise ConfigError(f"cursor_secret must be a string, got {type(secret).__name__}")
    else:
        secret = read_secret(key, raw[key], from_file=key == "cursor_secret_file", env=env, base=base)
    data = secret.encode("utf-8")
    if len(data) < MIN_CURSOR_SECRET_BYTES:
        # Never echo the secret: say how long it is and how long it must be.
        raise ConfigError(
            f"{key} gives a secret of {len(data)} bytes; page cursors need at least "
            f"{MIN_CURSOR_SECRET_BYTES} (e.g. the output of `openssl rand -base64 32`)"
        )
    return data


_MapSource = tuple[tuple[str, str] | None, float, tuple[URL, URL] | None]


def _map_source(raw: object, env: Mapping[str, str], base: Path) -> _MapSource:
    if raw is None:
        return None, 1.0, None
    kinds = {"file", "table", "zookeeper"}
    if not isinstance(raw, Mapping) or len(set(raw) & kinds) != 1 or set(raw) - kinds - {"poll_s"}:
        raise ConfigError(
            "map_source must be {file: PATH}, {table: mysql+pymysql://HOST:3306, poll_s: 1} or "
            "{zookeeper: HOST:2181[,HOST:2181]}: where running stores read the live shard map"
        )
    poll = raw.get("poll_s", 1.0)
    if not isinstance(poll, int | float) or not 0 < poll <= 3600:
        raise ConfigError(f"map_source.poll_s must be a number of seconds in (0, 3600], got {brief(poll)}")
    if "zookeeper" in raw:
        hosts = raw["zookeeper"]
        if not isinstance(hosts, str) or not all(_host_port(h) for h in hosts.split(",")):
            raise ConfigError(
                f"map_source.zookeeper must be host:port[,host:port...] (port 1-65535), got {brief(hosts)}"
            )
        return ("zookeeper", hosts), float(poll), None
    if "file" in raw:
        if not isinstance(raw["file"], str) or not raw["file"]:
            raise ConfigError(f"map_source.file must be a path, got {brief(raw['file'])}")
        path = Path(raw["file"])
        return ("file", str(path if path.is_absolute() else base / path)), float(poll), None
    entry = raw["table"]
    if isinstance(entry, Mapping) and set(entry) - _HOST_KEYS:
        extra = _keys(set(entry) - _HOST_KEYS)
        raise ConfigError(f"map_source.table has unknown key(s) {extra}; known: {_keys(_HOST_KEYS)}")
    app = _credentialed_url(entry, "map_source.table", None, env, base)
    admin_entry = entry.get("admin") if isinstance(entry, Mapping) else None
    admin = (
        app
        if admin_entry is None
        else _credentialed_url(admin_entry, "map_source.table.admin", None, env, base)
    )
    checked = []
    for url, where in ((app, "map_source.table"), (admin, "map_source.table.admin")):
        if not _mariadb(url):
            raise ConfigError(f"{where} must be a MariaDB URL, got {url.drivername}://...")
        checked.append(_mysql_tls_checked(url, where, base))
    app, admin = checked
    return ("table", app.render_as_string(hide_password=True)), float(poll), (app, admin)


def _mysql_tls_checked(url: URL, where: str, base: Path) -> URL:
    """``url`` with its TLS files made absolute (from the config's folder) and its TLS parameters checked."""
    from store.tls import absolute_files, mysql_tls

    try:
        url = absolute_files(url, base)
        mysql_tls(url)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return url


def _check_backends(ids: str, hosts: Mapping[str, URL]) -> None:
    for name, url in hosts.items():
        backend = backend_for(url)
        if ids not in backend.serves_ids:
            able = sorted({b for b in backend_names() if ids in backend_named(b).serves_ids})
            serves = ", ".join(sorted(backend.serves_ids))
            raise ConfigError(
                f"hosts.{name} is a {backend.name} host, which serves ids: {serves}; "
                f"use {' or '.join(able)} hosts for ids: {ids}"
            )


def _mariadb(url: URL) -> bool:
    """True if ``url`` names a server that can hold the map table and ticket counters (MariaDB)."""
    try:
        backend = backend_for(url)
    except ConfigError:
        return False
    return backend.can_hold_tickets
