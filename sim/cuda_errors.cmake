# CUresult names and descriptions, generated from the toolkit's cuda.h into
# OUT_DIR/cuda_errors.inc (sim/src/errors.cpp includes it): the simulator's
# build and the sim_config fuzz target's.
function(spillway_generate_cuda_errors out_dir)
  list(GET CUDAToolkit_INCLUDE_DIRS 0 _cuda_inc)
  file(STRINGS ${_cuda_inc}/cuda.h _err_lines
       REGEX "^[ \t]*CUDA_(SUCCESS|ERROR_[A-Z0-9_]+)[ \t]*=[ \t]*[0-9]+")
  set(_errors "")
  foreach(_line IN LISTS _err_lines)
    string(REGEX REPLACE "^[ \t]*(CUDA_[A-Z0-9_]+).*" "\\1" _sym "${_line}")
    string(REGEX REPLACE "^CUDA_(ERROR_)?" "" _words "${_sym}")
    string(TOLOWER "${_words}" _words)
    string(REPLACE "_" " " _words "${_words}")
    if(_sym STREQUAL "CUDA_SUCCESS")
      set(_words "no error")
    endif()
    string(APPEND _errors "SIM_ERROR(${_sym}, \"${_words}\")\n")
  endforeach()
  file(CONFIGURE OUTPUT ${out_dir}/cuda_errors.inc CONTENT "${_errors}")
endfunction()
