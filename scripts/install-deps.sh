#!/bin/sh
# Install what building and testing idem needs on Debian, and nothing that is
# already there.  Safe to run again; uses sudo when not root.
#
#   scripts/install-deps.sh          build and test dependencies
#   scripts/install-deps.sh --peers  also the npm test peers (tests/peers, tests/mcp,
#                                    tests/console) and bindings/node's packages
set -eu

PKGS="gcc make cmake pkg-config libssl-dev libjansson-dev libsqlite3-dev libunistring-dev libcurl4-openssl-dev libmicrohttpd-dev curl python3 clang libclang-rt-dev"
# the Python binding's tests: pip and venv (pip brings setuptools and wheel,
# the offline build backend of `pip install ./bindings/python`)
PKGS="$PKGS python3-pip python3-venv"
# the PostgreSQL store: libpq to build, a server for its tests (tests/pg)
PKGS="$PKGS libpq-dev postgresql"
# the console's browser tests (tests/console): Debian's chromium, driven by
# puppeteer-core, and a font for its screenshots
PKGS="$PKGS chromium fonts-dejavu-core"
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs"
command -v npm >/dev/null 2>&1 || PKGS="$PKGS npm"

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing="$missing $p"
done

if [ -n "$missing" ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing$missing"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
fi

if [ "${1:-}" = "--peers" ]; then
  here=$(cd "$(dirname "$0")/.." && pwd)
  if [ ! -d "$here/tests/peers/node_modules/canonicalize" ]; then
    echo "install-deps: installing the npm test peers"
    (cd "$here/tests/peers" && npm ci --no-audit --no-fund --loglevel=error)
  fi
  # the conformance suite and the node@22 it runs on came later: a checkout
  # installed before them gets them too
  if [ ! -d "$here/tests/mcp/node_modules/@modelcontextprotocol/sdk" ] ||
     [ ! -d "$here/tests/mcp/node_modules/@modelcontextprotocol/conformance" ] ||
     [ ! -x "$here/tests/mcp/node_modules/node/bin/node" ]; then
    echo "install-deps: installing the MCP test peers"
    (cd "$here/tests/mcp" && npm ci --no-audit --no-fund --loglevel=error)
  fi
  if [ ! -d "$here/tests/console/node_modules/puppeteer-core" ] ||
     [ ! -d "$here/tests/console/node_modules/parse-prometheus-text-format" ]; then
    echo "install-deps: installing the console's test peers"
    (cd "$here/tests/console" && npm ci --no-audit --no-fund --loglevel=error)
  fi
  if [ ! -d "$here/bindings/node/node_modules/koffi" ]; then
    echo "install-deps: installing the Node binding's packages"
    (cd "$here/bindings/node" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
