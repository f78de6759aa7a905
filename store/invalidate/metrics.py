"""Prometheus gauges of a `store invalidate` daemon, read from `Daemon.status` at each scrape."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from store.invalidate.daemon import Daemon

__all__ = ["DaemonCollector"]

_ROLES = ("leader", "standby", "stopped")


class DaemonCollector:
    """A custom collector: per host, the role, the heartbeat's age and the stream's lag; the keys deleted."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def describe(self) -> Iterable[Any]:
        """Nothing up front: the families are made at each scrape."""
        return []

    def collect(self) -> Iterator[Any]:
        """The families, from the daemon's status now."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        role = GaugeMetricFamily(
            "store_invalidator_role", "1 for the role this daemon's invalidator has", labels=["host", "role"]
        )
        age = GaugeMetricFamily(
            "store_invalidator_heartbeat_age_seconds",
            "Age of the heartbeat this daemon last published (absent: none yet)",
            labels=["host"],
        )
        lag = GaugeMetricFamily(
            "store_invalidator_lag_seconds", "How far the binlog stream is behind its target", labels=["host"]
        )
        terms = CounterMetricFamily(
            "store_invalidator_terms", "Times this daemon took the lead", labels=["host"]
        )
        errors = CounterMetricFamily(
            "store_invalidator_errors", "Times this daemon stepped down on an error", labels=["host"]
        )
        deleted = CounterMetricFamily("store_invalidator_keys_deleted", "Cache keys this daemon deleted")
        statuses = self._daemon.status()
        for status in statuses:
            for host in status["hosts"]:
                for name in _ROLES:
                    role.add_metric([host, name], 1.0 if status["role"] == name else 0.0)
                if status["heartbeat_age_s"] is not None:
                    age.add_metric([host], float(status["heartbeat_age_s"]))
                if "lag_s" in status:
                    lag.add_metric([host], float(status["lag_s"]))
                terms.add_metric([host], float(status["terms"]))
                errors.add_metric([host], float(status["errors"]))
        deleted.add_metric([], float(self._daemon.deleted))
        yield from (role, age, lag, terms, errors, deleted)
