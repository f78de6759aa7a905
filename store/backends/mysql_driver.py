"""The first place of `store.backends.mysql.driver` (opening a MariaDB / MySQL driver's connection):
its names, still importable from here."""

from store.backends.mysql.driver import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, mysql_connector, mysql_driver_error

__all__ = ["CONNECT_TIMEOUT_S", "READ_TIMEOUT_S", "mysql_connector", "mysql_driver_error"]
