#!/usr/bin/env bash
# Starts what the tests talk to, installing it first where missing: PostgreSQL, Redis, Chromium.
# Each test session starts PostgreSQL clusters (initdb, pg_ctl: the installed binaries) and redis-server
# processes of its own on free ports; the machine's PostgreSQL is for the benches' tests (and DETLAB_TEST_PG),
# so nothing here is ever flushed or restarted.
set -euo pipefail

need_apt=()
command -v pg_ctlcluster >/dev/null || need_apt+=(postgresql)
command -v redis-server >/dev/null || need_apt+=(redis-server)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi

for _ in $(seq 1 60); do
  if pg_isready -q -h 127.0.0.1 -p 5432; then
    exit 0
  fi
  sleep 1
done
echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2
exit 1
