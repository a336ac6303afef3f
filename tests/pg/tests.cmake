# The PostgreSQL store, on a real server that each test starts and removes
# (tests/pg/with_server.sh): the store conformance suite (tests/test_store.c,
# the same suite as the SQLite store's, given --log URL), and the guard through
# processes (tests/pg/pg_test.sh).
add_test(NAME store_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  sh -c "exec \"$0\" --log \"$IDEM_PG_URL\"" $<TARGET_FILE:test_store>)
