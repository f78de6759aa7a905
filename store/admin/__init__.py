"""Operator work, off the request path: provisioning, checking and repairing shards."""

from store.admin.check import CheckReport, check_store
from store.admin.init import InitReport, init_shards
from store.admin.repair import RepairReport, repair_relations, repair_unique

__all__ = [
    "CheckReport",
    "InitReport",
    "RepairReport",
    "check_store",
    "init_shards",
    "repair_relations",
    "repair_unique",
]
