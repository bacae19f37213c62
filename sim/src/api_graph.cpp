// Stream capture and graphs (see graph.h).
#include "api.h"
#include "graph.h"
#include "variants.h"

using namespace sim;

namespace {

CUstream per_thread(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

CUresult begin(CUstream h, CUstreamCaptureMode mode) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  return graph::begin_capture(s, mode);
}

CUresult end(CUstream h, CUgraph* out) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  return graph::end_capture(s, out);
}

CUresult info(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph_out,
              const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num_deps) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  // cuda.h: "If edgeData_out is non-NULL then dependencies_out must be as well."
  if (edges && !deps)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamGetCaptureInfo: edgeData_out without deps");
  // Captured graphs have no node handles here.
  if (deps || num_deps)
    return refuse(CUDA_ERROR_NOT_SUPPORTED,
                  "cuStreamGetCaptureInfo: dependency queries are not simulated (pass NULL)");
  return graph::capture_info(s, status, id, graph_out);
}

CUresult is_capturing(CUstream h, CUstreamCaptureStatus* status) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  return graph::is_capturing(s, status);
}

CUresult launch(CUgraphExec exec, CUstream h) {
  SIM_CTX(ctx);
  std::shared_ptr<Stream> s;
  if (CUresult e = stream::resolve(ctx, h, &s); e != CUDA_SUCCESS) return e;
  // Like cuLaunchKernel: a fault in the graph's work is reported by later calls.
  return graph::launch(exec, s, h);
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  cuStreamBeginCapture_v2_params p_{hStream, mode};
  return SIM_INVOKE(cuStreamBeginCapture_v2, p_, [&] { return begin(hStream, mode); });
}
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  cuStreamBeginCapture_v2_ptsz_params p_{hStream, mode};
  return SIM_INVOKE(cuStreamBeginCapture_v2_ptsz, p_,
                    [&] { return begin(per_thread(hStream), mode); });
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  cuStreamEndCapture_params p_{hStream, phGraph};
  return SIM_INVOKE(cuStreamEndCapture, p_, [&] { return end(hStream, phGraph); });
}
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  cuStreamEndCapture_ptsz_params p_{hStream, phGraph};
  return SIM_INVOKE(cuStreamEndCapture_ptsz, p_, [&] { return end(per_thread(hStream), phGraph); });
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  cuStreamIsCapturing_params p_{hStream, captureStatus};
  return SIM_INVOKE(cuStreamIsCapturing, p_, [&] { return is_capturing(hStream, captureStatus); });
}
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  cuStreamIsCapturing_ptsz_params p_{hStream, captureStatus};
  return SIM_INVOKE(cuStreamIsCapturing_ptsz, p_,
                    [&] { return is_capturing(per_thread(hStream), captureStatus); });
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream,
                                           CUstreamCaptureStatus* captureStatus_out,
                                           cuuint64_t* id_out, CUgraph* graph_out,
                                           const CUgraphNode** dependencies_out,
                                           const CUgraphEdgeData** edgeData_out,
                                           size_t* numDependencies_out) {
  cuStreamGetCaptureInfo_v3_params p_{
      hStream,      captureStatus_out,  id_out, graph_out, dependencies_out,
      edgeData_out, numDependencies_out};
  return SIM_INVOKE(cuStreamGetCaptureInfo_v3, p_, [&] {
    return info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                numDependencies_out);
  });
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream,
                                                CUstreamCaptureStatus* captureStatus_out,
                                                cuuint64_t* id_out, CUgraph* graph_out,
                                                const CUgraphNode** dependencies_out,
                                                const CUgraphEdgeData** edgeData_out,
                                                size_t* numDependencies_out) {
  cuStreamGetCaptureInfo_v3_ptsz_params p_{
      hStream,      captureStatus_out,  id_out, graph_out, dependencies_out,
      edgeData_out, numDependencies_out};
  return SIM_INVOKE(cuStreamGetCaptureInfo_v3_ptsz, p_, [&] {
    return info(per_thread(hStream), captureStatus_out, id_out, graph_out, dependencies_out,
                edgeData_out, numDependencies_out);
  });
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  cuThreadExchangeStreamCaptureMode_params p_{mode};
  return SIM_INVOKE(cuThreadExchangeStreamCaptureMode, p_, [&] {
    if (!state()) return CUDA_ERROR_NOT_INITIALIZED;
    return graph::exchange_mode(mode);
  });
}

// cuda.h: #define cuGraphInstantiate cuGraphInstantiateWithFlags
CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                             unsigned long long flags) {
  cuGraphInstantiateWithFlags_params p_{phGraphExec, hGraph, flags};
  return SIM_INVOKE(cuGraphInstantiateWithFlags, p_, [&] {
    SIM_CTX(ctx);
    return graph::instantiate(ctx, phGraphExec, hGraph, flags);
  });
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  cuGraphLaunch_params p_{hGraphExec, hStream};
  return SIM_INVOKE_LAUNCH(cuGraphLaunch, p_, [&] { return launch(hGraphExec, hStream); });
}
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  cuGraphLaunch_ptsz_params p_{hGraphExec, hStream};
  return SIM_INVOKE_LAUNCH(cuGraphLaunch_ptsz, p_,
                           [&] { return launch(hGraphExec, per_thread(hStream)); });
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  cuGraphExecDestroy_params p_{hGraphExec};
  return SIM_INVOKE(cuGraphExecDestroy, p_, [&] {
    SIM_NEED_CTX();
    return graph::exec_destroy(hGraphExec);
  });
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  cuGraphDestroy_params p_{hGraph};
  return SIM_INVOKE(cuGraphDestroy, p_, [&] {
    SIM_NEED_CTX();
    return graph::destroy(hGraph);
  });
}

}  // extern "C"
