"""Operator work, off the request path: provisioning shards (and, later, moves)."""

from store.admin.init import InitReport, init_shards

__all__ = ["InitReport", "init_shards"]
