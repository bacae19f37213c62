// Fault injection for the CUPTI entry points, as SIMCUDA_FAIL is for the
// driver's (sim/src/faults.h, docs/sim.md): SIMCUPTI_FAIL makes the nth call
// of a named entry point fail without doing anything, with
// CUPTI_ERROR_UNKNOWN ("an unknown internal error has occurred",
// cupti_result.h: what any entry point may return) or the error the spec
// names.
//
// Spec: name:n[+][:CUPTI_ERROR_X], comma-separated; `name` is the base name
// (cuptiSubscribe covers cuptiSubscribe_v2); n is 1-based; `+` fails that
// call and every later one. Read at the first call of an entry point that
// takes part; a bad spec ends the process with a message (a harness error,
// not a job's). Each injected failure is said on stderr, so that a harness
// can tell a failure that happened from one never reached.
#pragma once

#include <cupti_result.h>

namespace simcupti {

// Counts a call of `name` and returns the error to inject, or CUPTI_SUCCESS.
CUptiResult injected(const char* name);

}  // namespace simcupti
