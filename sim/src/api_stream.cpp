// Streams, events and host functions (see stream.h).
#include "api.h"
#include "graph.h"
#include "variants.h"

using namespace sim;

namespace {

// A host wait on a stream (synchronize, query): refused while it captures.
CUresult host_wait(CUstream h, CUresult (*fn)(Stream&), const char* what) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  if (CUresult e = graph::check_host_wait(s, what); e != CUDA_SUCCESS) return e;
  return fn(*s);
}

CUresult record(CUevent ev, CUstream h, unsigned flags) {
  SIM_CTX(ctx);
  if (flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuEventRecordWithFlags: bad flags %#x", flags);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  bool captured = false;
  if (CUresult e = graph::event_record(s, ev, &captured); captured) return e;
  return stream::event_record(ev, s);
}

CUresult wait_event(CUstream h, CUevent ev, unsigned flags) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  bool handled = false;
  if (CUresult e = graph::wait_event(s, ev, flags, &handled); handled) return e;
  return stream::wait_event(s, ev, flags);
}

CUresult host_func(CUstream h, CUhostFn fn, void* data) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  if (!fn) return refuse(CUDA_ERROR_INVALID_VALUE, "cuLaunchHostFunc: null function");
  graph::Emit emit = [fn, data](const std::shared_ptr<Stream>& st, CUstream) {
    std::shared_ptr<Op> op;
    stream::launch_host_func(st, fn, data, &op);
    return op;
  };
  bool captured = false;
  if (CUresult e = graph::intercept(s, "host function", false, emit, &captured); captured) return e;
  emit(s, h);
  return CUDA_SUCCESS;
}

CUstream per_thread(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  cuStreamCreate_params p_{phStream, Flags};
  return SIM_INVOKE(cuStreamCreate, p_, [&] {
    SIM_CTX(ctx);
    return stream::create(ctx, phStream, Flags, 0);
  });
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  cuStreamCreateWithPriority_params p_{phStream, flags, priority};
  return SIM_INVOKE(cuStreamCreateWithPriority, p_, [&] {
    SIM_CTX(ctx);
    return stream::create(ctx, phStream, flags, priority);
  });
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  cuStreamDestroy_v2_params p_{hStream};
  return SIM_INVOKE(cuStreamDestroy_v2, p_, [&] {
    SIM_NEED_CTX();
    return stream::destroy(hStream);
  });
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  cuStreamSynchronize_params p_{hStream};
  return SIM_INVOKE(cuStreamSynchronize, p_,
                    [&] { return host_wait(hStream, stream::synchronize, "cuStreamSynchronize"); });
}
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) {
  cuStreamSynchronize_ptsz_params p_{hStream};
  return SIM_INVOKE(cuStreamSynchronize_ptsz, p_, [&] {
    return host_wait(per_thread(hStream), stream::synchronize, "cuStreamSynchronize");
  });
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  cuStreamQuery_params p_{hStream};
  return SIM_INVOKE(cuStreamQuery, p_,
                    [&] { return host_wait(hStream, stream::query, "cuStreamQuery"); });
}
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) {
  cuStreamQuery_ptsz_params p_{hStream};
  return SIM_INVOKE(cuStreamQuery_ptsz, p_,
                    [&] { return host_wait(per_thread(hStream), stream::query, "cuStreamQuery"); });
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  cuStreamWaitEvent_params p_{hStream, hEvent, Flags};
  return SIM_INVOKE(cuStreamWaitEvent, p_, [&] { return wait_event(hStream, hEvent, Flags); });
}
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  cuStreamWaitEvent_ptsz_params p_{hStream, hEvent, Flags};
  return SIM_INVOKE(cuStreamWaitEvent_ptsz, p_,
                    [&] { return wait_event(per_thread(hStream), hEvent, Flags); });
}

CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  cuStreamGetFlags_params p_{hStream, flags};
  return SIM_INVOKE(cuStreamGetFlags, p_, [&] {
    SIM_CTX(ctx);
    std::shared_ptr<Stream> s;
    if (CUresult e = stream::resolve(ctx, hStream, &s); e != CUDA_SUCCESS) return e;
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    *flags = s->flags;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int* priority) {
  cuStreamGetPriority_params p_{hStream, priority};
  return SIM_INVOKE(cuStreamGetPriority, p_, [&] {
    SIM_CTX(ctx);
    std::shared_ptr<Stream> s;
    if (CUresult e = stream::resolve(ctx, hStream, &s); e != CUDA_SUCCESS) return e;
    if (!priority) return CUDA_ERROR_INVALID_VALUE;
    *priority = s->priority;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long* streamId) {
  cuStreamGetId_params p_{hStream, streamId};
  return SIM_INVOKE(cuStreamGetId, p_, [&] {
    SIM_CTX(ctx);
    std::shared_ptr<Stream> s;
    if (CUresult e = stream::resolve(ctx, hStream, &s); e != CUDA_SUCCESS) return e;
    if (!streamId) return CUDA_ERROR_INVALID_VALUE;
    *streamId = s->stream_id;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuStreamGetId_ptsz(CUstream hStream, unsigned long long* streamId) {
  cuStreamGetId_ptsz_params p_{hStream, streamId};
  return SIM_INVOKE(cuStreamGetId_ptsz, p_, [&] {
    SIM_CTX(ctx);
    std::shared_ptr<Stream> s;
    if (CUresult e = stream::resolve(ctx, per_thread(hStream), &s); e != CUDA_SUCCESS) return e;
    if (!streamId) return CUDA_ERROR_INVALID_VALUE;
    *streamId = s->stream_id;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  cuLaunchHostFunc_params p_{hStream, fn, userData};
  return SIM_INVOKE(cuLaunchHostFunc, p_, [&] { return host_func(hStream, fn, userData); });
}
CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  cuLaunchHostFunc_ptsz_params p_{hStream, fn, userData};
  return SIM_INVOKE(cuLaunchHostFunc_ptsz, p_,
                    [&] { return host_func(per_thread(hStream), fn, userData); });
}

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  cuEventCreate_params p_{phEvent, Flags};
  return SIM_INVOKE(cuEventCreate, p_, [&] {
    SIM_CTX(ctx);
    return stream::event_create(ctx, phEvent, Flags);
  });
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  cuEventDestroy_v2_params p_{hEvent};
  return SIM_INVOKE(cuEventDestroy_v2, p_, [&] {
    SIM_NEED_CTX();
    return stream::event_destroy(hEvent);
  });
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  cuEventRecord_params p_{hEvent, hStream};
  return SIM_INVOKE(cuEventRecord, p_, [&] { return record(hEvent, hStream, 0); });
}
CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  cuEventRecord_ptsz_params p_{hEvent, hStream};
  return SIM_INVOKE(cuEventRecord_ptsz, p_, [&] { return record(hEvent, per_thread(hStream), 0); });
}
CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  cuEventRecordWithFlags_params p_{hEvent, hStream, flags};
  return SIM_INVOKE(cuEventRecordWithFlags, p_, [&] { return record(hEvent, hStream, flags); });
}
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
  cuEventRecordWithFlags_ptsz_params p_{hEvent, hStream, flags};
  return SIM_INVOKE(cuEventRecordWithFlags_ptsz, p_,
                    [&] { return record(hEvent, per_thread(hStream), flags); });
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  cuEventQuery_params p_{hEvent};
  return SIM_INVOKE(cuEventQuery, p_, [&] {
    SIM_NEED_CTX();
    if (CUresult e = graph::check_event_use(hEvent, "cuEventQuery"); e != CUDA_SUCCESS) return e;
    return stream::event_query(hEvent);
  });
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  cuEventSynchronize_params p_{hEvent};
  return SIM_INVOKE(cuEventSynchronize, p_, [&] {
    SIM_NEED_CTX();
    if (CUresult e = graph::check_event_use(hEvent, "cuEventSynchronize"); e != CUDA_SUCCESS)
      return e;
    return stream::event_synchronize(hEvent);
  });
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  cuEventElapsedTime_v2_params p_{pMilliseconds, hStart, hEnd};
  return SIM_INVOKE(cuEventElapsedTime_v2, p_, [&] {
    SIM_NEED_CTX();
    return stream::event_elapsed(pMilliseconds, hStart, hEnd);
  });
}

}  // extern "C"
