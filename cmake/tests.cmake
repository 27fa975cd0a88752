# One ctest run covers: C unit tests (runtime/tests/test_*.c), busted specs of the
# Lua API loaded into stock lua5.4 (spec/*_spec.lua), and end-to-end scripts that
# run real captcharun processes (spec/e2e/*.sh).

find_program(LUA54 lua5.4 REQUIRED)
find_program(BUSTED busted REQUIRED)

set(CR_TEST_ENV
  "LUA_PATH=${CMAKE_SOURCE_DIR}/lua/?.lua\;${CMAKE_SOURCE_DIR}/lua/?/init.lua\;${CMAKE_SOURCE_DIR}/spec/?.lua\;\;"
  "LUA_CPATH=${CMAKE_BINARY_DIR}/?.so\;\;"
  "CAPTCHARUN=$<TARGET_FILE:captcharun>"
  "CR_SRC=${CMAKE_SOURCE_DIR}"
  "CR_BUILD=${CMAKE_BINARY_DIR}"
  "NO_COLOR=1")
if(CR_SANITIZE)
  # Stock lua5.4 is not instrumented: preload the sanitizer runtimes so the module
  # can be loaded into it. Leaks are checked where we own main() (C tests, e2e).
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                  OUTPUT_VARIABLE CR_LIBASAN OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libubsan.so
                  OUTPUT_VARIABLE CR_LIBUBSAN OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(CR_SPEC_ENV "LD_PRELOAD=${CR_LIBASAN}:${CR_LIBUBSAN}" "ASAN_OPTIONS=detect_leaks=0")
  list(APPEND CR_TEST_ENV "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1" "CR_SANITIZE=1"
       "CR_LUA_PRELOAD=${CR_LIBASAN}:${CR_LIBUBSAN}")
else()
  set(CR_SPEC_ENV "")
endif()

file(GLOB CR_C_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/runtime/tests/test_*.c)
foreach(src ${CR_C_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/runtime ${CMAKE_SOURCE_DIR}/runtime/tests)
  target_link_libraries(${name} PRIVATE captcharun_rt PkgConfig::LUA)
  add_test(NAME c.${name} COMMAND ${name})
  set_tests_properties(c.${name} PROPERTIES TIMEOUT 120 ENVIRONMENT "${CR_TEST_ENV}")
endforeach()

file(GLOB CR_SPECS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/spec/*_spec.lua)
foreach(spec ${CR_SPECS})
  get_filename_component(name ${spec} NAME_WE)
  add_test(NAME spec.${name} COMMAND ${LUA54} ${BUSTED} --output=TAP ${spec}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(spec.${name} PROPERTIES TIMEOUT 300
                       ENVIRONMENT "${CR_TEST_ENV};${CR_SPEC_ENV}")
endforeach()

file(GLOB CR_E2E CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/spec/e2e/*.sh)
foreach(script ${CR_E2E})
  get_filename_component(name ${script} NAME_WE)
  add_test(NAME e2e.${name} COMMAND bash ${script} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(e2e.${name} PROPERTIES TIMEOUT 300 ENVIRONMENT "${CR_TEST_ENV}")
endforeach()
