#!/usr/bin/env bash
# Debian's postgresql where its server binaries are missing (the PostgreSQL cache tests and the soak test start a
# throwaway server on loopback); a warning where it cannot be installed (no apt-get, not root).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's postgresql for the PostgreSQL cache tests" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "warning: no PostgreSQL server binaries and no root apt-get: PostgreSQL tests will skip" >&2
  fi
fi
