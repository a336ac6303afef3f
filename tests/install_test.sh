#!/bin/sh
# `cmake --install` puts the command, both libraries, the headers, idem.pc,
# the CMake package and the man page under the prefix, and a program built
# with `pkg-config --cflags --libs idem` against that prefix runs.
#   tests/install_test.sh BUILD_DIR [CFLAGS [HTTP]]
# HTTP 0: the build has no HTTP support, and the installed demo says so.
set -u
build=$1
extra=${2:-}
http=${3:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

cmake --install "$build" --prefix "$tmp/p" >/dev/null || bad "cmake --install failed"
for f in bin/idem bin/idem-paysim lib/libidem.a lib/libidem.so include/idem.h include/idem_version.h \
         lib/pkgconfig/idem.pc lib/cmake/idem/idemConfig.cmake share/man/man1/idem.1; do
  if [ -e "$tmp/p/$f" ]; then ok; else bad "missing $f"; fi
done
"$tmp/p/bin/idem" --version | grep -q '^idem [0-9]*\.[0-9]*\.[0-9]*$' && ok || bad "idem --version"
# the installed demo finds the installed simulator next to it
if [ "$http" = 1 ]; then
  env -u IDEM_PAYSIM "$tmp/p/bin/idem" demo >"$tmp/demo.out" 2>&1 && ok || bad "installed idem demo: $(tail -5 "$tmp/demo.out")"
else
  env -u IDEM_PAYSIM "$tmp/p/bin/idem" demo >"$tmp/demo.out" 2>&1 && bad "installed idem demo ran without HTTP support"
  grep -q "built without HTTP support" "$tmp/demo.out" && ok || bad "installed idem demo without HTTP: $(tail -5 "$tmp/demo.out")"
fi

cat > "$tmp/t.c" <<'C'
#include <idem.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  idem_canon *c;
  idem_key k;
  idem_call call = {.size = sizeof call, .session = "sess_1",
                    .call_id = "toolu_7", .tool = "refund_payment",
                    .args = "{\"order_id\":\"ord_1\",\"amount_cents\":6000}"};
  call.args_len = strlen(call.args);
  if (idem_version_number() != IDEM_VERSION_NUMBER) return 3;
  if (idem_canon_open(&c) != IDEM_OK) return 1;
  if (idem_key_mint(c, &call, NULL, &k) != IDEM_OK) return 2;
  puts(k.key);
  idem_canon_close(c);
  return 0;
}
C
export PKG_CONFIG_PATH="$tmp/p/lib/pkgconfig"
if cc $extra -o "$tmp/t" "$tmp/t.c" $(pkg-config --cflags --libs idem) 2>"$tmp/cc.log"; then
  out=$(LD_LIBRARY_PATH="$tmp/p/lib" "$tmp/t")
  [ "$out" = "sess_1:toolu_7:a280fb850f483293" ] && ok || bad "shared-library program printed '$out'"
else
  bad "could not build against the installed library: $(cat "$tmp/cc.log")"
fi
# the static archive, with the private dependencies idem.pc declares
static_deps=$(pkg-config --static --libs idem | sed 's/-lidem//; s/-L[^ ]*//')
if cc $extra -o "$tmp/ts" "$tmp/t.c" $(pkg-config --cflags idem) "$tmp/p/lib/libidem.a" $static_deps 2>"$tmp/cc2.log"; then
  [ "$("$tmp/ts")" = "sess_1:toolu_7:a280fb850f483293" ] && ok || bad "static program"
else
  bad "could not link the static library: $(cat "$tmp/cc2.log")"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
