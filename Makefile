# The two commands of the README, and their parts.  CMake does the building;
# this file only strings the steps together.
#
#   make demo   install what is missing, build, and run `idem demo`
#   make test   the whole suite: Release and ASan+UBSan builds with -Werror,
#               every CTest test in each, the threaded tests under
#               ThreadSanitizer, and a short libFuzzer run
#   make screenshots  the console's pictures (docs/img/console-*.png), taken
#               by its browser test (tests/console/browser_test.mjs)

JOBS ?= 2
FUZZ_SECONDS ?= 15

TORTURE_N ?= 2000
TORTURE_J ?= 2

.PHONY: all deps build demo test test-release test-asan tsan fuzz bench torture torture-pg install clean screenshots

all: build

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DIDEM_WERROR=ON
	cmake --build build -j $(JOBS)

demo: build
	@build/idem demo

test: deps
	@scripts/install-deps.sh --peers
	$(MAKE) test-release test-asan tsan fuzz

test-release:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DIDEM_WERROR=ON
	cmake --build build -j $(JOBS)
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DIDEM_WERROR=ON -DIDEM_SANITIZE=ON
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer: the tests labelled tsan (tests/CMakeLists.txt: the
# guard's workers, the store's group commit, the command's threads).  A
# report ends its process and leaves a file in build-tsan/tsan/: any file
# there fails the target, whatever the tests' exit statuses said.
tsan:
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDEM_WERROR=ON -DIDEM_TSAN=ON
	cmake --build build-tsan -j $(JOBS)
	rm -rf build-tsan/tsan && mkdir build-tsan/tsan
	cd build-tsan && { ctest --output-on-failure -j $(JOBS) -L tsan; rc=$$?; \
	  if [ -n "$$(ls tsan)" ]; then cat tsan/*; \
	    echo "ThreadSanitizer: $$(ls tsan | wc -l) report(s), above"; exit 1; fi; \
	  exit $$rc; }

# A short coverage-guided run of each target from the committed corpus.
fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDEM_FUZZ=ON -DIDEM_TESTS=OFF
	cmake --build build-fuzz -j $(JOBS) --target fuzz_canon fuzz_key fuzz_policy fuzz_http fuzz_mcp fuzz_serve fuzz_sse
	scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

# SPEC §11: the torture suite (tests/torture/README.md), N trials on SQLite,
# or on a throwaway PostgreSQL server (torture-pg).
torture: build
	python3 tests/torture/torture.py -n $(TORTURE_N) -j $(TORTURE_J) --idem build/idem

torture-pg: build
	@scripts/install-deps.sh --peers
	tests/pg/with_server.sh sh -c 'python3 tests/torture/torture.py -n $(TORTURE_N) -j $(TORTURE_J) --idem build/idem --log "$$IDEM_PG_URL"'

bench: build
	@scripts/install-deps.sh --peers
	build/idem bench

screenshots: build
	@scripts/install-deps.sh --peers
	IDEM_SCREENSHOTS=$(CURDIR)/docs/img IDEM_LIBRARY=$(CURDIR)/build/libidem.so \
		node tests/console/browser_test.mjs build/idem

install: build
	cmake --install build

clean:
	rm -rf build build-asan build-tsan build-fuzz
