"""The store's shortcuts through PyMySQL's internals, and the check that those internals are there.

Two classes here reach past PyMySQL's public API, for CPU measured on the
request path:

* the store's cursor (`cursor_class`) binds int parameters with ``str()``
  itself (and escapes str ones with ``str.replace``), and reads the OK
  packets of a request of writes straight off the driver's socket
  (``execute_oks``, used by `store.engines`);
* the store's connection class (`connection_class`) builds PyMySQL's default
  TLS context once instead of once per connection.

They lean on private names (`WRITE_INTERNALS`, `CONNECTION_INTERNALS`,
`TLS_INTERNALS`) that any PyMySQL release may rename: 1.2.0 and older have no
``Connection._current_timeout``, which ``execute_oks`` reads. So each is
checked before it is used: the classes' names when the classes are made, a
connection's own attributes on the first connection the store opens (`adopt`).
Whatever is missing, or there in another shape, is logged once by name, and the
store takes the public way instead: writes go through the plain cursor
(``execute`` then ``nextset``), connections build their own TLS context. Writes
keep working on any PyMySQL; only the shortcut is lost. ``pyproject.toml`` pins
the releases the shortcuts were tested with (`TESTED_PYMYSQL`), and the test of
this module fails on a release that lacks a name, naming it.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "CONNECTION_INTERNALS",
    "TESTED_PYMYSQL",
    "TLS_INTERNALS",
    "WRITE_INTERNALS",
    "Internal",
    "adopt",
    "connection_class",
    "cursor_class",
    "escape_text",
    "fast_writes",
    "missing_internals",
    "pymysql_version",
]

# The logger keeps the name it had before the module moved into the mysql package.
log = logging.getLogger("store.backends.pymysql_fast")

#: The PyMySQL releases the shortcuts were tested with (the pin in pyproject.toml).
TESTED_PYMYSQL = ">=1.2.1,<1.3"


class Internal(NamedTuple):
    """A name the shortcuts use beyond PyMySQL's public API, and the shape they expect of it."""

    #: Dotted from the ``pymysql`` module (``connections.Connection._read_bytes``), or, for a
    #: connection's own attribute, from the connection (``_next_seq_id``).
    path: str
    #: The shape, as the log and the test say it.
    shape: str
    fits: Callable[[Any], bool]


def _method(*params: str) -> tuple[str, Callable[[Any], bool]]:
    """The shape of a method (or a class) called with ``params``."""

    def fits(value: Any) -> bool:
        if not callable(value):
            return False
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):
            return True  # nothing to read (a C function): being callable is all that can be told
        try:
            signature.bind(*([None] * len(params)))
        except TypeError:
            return False
        return True

    return f"callable as ({', '.join(params)})", fits


def _of(kind: type | tuple[type, ...], what: str) -> tuple[str, Callable[[Any], bool]]:
    return what, lambda value: isinstance(value, kind) and not isinstance(value, bool)


def _seconds_or_none() -> tuple[str, Callable[[Any], bool]]:
    return (
        "None or seconds",
        lambda value: value is None or (isinstance(value, int | float) and not isinstance(value, bool)),
    )


def _exception_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, Exception)


#: What ``execute_oks`` and ``execute_rows`` call and read of the driver's classes and modules.
WRITE_INTERNALS = (
    Internal("cursors.Cursor._get_db", *_method("self")),
    Internal("cursors.Cursor._clear_result", *_method("self")),
    Internal("connections.Connection._execute_command", *_method("self", "command", "sql")),
    Internal("connections.Connection._read_bytes", *_method("self", "num_bytes")),
    Internal("connections.Connection._force_close", *_method("self")),
    Internal("connections.Connection.InternalError", "an exception class", _exception_class),
    Internal("protocol.MysqlPacket", *_method("data", "encoding")),
    Internal("protocol.MysqlPacket.raise_for_error", *_method("self")),
    Internal("constants.COMMAND.COM_QUERY", "3", lambda value: value == 3),
    Internal(
        "connections.TEXT_TYPES", "a set of field types", lambda value: isinstance(value, set | frozenset)
    ),
    Internal("converters.through", *_method("value")),
)
#: What ``execute_oks`` and ``execute_rows`` read and set on each connection (made when it opens).
CONNECTION_INTERNALS = (
    Internal("_sock", "a socket", lambda value: callable(getattr(value, "settimeout", None))),
    Internal("_read_timeout", *_seconds_or_none()),
    Internal("_current_timeout", *_seconds_or_none()),
    Internal("_next_seq_id", *_of(int, "an int")),
    Internal("_affected_rows", *_of(int, "an int")),
    Internal("server_status", *_of(int, "an int")),
    Internal("encoding", *_of(str, "a str")),
    Internal("decoders", *_of(dict, "a dict")),
    Internal("use_unicode", "a bool", lambda value: isinstance(value, bool)),
)
#: What the connection class that shares one TLS context overrides.
TLS_INTERNALS = (Internal("connections.Connection._create_ssl_ctx", *_method("self", "sslp")),)

