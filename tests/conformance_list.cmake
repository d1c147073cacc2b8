# Post-build step of test_conformance: writes OUT, which sets MGT_CONFORMANCE_OPS to the ops that
# `EXE --list` prints (one a line, from the op list in src/device/op.h). The CTest include file
# that tests/CMakeLists.txt generates turns each into a test conformance.<op>, as
# gtest_discover_tests does for gtest binaries. Usage: cmake -D EXE=... -D OUT=... -P this file
execute_process(COMMAND "${EXE}" --list RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --list failed (${rc}): ${err}")
endif()
string(REGEX REPLACE "\n$" "" out "${out}")
string(REPLACE "\n" ";" ops "${out}")
foreach(op IN LISTS ops)
  if(NOT op MATCHES "^[a-z0-9_]+$")
    message(FATAL_ERROR "${EXE} --list printed '${op}', which is no op name")
  endif()
endforeach()
list(LENGTH ops n)
if(n EQUAL 0)
  message(FATAL_ERROR "${EXE} --list printed no ops")
endif()
file(WRITE "${OUT}.tmp" "# written by tests/conformance_list.cmake from `test_conformance --list`\nset(MGT_CONFORMANCE_OPS ${ops})\n")
file(RENAME "${OUT}.tmp" "${OUT}")
