# Debian packages, made by `cpack -G DEB` in a build directory from the install components of
# CMakeLists.txt:
#   libdblock0     (lib) the shared library: libdblock.so.0 -> libdblock.so.0.1.0
#   libdblock-dev  (dev) the headers, libdblock.so and libdblock.a, the CMake package
#                  (find_package(dblock)), dblock.pc and the migrations (share/dblock/migrations)
#   dblock         (cli) the command-line tool and its man page, dblock(1)
# Their Depends come from dpkg-shlibdeps, plus libdblock0 (= version) for the other two and, for
# libdblock-dev, the -dev packages that find_package(dblock) and dblock.pc look for.
#
# One build makes all three: a shared one (libdblock.a is archived from the same objects), with
# the install prefix of the packages (/usr, where GNUInstallDirs picks the multiarch libdir):
#   cmake -S . -B build-deb -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
#         -DCMAKE_INSTALL_PREFIX=/usr -DDBLOCK_TESTS=OFF -DDBLOCK_EXAMPLES=OFF \
#         -DDBLOCK_BENCH=OFF -DDBLOCK_PROMETHEUS=OFF
#   cmake --build build-deb -j && (cd build-deb && cpack -G DEB)
# scripts/package-test.sh does that, installs the packages, uses them and removes them.
# Not packaged: dblock-bench and dblock_reaper_bench (never installed), and dblock::prometheus
# (install component prometheus: it would make libdblock0 depend on prometheus-cpp).
#
# Included from the top-level CMakeLists.txt only, when DBLOCK_INSTALL is ON.

# dblock(1): help2man turns `dblock --help`, and every subcommand's, into a man page
# (cmake/man_page.cmake); not in the sanitizer and fuzzer builds, which are never installed (and
# would run the instrumented tool while building).
if(DBLOCK_CLI AND NOT _sanitize)
  find_program(DBLOCK_HELP2MAN help2man)
  if(DBLOCK_HELP2MAN)
    set(_dblock_man "${PROJECT_BINARY_DIR}/man/dblock.1.gz")
    add_custom_command(
      OUTPUT "${_dblock_man}"
      COMMAND ${CMAKE_COMMAND} -E make_directory "${PROJECT_BINARY_DIR}/man"
      COMMAND ${CMAKE_COMMAND} -DDBLOCK=$<TARGET_FILE:dblock> -DHELP2MAN=${DBLOCK_HELP2MAN}
              -DVERSION=${PROJECT_VERSION} -DOUT=${_dblock_man}
              -P ${PROJECT_SOURCE_DIR}/cmake/man_page.cmake
      DEPENDS dblock ${PROJECT_SOURCE_DIR}/cmake/man_page.cmake
      COMMENT "Writing the dblock(1) man page from dblock --help (help2man)"
      VERBATIM)
    add_custom_target(dblock_man ALL DEPENDS "${_dblock_man}")
    install(FILES "${_dblock_man}" DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT cli)
  else()
    message(STATUS "help2man not found: no dblock(1) man page (Debian: help2man)")
  endif()
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dblock)
set(CPACK_PACKAGE_VENDOR dblock)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(DBLOCK_PACKAGE_MAINTAINER "dblock maintainers <dblock@localhost>"
    CACHE STRING "Maintainer field of the Debian packages")
set(CPACK_PACKAGE_CONTACT "${DBLOCK_PACKAGE_MAINTAINER}")
# The packages hold what `cmake --install` puts under CMAKE_INSTALL_PREFIX, installed with DESTDIR
# so that the prefix written into dblock.pc at install time is the real one, not CPack's staging
# directory.
set(CPACK_PACKAGING_INSTALL_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(CPACK_SET_DESTDIR ON)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL lib dev)
if(DBLOCK_CLI)
  list(APPEND CPACK_COMPONENTS_ALL cli)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # NAME_VERSION-RELEASE_ARCH.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps finds libdblock.so.0, which the tool needs, in the build directory (and leaves it
# out: libdblock0 is named by the component dependency below).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${PROJECT_BINARY_DIR}")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)  # libdblock0's shlibs file, for packages using it
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)  # a component dependency: "libdblock0 (= VERSION)"

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libdblock0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_LIB_DESCRIPTION
    "${PROJECT_DESCRIPTION} (shared library)
 dblock: leases with fencing tokens, row locks, optimistic updates, semaphores, read-write
 locks, lock sets, leader election and more, on the database you already run.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libdblock-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DEPENDS lib)
# What find_package(dblock) (dblockConfig.cmake, FindSOCI.cmake) and dblock.pc look for, and
# libboost-dev: Debian's <soci/soci.h>, which fenced() callers include, includes Boost headers
# (SOCI_HAVE_BOOST) while libsoci-dev does not depend on them.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libsoci-dev, libboost-dev, libpq-dev, libmariadb-dev, libsqlite3-dev, liburiparser-dev")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "${PROJECT_DESCRIPTION} (development files)
 Headers, libdblock.so and libdblock.a, the CMake package (find_package(dblock)),
 dblock.pc for pkg-config, and the SQL of the schema migrations.")

set(CPACK_DEBIAN_CLI_PACKAGE_NAME dblock)
set(CPACK_DEBIAN_CLI_PACKAGE_SECTION admin)
set(CPACK_COMPONENT_CLI_DEPENDS lib)
set(CPACK_COMPONENT_CLI_DESCRIPTION
    "${PROJECT_DESCRIPTION} (command-line tool)
 dblock migrates the schema, runs commands under a lease (dblock exec), shows and releases
 locks, reaps expired rows, hands out IDs and names the leader of an election.")

include(CPack)
