"""The tests' own servers (`tests.servers`): each one a test starts is the one it talks to."""

from __future__ import annotations

import pytest

from tests.servers import MariaDBServer


def test_a_mariadb_server_whose_port_another_holds_fails_to_start() -> None:
    """The second server's mariadbd cannot listen on the first's port and exits, yet the port
    answers: its start fails rather than hand the test the first server."""
    first = MariaDBServer()
    clash = MariaDBServer(first.port)
    try:
        first.start()
        with pytest.raises(pytest.fail.Exception, match="not ours"):
            clash.start()
        assert clash.proc is None  # killed and waited for
        first._check_ours()  # the first one still answers, as itself
    finally:
        clash.remove()
        first.remove()
