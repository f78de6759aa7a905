"""The `store` command's logging: admin commands log each phase on stderr, as text or JSON lines."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["ADMIN_LOGGER", "admin_log", "setup_logging"]

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


def admin_log(command: str) -> logging.Logger:
    """The logger of one admin command: ``store.admin.COMMAND``."""
    return logging.getLogger(f"{ADMIN_LOGGER}.{command}")
