#!/bin/bash
# Run a command beside a throwaway PostgreSQL server.
#   tests/pg/with_server.sh CMD [ARGS...]
# initdb into a temporary directory as an unprivileged user (the current
# one, or `postgres` / a user made for it when running as root: initdb
# refuses root), a free port on 127.0.0.1, the unix socket in the same
# directory; then CMD runs with
#   IDEM_PG_URL   postgres://idem:PASSWORD@127.0.0.1:PORT/idem
#   IDEM_PG_CTL   a command that takes stop|start|restart|kill (the server
#                 restarted mid-run, by the tests)
# and the server is stopped and removed at the end, whatever happens.
# Missing PostgreSQL binaries are a failure, not a skip: CI installs them
# (scripts/install-deps.sh).
set -u
find_bin() { # find_bin NAME: PATH, then Debian's versioned directories
  local b
  b=$(command -v "$1" 2>/dev/null) && [ -x "$b" ] && { echo "$b"; return 0; }
  for b in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$b/$1" ] && { echo "$b/$1"; return 0; }
  done
  return 1
}
INITDB=$(find_bin initdb) || { echo "with_server: initdb not found (apt-get install postgresql)" >&2; exit 1; }
PGCTL=$(find_bin pg_ctl) || { echo "with_server: pg_ctl not found" >&2; exit 1; }
# initdb and pg_ctl must come from one installation
d=$(dirname "$(readlink -f "$INITDB")")
[ -x "$d/pg_ctl" ] && PGCTL=$d/pg_ctl && INITDB=$d/initdb

T=$(mktemp -d /tmp/idem-pg-XXXXXX)
chmod 755 "$T"
RUNAS=()
if [ "$(id -u)" -eq 0 ]; then
  if ! id postgres > /dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin postgres ||
      { echo "with_server: cannot create the user postgres" >&2; exit 1; }
  fi
  chown postgres: "$T"
  if command -v runuser > /dev/null; then RUNAS=(runuser -u postgres --)
  else RUNAS=(setpriv --reuid=postgres --regid="$(id -g postgres)" --clear-groups); fi
fi
as_pg() { "${RUNAS[@]}" "$@"; }

PW=pw$RANDOM$RANDOM
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
  as_pg "$PGCTL" -D "$T/data" stop -m immediate > /dev/null 2>&1
  rm -rf "$T"
}
trap cleanup EXIT
printf '%s\n' "$PW" > "$T/pwfile"
chmod 644 "$T/pwfile"
if ! as_pg "$INITDB" -D "$T/data" -U idem --pwfile="$T/pwfile" -A scram-sha-256 \
  --no-sync > "$T/initdb.log" 2>&1; then
  cat "$T/initdb.log" >&2
  echo "with_server: initdb failed" >&2
  exit 1
fi
rm -f "$T/pwfile"
OPTS="-p $PORT -k $T -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on"
if ! as_pg "$PGCTL" -D "$T/data" -l "$T/server.log" -w -t 60 -o "$OPTS" start > /dev/null; then
  cat "$T/server.log" >&2
  echo "with_server: the server did not start" >&2
  exit 1
fi
PGPASSWORD=$PW "$(dirname "$PGCTL")/psql" -q -h 127.0.0.1 -p "$PORT" -U idem -d postgres \
  -c "CREATE DATABASE idem" > /dev/null 2>&1 ||
  PGPASSWORD=$PW psql -q -h 127.0.0.1 -p "$PORT" -U idem -d postgres -c "CREATE DATABASE idem" ||
  { echo "with_server: cannot create the database" >&2; exit 1; }
export IDEM_PG_URL="postgres://idem:$PW@127.0.0.1:$PORT/idem"
export IDEM_PG_CTL="$T/ctl"
cat > "$T/ctl" <<CTL
#!/bin/bash
# stop | start | restart | kill the test server
OPTS="$OPTS"
case "\$1" in
  kill) kill -9 "\$(head -1 "$T/data/postmaster.pid")" ;;
  start) ${RUNAS[*]} "$PGCTL" -D "$T/data" -l "$T/server.log" -w -t 60 -o "\$OPTS" start > /dev/null ;;
  *) ${RUNAS[*]} "$PGCTL" -D "$T/data" -l "$T/server.log" -w -t 60 -o "\$OPTS" "\$1" -m fast > /dev/null ;;
esac
CTL
chmod 755 "$T/ctl"
"$@"
rc=$?
[ "$rc" -ne 0 ] && tail -5 "$T/server.log" | cut -c1-300 >&2
exit $rc