_MISSING = object()


def missing_internals(module: Any, internals: tuple[Internal, ...], *, on: Any | None = None) -> list[str]:
    """Each of ``internals`` that PyMySQL (``module``) lacks or has in another shape, as one line
    naming it; empty if all are there. Paths are looked up on ``on`` (a connection) if given."""
    out = []
    for need in internals:
        value = on if on is not None else module
        for part in need.path.split("."):
            value = getattr(value, part, _MISSING)
            if value is _MISSING:
                break
        where = f"a connection's {need.path}" if on is not None else f"pymysql.{need.path}"
        if value is _MISSING:
            out.append(f"{where} is missing (expected {need.shape})")
        elif not need.fits(value):
            out.append(f"{where} is not {need.shape}")
    return out


def pymysql_version(module: Any) -> str:
    """PyMySQL's own version (its ``__version__`` is a mysqlclient version, for compatibility)."""
    parts = getattr(module, "VERSION", None)
    if isinstance(parts, tuple) and len(parts) >= 3:
        return ".".join(str(p) for p in parts[:3])
    return "(version unknown)"


def _warn(module: Any, shortcut: str, gaps: list[str], instead: str) -> None:
    log.warning(
        "PyMySQL %s lacks what the store's %s uses of its internals: %s. %s. The store was tested "
        "with pymysql%s; install a release in that range to have the shortcut back.",
        pymysql_version(module),
        shortcut,
        "; ".join(gaps),
        instead,
        TESTED_PYMYSQL,
    )


_LOCK = threading.Lock()


def _new_lock() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # in a forked child: another thread may have held it at the fork


os.register_at_fork(after_in_child=_new_lock)
#: The classes made and the decisions taken, once per process: "plain" and "fast" cursor classes,
#: "writes" (whether connections keep the fast cursor), "connection" and its shared "context".
_MADE: dict[str, Any] = {}


def cursor_class(module: Any) -> Any:
    """PyMySQL's cursor, binding a statement's int parameters with ``str()`` itself, and with
    ``execute_oks`` where the driver has what it needs (`WRITE_INTERNALS`; else logged once).

    PyMySQL escapes each parameter through four calls (escape, escape_item,
    the encoder table, escape_int) that end in ``str(value)``; the store's
    statements carry mostly IDs (an IN list of 50 on a page's object read),
    so the same text, built with one call per int, costs a third of the
    client CPU to bind. A str is escaped by `escape_text`, the same text as
    the driver's (unless the session has ``NO_BACKSLASH_ESCAPES``, which the
    driver's own escaping handles). Other types (and bools) go through the
    driver's own escaping, and named parameters through its own path. This
    part uses the driver's public API only.
    """
    plain, fast = _cursor_classes(module)
    return plain if fast is None else fast


def _cursor_classes(module: Any) -> tuple[Any, Any | None]:
    """(the int-binding cursor, the same with ``execute_oks`` or None if the driver cannot have it)."""
    with _LOCK:
        if "plain" not in _MADE:
            _MADE["plain"], _MADE["fast"] = _make_cursor_classes(module)
        return _MADE["plain"], _MADE["fast"]


#: What PyMySQL's ``escape_string`` turns each character into, the backslash first (its output is not
#: read again).
_ESCAPES = (
    ("\\", "\\\\"),
    ("\0", "\\0"),
    ("\n", "\\n"),
    ("\r", "\\r"),
    ("\032", "\\Z"),
    ('"', '\\"'),
    ("'", "\\'"),
)


