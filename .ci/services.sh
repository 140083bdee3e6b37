#!/usr/bin/env bash
# Start what the test suite needs when it is not running: PostgreSQL (127.0.0.1:5432,
# trust auth for user postgres), Redis (127.0.0.1:6379), Debian's Chromium for the
# browser tests and bubblewrap (`bwrap`), the sandbox agent commands run in. On this project's machines they usually run already; a fresh Debian
# machine gets them from its packages.
set -euo pipefail
need_apt=()
command -v pg_isready >/dev/null || need_apt+=(postgresql)
command -v redis-server >/dev/null || need_apt+=(redis-server)
[ -x "${GYRE_CHROMIUM:-/usr/bin/chromium}" ] || need_apt+=(chromium)
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "services: installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "services: starting PostgreSQL"
  service postgresql start >/dev/null
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "services: starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' >/dev/null
  for _ in $(seq 30); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432 && redis-cli -h 127.0.0.1 ping
