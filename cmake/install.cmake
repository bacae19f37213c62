# `cmake --install BUILD --prefix PREFIX [--component spillway]` (docs/install.md):
# GNUInstallDirs' directories, every path between installed files relative,
# so the prefix can be chosen at install time. Included last from the
# top-level CMakeLists.txt, once every target exists.
#
#   BINDIR/spillway-run                        the launcher (its LIBDIR points at LIBDIR)
#   BINDIR/spillway-replay                     the replayer (DT_RPATH: LIBDIR/spillway/sim)
#   LIBDIR/libspillway.so                      the library, spillway::spillway
#   LIBDIR/spillway_bootstrap/sitecustomize.py the bootstrap (its PACKAGE_DIR points at PYTHONDIR)
#   LIBDIR/spillway/sim/                       the simulated GPU the replayer runs on
#   LIBDIR/cmake/spillway/                     spillwayConfig.cmake, ConfigVersion, Targets
#   LIBDIR/pkgconfig/spillway.pc
#   INCLUDEDIR/spillway.h
#   SPILLWAY_INSTALL_PYTHONDIR/spillway/       the Python package, once
include(CMakePackageConfigHelpers)

set(SPILLWAY_INSTALL_PYTHONDIR "${CMAKE_INSTALL_LIBDIR}/python" CACHE STRING
    "Where `cmake --install` puts the Python package `spillway` (relative to the prefix, or absolute)")
set(SPILLWAY_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/spillway")
set(SPILLWAY_INSTALL_SIMDIR "${CMAKE_INSTALL_LIBDIR}/spillway/sim")
set(_spw_staged ${CMAKE_BINARY_DIR}/install-staging)

# `to` relative to the directory `from`, both install destinations. Relative
# when both are (any prefix then works); else absolute under the configured
# prefix, which `--prefix` cannot move.
function(spw_install_relative out from to)
  if(IS_ABSOLUTE "${to}")
    set(rel "${to}")
  elseif(IS_ABSOLUTE "${from}")
    set(rel "${CMAKE_INSTALL_PREFIX}/${to}")
  else()
    file(RELATIVE_PATH rel "/prefix/${from}" "/prefix/${to}")
    if(rel STREQUAL "")
      set(rel ".")
    endif()
  endif()
  set(${out} "${rel}" PARENT_SCOPE)
endfunction()

# A copy of the Python file `in` at `out` with its one top-level line
# `NAME = "..."` set to `value`; a configure error if there is not exactly one.
# Re-run when `in` changes.
function(spw_stage_python in out name value)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${in}")
  file(READ "${in}" text)
  string(REGEX MATCHALL "\n${name} = \"[^\"\n]*\"\n" found "${text}")
  list(LENGTH found n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "${in}: expected one line `${name} = \"...\"`, found ${n}")
  endif()
  string(REGEX REPLACE "\n${name} = \"[^\"\n]*\"\n" "\n${name} = \"${value}\"\n" text "${text}")
  file(WRITE "${out}.tmp" "${text}")
  file(COPY_FILE "${out}.tmp" "${out}" ONLY_IF_DIFFERENT)
  file(REMOVE "${out}.tmp")
endfunction()

spw_install_relative(_spw_bin_to_lib "${CMAKE_INSTALL_BINDIR}" "${CMAKE_INSTALL_LIBDIR}")
spw_install_relative(_spw_boot_to_pkg "${CMAKE_INSTALL_LIBDIR}/spillway_bootstrap"
                     "${SPILLWAY_INSTALL_PYTHONDIR}/spillway")
spw_install_relative(_spw_bin_to_sim "${CMAKE_INSTALL_BINDIR}" "${SPILLWAY_INSTALL_SIMDIR}")
spw_stage_python(${CMAKE_SOURCE_DIR}/tools/spillway-run ${_spw_staged}/spillway-run
                 LIBDIR "${_spw_bin_to_lib}")
spw_stage_python(${CMAKE_SOURCE_DIR}/python/bootstrap/sitecustomize.py
                 ${_spw_staged}/sitecustomize.py PACKAGE_DIR "${_spw_boot_to_pkg}")

# The library and its header; the exported target spillway::spillway.
install(TARGETS spillway EXPORT spillwayTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT spillway)
install(FILES ${CMAKE_SOURCE_DIR}/shim/include/spillway.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT spillway)

# The drop-in: launcher, bootstrap, package (docs/python.md).
install(PROGRAMS ${_spw_staged}/spillway-run DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT spillway)
install(FILES ${_spw_staged}/sitecustomize.py
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/spillway_bootstrap COMPONENT spillway)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/python/spillway DESTINATION ${SPILLWAY_INSTALL_PYTHONDIR}
        COMPONENT spillway FILES_MATCHING PATTERN "*.py")

# The replayer and the simulated GPU it links: in a directory of their own,
# so that the simulated libcuda.so.1 never stands in for a real driver (when
# the replayer is built: SPILLWAY_REPLAYER, CMakeLists.txt).
if(TARGET spillway-replay)
  target_compile_definitions(spillway-replay PRIVATE
    REPLAY_INSTALLED_SHIM="${_spw_bin_to_lib}/libspillway.so"
    REPLAY_INSTALLED_CUPTI="${_spw_bin_to_sim}/libcupti.so.13")
  if(IS_ABSOLUTE "${_spw_bin_to_sim}")
    set(_spw_replay_rpath "${_spw_bin_to_sim}")
  else()
    set(_spw_replay_rpath "$ORIGIN/${_spw_bin_to_sim}")
  endif()
  set_target_properties(spillway-replay PROPERTIES INSTALL_RPATH "${_spw_replay_rpath}")
  install(TARGETS spillway-replay RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT spillway)
  install(TARGETS simcuda simcupti LIBRARY DESTINATION ${SPILLWAY_INSTALL_SIMDIR}
          NAMELINK_SKIP COMPONENT spillway)
endif()

# find_package(spillway): spillwayConfig.cmake, its version file, the targets.
install(EXPORT spillwayTargets NAMESPACE spillway:: DESTINATION ${SPILLWAY_INSTALL_CMAKEDIR}
        COMPONENT spillway)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/spillwayConfig.cmake.in
  ${_spw_staged}/spillwayConfig.cmake INSTALL_DESTINATION ${SPILLWAY_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the ABI, so only the same minor version is compatible.
write_basic_package_version_file(${_spw_staged}/spillwayConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${_spw_staged}/spillwayConfig.cmake ${_spw_staged}/spillwayConfigVersion.cmake
        DESTINATION ${SPILLWAY_INSTALL_CMAKEDIR} COMPONENT spillway)

# pkg-config: the prefix relative to the .pc file (${pcfiledir}), so it moves with --prefix.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(SPW_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _spw_pc_to_prefix "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" _spw_pc_to_prefix "${_spw_pc_to_prefix}")
  set(SPW_PC_PREFIX "\${pcfiledir}/${_spw_pc_to_prefix}")
endif()
foreach(_dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(SPW_PC_${_dir} "${CMAKE_INSTALL_${_dir}}")
  else()
    set(SPW_PC_${_dir} "\${prefix}/${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()
configure_file(${CMAKE_SOURCE_DIR}/cmake/spillway.pc.in ${_spw_staged}/spillway.pc @ONLY)
install(FILES ${_spw_staged}/spillway.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT spillway)
