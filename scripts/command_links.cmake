# command_links.cmake — cmake -DPROGRAM=PATH -DDIR=DIR -P command_links.cmake: one symbolic link per
# command of the registry (instruments/registry.c), DIR/NAME -> phasescope, the names read from
# `PROGRAM --commands` (so the links and the table cannot disagree; tests/check_api_symbols.sh checks
# the build tree's).
execute_process(COMMAND ${PROGRAM} --commands OUTPUT_VARIABLE cmds RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} --commands failed (${rc})")
endif()
string(REPLACE "\n" ";" cmds "${cmds}")
foreach(c ${cmds})
  if(NOT c STREQUAL "")
    file(CREATE_LINK phasescope ${DIR}/${c} SYMBOLIC)
  endif()
endforeach()
