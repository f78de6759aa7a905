"""Operator work, off the request path: provisioning shards, repairing relations."""

from store.admin.init import InitReport, init_shards
from store.admin.repair import RepairReport, repair_relations

__all__ = ["InitReport", "RepairReport", "init_shards", "repair_relations"]
