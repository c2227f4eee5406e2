# Generates a C++ source holding every migrations/<backend>/*.sql file, so that the installed
# library carries its own schema. Run as: cmake -DSRC=<migrations dir> -DOUT=<file.cpp> -P this
file(GLOB _files RELATIVE "${SRC}" "${SRC}/*/*.sql")
list(SORT _files)
set(_body "")
foreach(_f IN LISTS _files)
  get_filename_component(_backend "${_f}" DIRECTORY)
  get_filename_component(_name "${_f}" NAME)
  file(READ "${SRC}/${_f}" _text)
  string(FIND "${_text}" ")dblock_sql\"" _clash)
  if(NOT _clash EQUAL -1)
    message(FATAL_ERROR "${_f} contains the raw-string delimiter")
  endif()
  string(APPEND _body "    {\"${_backend}\", \"${_name}\", R\"dblock_sql(${_text})dblock_sql\"},\n")
endforeach()
set(_content "// Generated from migrations/ by cmake/embed_migrations.cmake. Do not edit.
#include <vector>

namespace dblock::detail {
struct embedded_file {
  const char* backend;
  const char* name;
  const char* text;
};
const std::vector<embedded_file>& embedded_migrations() {
  static const std::vector<embedded_file> files = {
${_body}  };
  return files;
}
}  // namespace dblock::detail
")
if(EXISTS "${OUT}")
  file(READ "${OUT}" _old)
endif()
if(NOT _old STREQUAL _content)
  file(WRITE "${OUT}" "${_content}")
endif()