def escape_text(text: str) -> str:
    """PyMySQL's ``escape_string`` of ``text`` (NUL, backslash, newline, CR, ^Z and both quotes
    escaped with a backslash), one ``str.replace`` per character of those the text holds: about
    0.8 us for a 300-byte JSON object, against 7 us for the driver's ``str.translate``, which maps
    every character through a table of Python strings (a `create_many` of 100 objects binds 100)."""
    for char, escaped in _ESCAPES:
        if char in text:
            text = text.replace(char, escaped)
    return text


def _make_cursor_classes(module: Any) -> tuple[Any, Any | None]:
    base = module.cursors.Cursor
    error = module.err.ProgrammingError

    plain_quotes = module.constants.SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES

    class IntBindingCursor(base):  # type: ignore[misc, valid-type]
        def _bind(self, query: Any, args: Any) -> Any:
            conn = self.connection
            escape = conn.escape
            if conn.server_status & plain_quotes:  # (the driver's own escaping knows this mode)
                texts = [str(a) if type(a) is int else escape(a) for a in args]
            else:
                texts = [
                    str(a) if type(a) is int else f"'{escape_text(a)}'" if type(a) is str else escape(a)
                    for a in args
                ]
            try:
                return query % tuple(texts)
            except TypeError as exc:
                raise error(str(exc)) from None

        def execute(self, query: Any, args: Any = None) -> Any:
            if type(args) is tuple or type(args) is list:
                query = self._bind(query, args)
                args = None
            return super().execute(query, args)

    gaps = missing_internals(module, WRITE_INTERNALS)
    if gaps:
        _MADE["writes"] = False
        _warn(module, "fast write path", gaps, _PUBLIC_WRITES)
        return IntBindingCursor, None

    packet = module.protocol.MysqlPacket
    query_command = module.constants.COMMAND.COM_QUERY
    text_types = frozenset(module.connections.TEXT_TYPES)
    through = module.converters.through

    class FastWriteCursor(IntBindingCursor):
        def execute_oks(self, query: str, args: Any = None) -> list[tuple[int, int]]:
            """Run statements that answer with no rows, in one request; (affected rows,
            insert id) of each (see `_read_oks`)."""
            if args:
                query = self._bind(query, args)
            conn = self._get_db()
            self._clear_result()
            conn._execute_command(query_command, query)
            out = _read_oks(conn, packet)
            self.rowcount, self.lastrowid = out[-1]
            return out

        def execute_rows(self, query: str, args: Any = None) -> list[tuple[int, int, list[Any]]]:
            """Run statements in one request; (affected rows, insert id, rows) of each, its rows
            ([] for a statement that returns none) as PyMySQL's cursor would give them (see
            `_read_results`)."""
            if args:
                query = self._bind(query, args)
            conn = self._get_db()
            self._clear_result()
            conn._execute_command(query_command, query)
            out = _read_results(conn, packet, text_types, through)
            self.rowcount, self.lastrowid, _rows = out[-1]
            return out

    return IntBindingCursor, FastWriteCursor


_PUBLIC_WRITES = (
    "Writes go through the driver's public cursor instead (execute, then nextset for each "
    "statement of a request): the same results, at some more CPU per write"
)


def adopt(conn: Any, module: Any) -> None:
    """Give ``conn`` (just opened with `cursor_class`) the plain cursor unless the fast write path
    can run on it: checked on the first connection (`CONNECTION_INTERNALS`; gaps logged once)."""
    writes = _MADE.get("writes")
    if writes is None:
        fast = _cursor_classes(module)[1]
        with _LOCK:
            writes = _MADE.get("writes")
            if writes is None:
                gaps = [] if fast is None else missing_internals(module, CONNECTION_INTERNALS, on=conn)
                if gaps:
                    _warn(module, "fast write path", gaps, _PUBLIC_WRITES)
                writes = _MADE["writes"] = fast is not None and not gaps
    if not writes:
        conn.cursorclass = _MADE["plain"]


def fast_writes() -> bool | None:
    """Whether the store's PyMySQL connections read writes' answers themselves (``execute_oks``);
    None until the first connection was opened and checked."""
    value: bool | None = _MADE.get("writes")
    return value


