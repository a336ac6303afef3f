# The PostgreSQL store, on a real server that each test starts and removes
# (tests/pg/with_server.sh): the store conformance suite (tests/test_store.c,
# the same suite as the SQLite store's, given --log URL), the guard through
# processes (tests/pg/pg_test.sh), and a call during an outage (pg/outage.c).
add_test(NAME store_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  sh -c "exec \"$0\" --log \"$IDEM_PG_URL\"" $<TARGET_FILE:test_store>)
add_executable(race_guard pg/race_guard.c)
target_compile_options(race_guard PRIVATE ${IDEM_WARNINGS})
target_link_libraries(race_guard PRIVATE idem_static)
if(IDEM_SANITIZE)
  set(PG_RACE_ACTIONS 8)
else()
  set(PG_RACE_ACTIONS 25)
endif()
add_test(NAME guard_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/pg_test.sh $<TARGET_FILE:idem>
  $<TARGET_FILE:race_guard> ${PG_RACE_ACTIONS})
add_executable(outage_pg pg/outage.c)
target_compile_options(outage_pg PRIVATE ${IDEM_WARNINGS})
target_link_libraries(outage_pg PRIVATE idem_static)
add_test(NAME outage_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  sh -c "exec \"$0\" \"$IDEM_PG_URL\"" $<TARGET_FILE:outage_pg>)
add_test(NAME turns_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  sh -c "\"$0\" \"$IDEM_PG_URL\" threads 100 && \"$0\" \"$IDEM_PG_URL\" procs 20"
  $<TARGET_FILE:turn_race>)
# The decision rules walked as a model (tests/rules_walk.c) on PostgreSQL
add_test(NAME rules_walk_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  sh -c "exec \"$0\" \"$IDEM_PG_URL\" 20 150" $<TARGET_FILE:rules_walk>)
add_test(NAME resolve_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  sh -c "exec ${BASH} \"$0\" \"$1\" \"$IDEM_PG_URL\""
  ${CMAKE_CURRENT_SOURCE_DIR}/resolve_test.sh $<TARGET_FILE:idem>)
add_test(NAME seams_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  sh -c "exec \"$0\" \"$IDEM_PG_URL\"" $<TARGET_FILE:test_seams>)
add_test(NAME console_pg COMMAND ${BASH} ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
  sh -c "exec \"$0\" \"$IDEM_PG_URL\"" $<TARGET_FILE:test_console>)
# The console in a browser (tests/console/browser_test.mjs) on PostgreSQL
if(NODE)
  add_test(NAME console_browser_pg COMMAND ${BASH}
    ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
    sh -c "exec \"$0\" \"$1\" \"$2\" \"$IDEM_PG_URL\"" ${NODE}
    ${CMAKE_CURRENT_SOURCE_DIR}/console/browser_test.mjs $<TARGET_FILE:idem>)
  idem_console_test(console_browser_pg)
  # and its /metrics and /api against a PostgreSQL log
  add_test(NAME console_metrics_pg COMMAND ${BASH}
    ${CMAKE_CURRENT_SOURCE_DIR}/pg/with_server.sh
    sh -c "exec \"$0\" \"$1\" \"$2\" \"$IDEM_PG_URL\"" ${NODE}
    ${CMAKE_CURRENT_SOURCE_DIR}/console/metrics_test.mjs $<TARGET_FILE:idem>)
  idem_console_test(console_metrics_pg)
endif()
