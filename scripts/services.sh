#!/usr/bin/env bash
# Start the loopback services the test suite needs, if they are down:
# MariaDB 3306, Redis 6379, PostgreSQL 5432, memcached 11211 (memcached and
# ZooKeeper are installed from Debian's packages when missing, as are
# pkg-config and libmariadb-dev, which building mysqlclient needs). Safe to
# run again: what runs is left alone.
set -euo pipefail

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() {  # name port
  for _ in $(seq 1 60); do up "$2" && return 0; sleep 0.5; done
  echo "services: $1 did not come up on 127.0.0.1:$2" >&2; return 1
}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
# Servers started here outlive this script: they get no descriptor of the
# caller's but stdio, or a lock the caller holds around a test run (flock)
# would stay held by the server for as long as it runs.
detached() {
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    "$@"  # not exec: the command may be a function of this script (as_root)
  )
}

if ! up 3306; then
  echo "services: starting MariaDB"
  as_root install -d -o mysql -g mysql /run/mysqld
  detached as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  wait_for MariaDB 3306
fi

if ! up 6379; then
  echo "services: starting Redis"
  detached redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  wait_for Redis 6379
fi

if ! up 5432; then
  echo "services: starting PostgreSQL"
  detached as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  wait_for PostgreSQL 5432
fi

missing=()
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
# ZooKeeper is started by the tests themselves (one standalone server in a
# temporary directory); only the package is needed.
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
# Building the mysqlclient driver (`make test` installs it) needs MariaDB's client headers.
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[ -f /usr/include/mariadb/mysql.h ] || missing+=(libmariadb-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "services: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! up 11211; then
  echo "services: starting memcached"
  detached as_root memcached -d -u memcache -l 127.0.0.1 -p 11211 -m 256
  wait_for memcached 11211
fi
# The default of 151 connections is too few for `store bench mix` at 16 threads
# (every system keeps a connection per host per thread); raise it on this
# loopback server only, until it restarts.
if [ "$(mysql -uroot -N -e 'SELECT @@max_connections' 2>/dev/null || echo 600)" -lt 600 ]; then
  mysql -uroot -e 'SET GLOBAL max_connections = 600' 2>/dev/null || \
    echo "services: could not raise MariaDB's max_connections to 600 (store bench mix at 16 threads needs about 200)" >&2
fi
echo "services: MariaDB, Redis, PostgreSQL and memcached are up on 127.0.0.1"
