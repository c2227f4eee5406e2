# FindSOCI
# --------
# Debian's libsoci-dev (4.0.3) ships neither a CMake package nor a pkg-config file, so this
# module finds its headers and libraries.
#
# Components: core (always), postgresql, mysql, sqlite3.
# Imported targets: SOCI::core, SOCI::postgresql, SOCI::mysql, SOCI::sqlite3.
# Result variables: SOCI_FOUND, SOCI_INCLUDE_DIR, SOCI_<component>_LIBRARY, SOCI_VERSION.

find_path(SOCI_INCLUDE_DIR NAMES soci/soci.h)
find_library(SOCI_core_LIBRARY NAMES soci_core)

if(SOCI_INCLUDE_DIR AND EXISTS "${SOCI_INCLUDE_DIR}/soci/version.h")
  file(STRINGS "${SOCI_INCLUDE_DIR}/soci/version.h" _soci_version_line
       REGEX "^#define SOCI_VERSION [0-9]+")
  string(REGEX REPLACE "^#define SOCI_VERSION ([0-9]+).*" "\\1" _soci_v "${_soci_version_line}")
  if(_soci_v)
    math(EXPR _major "${_soci_v} / 100000")
    math(EXPR _minor "${_soci_v} / 100 % 1000")
    math(EXPR _patch "${_soci_v} % 100")
    set(SOCI_VERSION "${_major}.${_minor}.${_patch}")
  endif()
endif()

set(_soci_required SOCI_INCLUDE_DIR SOCI_core_LIBRARY)
if(SOCI_core_LIBRARY)
  set(SOCI_core_FOUND TRUE)
endif()
foreach(_comp IN LISTS SOCI_FIND_COMPONENTS)
  if(_comp STREQUAL "core")
    continue()
  endif()
  find_library(SOCI_${_comp}_LIBRARY NAMES soci_${_comp})
  if(SOCI_${_comp}_LIBRARY)
    set(SOCI_${_comp}_FOUND TRUE)
  endif()
  if(SOCI_FIND_REQUIRED_${_comp})
    list(APPEND _soci_required SOCI_${_comp}_LIBRARY)
  endif()
endforeach()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SOCI REQUIRED_VARS ${_soci_required} VERSION_VAR SOCI_VERSION
                                  HANDLE_COMPONENTS)

if(SOCI_FOUND AND NOT TARGET SOCI::core)
  add_library(SOCI::core UNKNOWN IMPORTED)
  set_target_properties(SOCI::core PROPERTIES IMPORTED_LOCATION "${SOCI_core_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${SOCI_INCLUDE_DIR}")
  foreach(_comp IN LISTS SOCI_FIND_COMPONENTS)
    if(NOT _comp STREQUAL "core" AND SOCI_${_comp}_LIBRARY AND NOT TARGET SOCI::${_comp})
      add_library(SOCI::${_comp} UNKNOWN IMPORTED)
      set_target_properties(SOCI::${_comp} PROPERTIES IMPORTED_LOCATION "${SOCI_${_comp}_LIBRARY}"
                                                      INTERFACE_LINK_LIBRARIES SOCI::core)
      # The backend headers include the client library's headers.
      if(_comp STREQUAL "postgresql")
        find_package(PostgreSQL REQUIRED)
        target_link_libraries(SOCI::postgresql INTERFACE PostgreSQL::PostgreSQL)
      elseif(_comp STREQUAL "mysql")
        find_path(SOCI_MYSQL_INCLUDE_DIR NAMES mysql.h PATH_SUFFIXES mariadb mysql)
        find_library(SOCI_MYSQL_CLIENT_LIBRARY NAMES mariadb mysqlclient)
        target_include_directories(SOCI::mysql INTERFACE "${SOCI_MYSQL_INCLUDE_DIR}")
        target_link_libraries(SOCI::mysql INTERFACE "${SOCI_MYSQL_CLIENT_LIBRARY}")
      elseif(_comp STREQUAL "sqlite3")
        find_package(SQLite3 REQUIRED)
        target_link_libraries(SOCI::sqlite3 INTERFACE SQLite::SQLite3)
      endif()
    endif()
  endforeach()
endif()
mark_as_advanced(SOCI_INCLUDE_DIR SOCI_core_LIBRARY)
