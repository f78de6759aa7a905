"""docker-compose.yml and the configs that match it, checked without a container engine.

No container engine runs where the tests run (and images cannot be pulled
there), so `docker compose up` itself is not exercised. What broke the file
before is checked instead: every healthcheck calls only what its image
holds, the published ports are the configs' URLs, PostgreSQL has logical
WAL and the configs' database, every host names the compose service a
replica reaches it by, and the configs load. The memcached healthcheck's
script also runs, with bash, against the real memcached of the tests.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import URL

from store import StoreConfig
from tests.conftest import require_port
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
#: The configs README says match docker-compose.yml.
CONFIGS = ("compose.yaml", "compose-instagram.yaml")

#: What each image holds that a healthcheck may run, from the images' own build files: the
#: official mariadb image adds healthcheck.sh (and makes its healthcheck user on first start);
#: redis adds redis-cli; postgres adds pg_isready; memcached:1.6 is Debian slim (bookworm) plus
#: memcached, so bash, grep and coreutils are there but nc, curl, wget and python are not (the
#: old check piped into nc and never passed). All four are Debian-based: sh is dash, without
#: bash's /dev/tcp.
IMAGE_TOOLS = {
    "mariadb:10.11": {"healthcheck.sh", "mariadb", "mariadb-admin", "bash", "sh", "grep"},
    "redis:7": {"redis-cli", "bash", "sh", "grep"},
    "memcached:1.6": {"bash", "sh", "grep", "timeout", "cat"},
    "postgres:15": {"pg_isready", "psql", "bash", "sh", "grep"},
}
#: Shell builtins a script may use without the image holding a program of that name.
BUILTINS = {"exec", "printf", "echo", "test", "[", "exit", "read", "true", "false"}


def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return dict(doc["services"])


def config(name: str) -> StoreConfig:
    return StoreConfig.from_file(ROOT / "config" / name)


def published(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> the port published on the host's loopback."""
    out = {}
    for spec in service.get("ports", []):
        ip, host_port, container_port = str(spec).split(":")
        assert ip == "127.0.0.1", f"{spec}: publish on loopback only"
        out[int(container_port)] = int(host_port)
    return out


def programs(script: str) -> list[str]:
    """The first word of each command of a shell script (pipes, &&, ||, ;), builtins left out."""
    out = []
    for part in re.split(r"&&|\|\||[|;]", script):
        words = shlex.split(part)
        if words and words[0] not in BUILTINS:
            out.append(words[0])
    return out


def healthcheck_programs(test: list[str]) -> tuple[list[str], str | None]:
    """(programs the check runs, the script if a shell runs one, else None)."""
    kind, *argv = test
    if kind == "CMD-SHELL":
        return ["sh", *programs(argv[0])], argv[0]
    assert kind == "CMD", f"healthcheck test must start with CMD or CMD-SHELL, got {kind}"
    if argv[0] in ("bash", "sh") and argv[1] == "-c":
        return [argv[0], *programs(argv[2])], argv[2]
    return [argv[0]], None


def memcached_script() -> list[str]:
    test = compose()["memcached"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "bash", "-c"]
    return ["bash", "-c", test[3]]


@pytest.mark.parametrize("name", sorted(IMAGE_TOOLS))
def test_every_healthcheck_runs_only_what_its_image_holds(name: str) -> None:
    services = {s["image"]: s for s in compose().values() if "image" in s}
    assert set(services) == set(IMAGE_TOOLS), "a new image: list what it holds in IMAGE_TOOLS"
    service = services[name]
    ran, script = healthcheck_programs(service["healthcheck"]["test"])
    missing = [p for p in ran if p not in IMAGE_TOOLS[name]]
    assert not missing, f"{name}'s healthcheck runs {missing}, which the image does not have"
    if script is not None and "/dev/tcp/" in script:
        assert ran[0] == "bash", "/dev/tcp is bash's: the images' sh (dash) has none"
    assert {"interval", "timeout", "retries"} <= set(service["healthcheck"])


def test_memcached_healthcheck_passes_on_a_live_memcached_and_fails_without_one() -> None:
    require_port("memcached", 11211)
    assert published(compose()["memcached"]) == {11211: 11211}
    script = memcached_script()
    assert subprocess.run(script, timeout=10).returncode == 0
    # The same script aimed at a port nothing listens on fails (as it does while memcached starts).
    dead = [script[0], script[1], script[2].replace("/11211", f"/{free_port()}")]
    assert subprocess.run(dead, timeout=10, stderr=subprocess.DEVNULL).returncode != 0
    # ... and so does one where something answers that is not memcached.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        other = [script[0], script[1], script[2].replace("/11211", f"/{port}")]
        proc = subprocess.Popen(other, stderr=subprocess.DEVNULL)
        conn, _ = sock.accept()
        conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
        conn.close()
        assert proc.wait(timeout=10) != 0


