// Call counting and fault injection. Every driver entry point reports its call
// here first; SIMCUDA_FAIL (or simcuda_fail_call) makes the nth call of a
// named entry point fail without doing anything, with the error its cuda.h
// documentation lists (CUDA_ERROR_OUT_OF_MEMORY for allocations,
// CUDA_ERROR_INVALID_VALUE otherwise) or the one the spec names.
//
// Spec: name:n[+][:CUDA_ERROR_X], comma-separated. `name` is an exported name
// (cuMemcpyDtoHAsync_v2) or a base name (cuMemcpyDtoHAsync) that matches all
// its versions; n is 1-based; `+` fails that call and every later one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <cuda.h>

namespace sim::faults {

bool configure(const std::string& spec, std::string* error);
// Counts the call and returns the error to inject, or CUDA_SUCCESS.
CUresult on_call(const char* exported_name);
uint64_t count(std::string_view name);
bool add(std::string_view name, uint64_t nth, bool and_after, CUresult error);
void clear();

// "cuMemcpyHtoDAsync_v2_ptsz" -> "cuMemcpyHtoDAsync"
std::string_view base_name(std::string_view exported);
// A rule's name matches an exported name if it is that name or its base name.
bool matches(std::string_view rule, std::string_view exported);

}  // namespace sim::faults

namespace sim::errors {
const char* name(CUresult e);         // nullptr if unknown
const char* description(CUresult e);  // nullptr if unknown
bool from_name(std::string_view name, CUresult* out);
}  // namespace sim::errors