def connection_class(module: Any) -> Any:
    """PyMySQL's connection class, sharing one TLS context among the connections made with no TLS
    parameter (where the driver has the method this overrides, `TLS_INTERNALS`; else its own
    class, logged once).

    With none, PyMySQL (1.2) tries TLS if the server offers it, without
    checking the certificate, and builds a new context for that on every
    connection: loading the system's CA store cost 16-23 ms of CPU each
    time. The context is the same every time (no files), so one serves all.
    """
    with _LOCK:
        cls = _MADE.get("connection")
        if cls is None:
            base = module.connections.Connection
            gaps = missing_internals(module, TLS_INTERNALS)
            if gaps:
                _warn(
                    module,
                    "shared TLS context",
                    gaps,
                    "Each connection builds its own TLS context instead, as the driver does by itself",
                )
                cls = _MADE["connection"] = base
                return cls

            class PreferredTLSConnection(base):  # type: ignore[misc, valid-type]
                def _create_ssl_ctx(self, sslp: Any) -> Any:
                    if isinstance(sslp, dict) and not sslp:
                        with _LOCK:
                            ctx = _MADE.get("context")
                            if ctx is None:
                                ctx = _MADE["context"] = super()._create_ssl_ctx(sslp)
                        return ctx
                    return super()._create_ssl_ctx(sslp)

            cls = _MADE["connection"] = PreferredTLSConnection
    return cls


#: The OK packet's status flag: another statement's result follows.
_MORE_RESULTS = 8


def _read_oks(conn: Any, packet: Any) -> list[tuple[int, int]]:
    """The OK packets of a request of statements that return no rows, read straight off
    PyMySQL's socket: (affected rows, insert id) of each.

    PyMySQL reads each statement's result through a result object, a packet
    object and a wrapper (some 30 calls, 25-30 us of CPU); a pair write sends
    four to nine statements a request and reads only these two numbers of
    each. An error packet is raised as PyMySQL raises it (the statements
    after a failed one do not run, and nothing follows it); a packet that is
    not an OK (a statement that returned rows) closes the connection and
    raises, since the rest of its answer cannot be read here.
    """
    if conn._current_timeout != conn._read_timeout:
        conn._sock.settimeout(conn._read_timeout)
        conn._current_timeout = conn._read_timeout
    read = conn._read_bytes
    out: list[tuple[int, int]] = []
    while True:
        head = read(4)
        size = head[0] | head[1] << 8 | head[2] << 16
        if head[3] != conn._next_seq_id or size >= 0xFFFFFF:
            conn._force_close()
            raise conn.InternalError(f"unexpected packet (sequence {head[3]}, {size} bytes) after a write")
        conn._next_seq_id = (conn._next_seq_id + 1) % 256
        data = read(size)
        if data[0] != 0:
            if data[0] == 0xFF:
                packet(data, conn.encoding).raise_for_error()
            conn._force_close()
            raise conn.InternalError("a statement sent as a write returned rows")
        affected, pos = _length_encoded(data, 1)
        insert_id, pos = _length_encoded(data, pos)
        status = data[pos] | data[pos + 1] << 8
        out.append((affected, insert_id))
        if not status & _MORE_RESULTS:
            conn.server_status = status
            conn._affected_rows = affected
            return out


def _read_packet(conn: Any) -> bytes:
    """The next packet's payload (joined, where the server split it at 16 MB)."""
    read = conn._read_bytes
    out = b""
    while True:
        head = read(4)
        size = head[0] | head[1] << 8 | head[2] << 16
        if head[3] != conn._next_seq_id:
            conn._force_close()
            raise conn.InternalError(f"unexpected packet (sequence {head[3]}, {size} bytes)")
        conn._next_seq_id = (conn._next_seq_id + 1) % 256
        data: bytes = read(size)
        if size < 0xFFFFFF:
            return out + data if out else data
        out += data


