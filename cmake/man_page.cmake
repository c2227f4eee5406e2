# Writes the dblock(1) man page (cmake/packaging.cmake runs it after every build of the tool):
# help2man turns `dblock --help` into the page, and a section SUBCOMMANDS holds the `--help` of
# every subcommand that `dblock --help` lists, so that the page documents every option.
#   cmake -DDBLOCK=path/to/dblock -DHELP2MAN=help2man -DVERSION=0.1.0 -DOUT=dir/dblock.1.gz
#         -P cmake/man_page.cmake
foreach(_var DBLOCK HELP2MAN VERSION OUT)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "man_page.cmake: -D${_var}= is required")
  endif()
endforeach()

function(run_help out_var)
  execute_process(COMMAND ${DBLOCK} ${ARGN} --help OUTPUT_VARIABLE _text RESULT_VARIABLE _rc
                  ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "man_page.cmake: dblock ${ARGN} --help exited with ${_rc}: ${_err}")
  endif()
  set(${out_var} "${_text}" PARENT_SCOPE)
endfunction()

# The subcommands: the lines "  NAME  description" after "Subcommands:" in `dblock --help`.
run_help(_top)
string(REGEX REPLACE ".*\nSubcommands:\n" "" _list "${_top}")
string(REGEX REPLACE "\n\n.*" "" _list "${_list}")
string(REGEX MATCHALL "(^|\n)  [a-z][a-z-]*" _names "${_list}")
if(NOT _names OR _list STREQUAL _top)
  message(FATAL_ERROR "man_page.cmake: no subcommands in dblock --help:\n${_top}")
endif()

# The last paragraph of `dblock --help` (its footer, the exit statuses) ends every
# subcommand's help too: the page shows it once.
string(REGEX REPLACE ".*\n\n" "\n\n" _footer "${_top}")

# help2man's --include file: "[SECTION]" and roff text; the help is shown as written (.nf),
# with roff's escape character, and roff's control characters and help2man's "[" at the start
# of a line, neutralised.
set(_include "[SUBCOMMANDS]\n")
foreach(_name IN LISTS _names)
  string(STRIP "${_name}" _name)
  run_help(_help ${_name})
  string(REPLACE "${_footer}" "\n" _help "${_help}")
  string(REPLACE "Usage: ${DBLOCK} " "Usage: dblock " _help "${_help}")
  string(REPLACE "\\" "\\e" _help "${_help}")
  string(REGEX REPLACE "(^|\n)([.'[])" "\\1\\\\&\\2" _help "${_help}")
  string(APPEND _include ".SS \"dblock ${_name}\"\n.nf\n${_help}.fi\n")
endforeach()
get_filename_component(_dir "${OUT}" DIRECTORY)
string(REGEX REPLACE "\\.gz$" "" _page "${OUT}")
file(WRITE "${_dir}/dblock-subcommands.h2m" "${_include}")

execute_process(
  COMMAND ${HELP2MAN} --no-info --section=1 --version-string=${VERSION}
          "--name=distributed locks on PostgreSQL, MySQL/MariaDB and SQLite"
          --include=${_dir}/dblock-subcommands.h2m --output=${_page} ${DBLOCK}
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "man_page.cmake: help2man failed (${_rc})")
endif()
execute_process(COMMAND gzip -9nf ${_page} RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "man_page.cmake: gzip ${_page} failed (${_rc})")
endif()