@pytest.mark.parametrize("name", CONFIGS)
def test_each_host_names_the_service_a_replica_reaches_it_by_and_its_published_port(name: str) -> None:
    services = compose()
    c = config(name)
    assert set(c.replication_hosts) == set(c.hosts), "every host needs a replication_host in compose"
    for host, url in c.hosts.items():
        service, port = c.replication_hosts[host]
        assert service in services, f"{host}'s replication_host {service} is not a compose service"
        assert port is not None, f"{host}: give the container's port (the URL's is the host's)"
        assert url.host == "127.0.0.1"
        assert published(services[service]).get(port) == url.port, (
            f"{host}'s URL port {url.port} is not where {service}:{port} is published"
        )


def test_the_caches_are_the_services_published_ports() -> None:
    services = compose()
    for name in CONFIGS:
        cache = config(name).cache
        assert cache.memcached == (f"127.0.0.1:{published(services['memcached'])[11211]}",)
        assert len(cache.redis) == 1
        assert cache.redis[0].startswith(f"redis://127.0.0.1:{published(services['redis'])[6379]}/")
    # Two stores on the same cache servers must not read each other's entries.
    a, b = (config(n).cache for n in CONFIGS)
    assert (a.redis, a.prefix) != (b.redis, b.prefix)
    assert a.prefix != b.prefix


def test_postgres_has_logical_wal_and_the_configs_database() -> None:
    pg = compose()["postgres"]
    command = pg["command"]
    assert command[0] == "postgres"
    settings = [command[i + 1] for i, arg in enumerate(command) if arg == "-c"]
    assert "wal_level=logical" in settings, "store move of schema shards needs logical replication"
    urls: list[URL] = list(config("compose-instagram.yaml").hosts.values())
    assert {u.database for u in urls} == {pg["environment"]["POSTGRES_DB"]}
    assert pg["environment"]["POSTGRES_DB"] in pg["healthcheck"]["test"]


def test_the_mariadb_pair_can_move_shards_between_them() -> None:
    services = compose()
    ids = set()
    for name in ("mariadb-a", "mariadb-b"):
        command = services[name]["command"]
        assert "--log-bin" in command
        assert "--binlog-format=ROW" in command
        ids |= {arg for arg in command if arg.startswith("--server-id=")}
    assert len(ids) == 2, "each server of a replication pair needs its own server id"
    c = config("compose.yaml")
    assert c.map_source is not None, "a move publishes its map to a map source"
    assert c.map_source[0] == "table"
    assert {r.master for r in c.shard_map} == {"MySQL001A", "MySQL002A"}


def test_the_readme_names_the_configs_that_match_compose() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in CONFIGS:
        assert f"config/{name}" in readme
        assert (ROOT / "config" / name).exists()


def test_the_invalidation_daemon_runs_the_cli_on_a_config_whose_servers_keep_row_binlogs() -> None:
    from click.testing import CliRunner

    from store.cli import main

    services = compose()
    daemon = services["invalidate"]
    assert daemon["build"] == ".", "the daemon's image is the project's Dockerfile"
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert 'ENTRYPOINT ["store"]' in dockerfile
    assert set(daemon["depends_on"]) <= set(services)
    (mount,) = daemon["volumes"]
    local, inside, _mode = mount.split(":")
    command = list(daemon["command"])
    assert command[0] == "invalidate"
    assert command[command.index("--config") + 1] == inside
    # The host's network: the config's loopback URLs are the servers' published ports.
    assert daemon["network_mode"] == "host"
    cfg = StoreConfig.from_file(ROOT / local)
    assert cfg.cache.daemon_hosts(sorted(cfg.hosts)) == sorted(cfg.hosts)
    assert {cfg.cache.invalidation_of(h) for h in cfg.hosts} == {"binlog"}
    for name, service in services.items():
        if str(service.get("image", "")).startswith("mariadb"):
            flags = service["command"]
            assert {"--log-bin", "--binlog-format=ROW"} <= set(flags), f"{name}: no ROW binlog"
    # The options exist as the command spells them (--help parses them and runs nothing).
    got = CliRunner().invoke(main, [*command, "--help"])
    assert got.exit_code == 0, got.output
    assert "--metrics-port" in got.output
