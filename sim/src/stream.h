// Streams, their worker threads, events and host waits. Every op is placed
// on the virtual timeline when enqueued (clock.h) and executed for real, in
// stream order, by the stream's worker thread once the ops it depends on
// (event waits, legacy default stream semantics) have completed.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <cuda.h>

#include "clock.h"
#include "state.h"

namespace sim::stream {

// Resolves NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a created stream.
CUresult resolve(Context* ctx, CUstream handle, std::shared_ptr<Stream>* out);
CUresult create(Context* ctx, CUstream* out, unsigned flags, int priority);
// A stream made by cuStreamCreate*, whatever the current context.
bool find_created(CUstream handle, std::shared_ptr<Stream>* out);
std::shared_ptr<Stream> create_legacy(Context* ctx);
CUresult destroy(CUstream handle);

// Places `op` on the timeline (after the stream's previous op, its deps, the
// calling thread's "now", and whatever `place` adds for its engine) and
// queues it. `place(dev, earliest)` returns the op's virtual interval.
using Placer = std::function<clock::Interval(Device& dev, uint64_t earliest)>;
void enqueue(const std::shared_ptr<Stream>& s, const std::shared_ptr<Op>& op, const Placer& place);
// An op with no engine and no duration (event records, waits).
void enqueue_marker(const std::shared_ptr<Stream>& s, const std::shared_ptr<Op>& op);

// Host waits: block until the op ran, then move this thread's clock to its end.
void wait(const std::shared_ptr<Op>& op);
// Done for real and, in virtual time, no later than this thread's now.
bool is_complete(const std::shared_ptr<Op>& op);

CUresult synchronize(Stream& s);
CUresult query(Stream& s);
CUresult synchronize_context(Context* ctx);

// Pending work touching [lo, hi): for cuMemUnmap and cuMemFree.
bool pending_overlaps(uintptr_t lo, uintptr_t hi, std::string* what);
void wait_for_range(uintptr_t lo, uintptr_t hi);

// True while the calling thread runs a host function (cuLaunchHostFunc):
// such functions must not call CUDA (cuda.h: CUDA_ERROR_NOT_PERMITTED).
bool in_host_function();
// `out`, if given, receives the enqueued op.
CUresult launch_host_func(const std::shared_ptr<Stream>& s, CUhostFn fn, void* data,
                          std::shared_ptr<Op>* out = nullptr);

CUresult event_create(Context* ctx, CUevent* out, unsigned flags);
CUresult event_destroy(CUevent ev);
CUresult event_record(CUevent ev, const std::shared_ptr<Stream>& s);
CUresult event_query(CUevent ev);
CUresult event_synchronize(CUevent ev);
CUresult event_elapsed(float* ms, CUevent start, CUevent end);
CUresult wait_event(const std::shared_ptr<Stream>& s, CUevent ev, unsigned flags);
// -1: no such event; 0: never recorded; 1: recorded.
int event_status(CUevent ev);

}  // namespace sim::stream