def _read_results(
    conn: Any, packet: Any, text_types: frozenset[int], through: Any
) -> list[tuple[int, int, list[Any]]]:
    """The answers of a request of statements, read straight off PyMySQL's socket: (affected
    rows, insert id, rows) of each; a statement that returns rows has ``len(rows)`` affected,
    insert id 0, and its rows as tuples of values decoded and converted as PyMySQL decodes them
    (its ``decoders``, the connection's encoding for text, ascii for numbers, bytes for binary).

    PyMySQL reads each result through a result object and a packet object per row and per
    column (25-30 us of CPU a result); a request of a batch's pair writes answers with six to
    ten results, two of them reads of a few rows. An error packet is raised as PyMySQL raises
    it (the statements after a failed one do not run, and nothing follows it).
    """
    if conn._current_timeout != conn._read_timeout:
        conn._sock.settimeout(conn._read_timeout)
        conn._current_timeout = conn._read_timeout
    decoders = conn.decoders
    encoding = conn.encoding if conn.use_unicode else None
    out: list[tuple[int, int, list[Any]]] = []
    while True:
        data = _read_packet(conn)
        first = data[0]
        if first == 0:  # OK
            affected, pos = _length_encoded(data, 1)
            insert_id, pos = _length_encoded(data, pos)
            status = data[pos] | data[pos + 1] << 8
            out.append((affected, insert_id, []))
        elif first == 0xFF:
            packet(data, conn.encoding).raise_for_error()
            raise AssertionError("unreachable: an error packet raises")  # pragma: no cover
        elif first == 0xFB:  # LOAD DATA LOCAL: never sent by the store
            conn._force_close()
            raise conn.InternalError("a statement asked for a local file")
        else:
            count, _pos = _length_encoded(data, 0)
            columns = [
                _column(_read_packet(conn), decoders, encoding, text_types, through) for _i in range(count)
            ]
            eof = _read_packet(conn)
            if eof[0] != 0xFE or len(eof) >= 9:
                conn._force_close()
                raise conn.InternalError("expected the end of a result's columns")
            rows: list[Any] = []
            while True:
                data = _read_packet(conn)
                if data[0] == 0xFE and len(data) < 9:  # the end of the rows
                    status = data[3] | data[4] << 8
                    break
                if data[0] == 0xFF:
                    packet(data, conn.encoding).raise_for_error()
                rows.append(_row(data, columns))
            out.append((len(rows), 0, rows))
        if not status & _MORE_RESULTS:
            conn.server_status = status
            conn._affected_rows = out[-1][0]
            return out


def _column(
    data: bytes, decoders: Any, encoding: str | None, text_types: frozenset[int], through: Any
) -> tuple[str | None, Any]:
    """(encoding, converter) of a column, from its definition packet, as PyMySQL picks them
    (``encoding`` None: the connection decodes nothing)."""
    pos = 0
    for _name in range(6):  # catalog, schema, table, original table, name, original name
        size, pos = _length_encoded(data, pos)
        pos += size
    pos += 1  # (the length of the fixed fields that follow)
    charset = data[pos] | data[pos + 1] << 8
    kind = data[pos + 6]
    if kind == 245:  # JSON: text in the connection's encoding, whatever its character set
        coding: str | None = encoding
    elif kind in text_types:
        coding = None if charset == 63 else encoding  # (63: binary)
    else:
        coding = None if encoding is None else "ascii"
    converter = decoders.get(kind)
    return coding, None if converter is through else converter


def _row(data: bytes, columns: list[tuple[str | None, Any]]) -> tuple[Any, ...]:
    """A row packet's values, decoded and converted per column."""
    out: list[Any] = []
    pos = 0
    end = len(data)
    for coding, converter in columns:
        if pos >= end:
            break  # (as PyMySQL: a row with fewer values)
        if data[pos] == 0xFB:
            out.append(None)
            pos += 1
            continue
        size, pos = _length_encoded(data, pos)
        value: Any = data[pos : pos + size]
        pos += size
        if coding is not None:
            value = value.decode(coding)
        if converter is not None:
            value = converter(value)
        out.append(value)
    return tuple(out)


def _length_encoded(data: bytes, pos: int) -> tuple[int, int]:
    """The length-encoded integer at ``pos`` of ``data``, and the position after it."""
    first = data[pos]
    if first < 0xFB:
        return first, pos + 1
    width = {0xFC: 2, 0xFD: 3, 0xFE: 8}[first]
    return int.from_bytes(data[pos + 1 : pos + 1 + width], "little"), pos + 1 + width
