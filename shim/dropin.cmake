# The drop-in parts around libspillway.so (docs/install.md): the Python
# bootstrap directory next to the library and the spillway-run launcher in the
# build tree. Included from shim/CMakeLists.txt; what `cmake --install` and
# the wheel install is in cmake/install.cmake and setup.py.
#
#   build/lib/spillway_bootstrap/sitecustomize.py   (found by the constructor in
#   build/lib/spillway_bootstrap/spillway/*.py       bootstrap.cpp, via dladdr)
#   build/bin/spillway-run

set(SPW_PY_DIR ${CMAKE_SOURCE_DIR}/python)
set(SPW_BOOT_OUT ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/spillway_bootstrap)
set(SPW_PY_FILES spillway/__init__.py spillway/_bootstrap.py)

set(_boot_outputs ${SPW_BOOT_OUT}/sitecustomize.py ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/spillway-run)
set(_boot_commands
  COMMAND ${CMAKE_COMMAND} -E make_directory ${SPW_BOOT_OUT}/spillway
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${SPW_PY_DIR}/bootstrap/sitecustomize.py
          ${SPW_BOOT_OUT}/sitecustomize.py
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${CMAKE_SOURCE_DIR}/tools/spillway-run
          ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/spillway-run)
set(_boot_depends ${SPW_PY_DIR}/bootstrap/sitecustomize.py ${CMAKE_SOURCE_DIR}/tools/spillway-run)
foreach(f ${SPW_PY_FILES})
  list(APPEND _boot_outputs ${SPW_BOOT_OUT}/${f})
  list(APPEND _boot_depends ${SPW_PY_DIR}/${f})
  list(APPEND _boot_commands COMMAND ${CMAKE_COMMAND} -E copy_if_different ${SPW_PY_DIR}/${f}
       ${SPW_BOOT_OUT}/${f})
endforeach()
add_custom_command(OUTPUT ${_boot_outputs} ${_boot_commands}
                   DEPENDS ${_boot_depends}
                   COMMENT "spillway: Python bootstrap and spillway-run")
add_custom_target(spillway_dropin ALL DEPENDS ${_boot_outputs})
add_dependencies(spillway spillway_dropin)
