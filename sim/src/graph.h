// Stream capture and graphs. While a stream captures, the work pushed into it
// is not enqueued: each call records a node (a closure that enqueues a fresh
// op, arguments copied at capture time) into the capture's graph. A graph
// launch replays the nodes, in capture order, on the launch stream. Capture
// order is a topological order of the captured dependencies (a node can only
// depend on nodes captured before it), so running the nodes one after the
// other on one stream honours every dependency (and adds ordering the
// hardware would not: nodes never overlap).
//
// The rules of capture follow cuda.h (docs/sim.md, "Stream capture and
// graphs"): misuse invalidates the capture and returns the documented error.
#pragma once

#include <functional>
#include <memory>

#include <cuda.h>

#include "state.h"

namespace sim::graph {

// Enqueues one fresh op (or, for a graph launched into a stream, several) on
// `s`; `user_handle` is the stream handle the caller gave (what a kernel sees
// in simcuda_launch_info). Returns the last op enqueued, or null.
using Emit =
    std::function<std::shared_ptr<Op>(const std::shared_ptr<Stream>& s, CUstream user_handle)>;

// Work about to be pushed into `s`. If `s` is capturing, records `emit` as a
// node (or refuses: invalidated capture, or `host_waits`, an op the host
// would wait for, which cannot be captured) and sets *captured. If `s` is the
// legacy stream while a blocking stream of its context captures, invalidates
// those captures and returns CUDA_ERROR_STREAM_CAPTURE_IMPLICIT. Otherwise
// *captured is false and the caller enqueues for real.
CUresult intercept(const std::shared_ptr<Stream>& s, const char* what, bool host_waits,
                   const Emit& emit, bool* captured);

// A host wait on `s` (cuStreamSynchronize, cuStreamQuery): refused with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the capture, while `s`
// captures; CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (invalidating) on the legacy
// stream while a blocking stream captures.
CUresult check_host_wait(const std::shared_ptr<Stream>& s, const char* what);
// cuCtxSynchronize: refused, invalidating them all, while any stream of the
// context captures.
CUresult check_context_wait(Context* ctx, const char* what);
// A "potentially unsafe" call (cuThreadExchangeStreamCaptureMode): refused
// with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when the calling thread's mode
// prohibits it; the captures that prohibit it are invalidated.
CUresult check_unsafe(const char* what);

// Events: a record on a capturing stream marks the event as captured (it
// becomes a join point); a record outside capture clears the mark.
CUresult event_record(const std::shared_ptr<Stream>& s, CUevent ev, bool* captured);
// cuStreamWaitEvent on `s`: joins `s` into the event's capture, records an
// in-capture dependency, or refuses a wait that crosses the capture boundary.
CUresult wait_event(const std::shared_ptr<Stream>& s, CUevent ev, unsigned flags, bool* handled);
// cuEventQuery / cuEventSynchronize on an event last recorded in a capture:
// CUDA_ERROR_CAPTURED_EVENT.
CUresult check_event_use(CUevent ev, const char* what);

CUresult begin_capture(const std::shared_ptr<Stream>& s, CUstreamCaptureMode mode);
CUresult end_capture(const std::shared_ptr<Stream>& s, CUgraph* out);
CUresult is_capturing(const std::shared_ptr<Stream>& s, CUstreamCaptureStatus* status);
CUresult capture_info(const std::shared_ptr<Stream>& s, CUstreamCaptureStatus* status,
                      cuuint64_t* id, CUgraph* graph);
CUresult exchange_mode(CUstreamCaptureMode* mode);

CUresult instantiate(Context* ctx, CUgraphExec* out, CUgraph g, unsigned long long flags);
CUresult launch(CUgraphExec exec, const std::shared_ptr<Stream>& s, CUstream user_handle);
CUresult exec_destroy(CUgraphExec exec);
CUresult destroy(CUgraph g);

}  // namespace sim::graph
