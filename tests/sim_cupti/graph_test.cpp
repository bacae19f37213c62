// CUPTI callbacks for stream capture and graphs, activity records of graph
// launches, and the runtime-domain emulation (simcuda_runtime_launch).
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "sim_gpu.h"

namespace simcupti_test {
namespace {

// One callback, with what the graph tests check copied out while
// functionParams is valid.
struct Seen {
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
  CUpti_ApiCallbackSite site;
  std::string name;
  uint32_t correlation_id;
  int result;
  // Per cbid:
  CUstream stream = nullptr;           // BeginCapture, EndCapture, GraphLaunch, launches
  int mode = -1;                       // BeginCapture
  CUgraph graph = nullptr;             // EndCapture: *phGraph; Instantiate, Destroy: hGraph
  CUgraphExec exec = nullptr;          // Instantiate: *phGraphExec; GraphLaunch, ExecDestroy
  CUstreamCaptureStatus capture = {};  // launches: the stream's status, asked in the callback
  cuuint64_t capture_id = 0;
  const void* func = nullptr;  // runtime launch
  unsigned grid_x = 0;
};

std::mutex g_mu;
std::vector<Seen> g_seen;
thread_local bool t_inside = false;  // driver calls made in the callback re-enter it

void CUPTIAPI OnApi(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (t_inside) return;
  const auto* d = static_cast<const CUpti_CallbackData*>(data);
  Seen s{};
  s.domain = domain;
  s.cbid = cbid;
  s.site = d->callbackSite;
  s.name = d->functionName ? d->functionName : "";
  s.correlation_id = d->correlationId;
  const bool exit = d->callbackSite == CUPTI_API_EXIT;
  if (exit && d->functionReturnValue) s.result = *static_cast<const int*>(d->functionReturnValue);
  const void* p = d->functionParams;
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    const auto* r = static_cast<const cudaLaunchKernel_v7000_params*>(p);
    s.func = r->func;
    s.grid_x = r->gridDim.x;
    s.stream = reinterpret_cast<CUstream>(r->stream);
  } else {
    switch (cbid) {
      case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2: {
        const auto* q = static_cast<const cuStreamBeginCapture_v2_params*>(p);
        s.stream = q->hStream;
        s.mode = q->mode;
        break;
      }
      case CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture: {
        const auto* q = static_cast<const cuStreamEndCapture_params*>(p);
        s.stream = q->hStream;
        if (exit && q->phGraph) s.graph = *q->phGraph;
        break;
      }
      case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags: {
        const auto* q = static_cast<const cuGraphInstantiateWithFlags_params*>(p);
        s.graph = q->hGraph;
        if (exit && q->phGraphExec) s.exec = *q->phGraphExec;
        break;
      }
      case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch: {
        const auto* q = static_cast<const cuGraphLaunch_params*>(p);
        s.exec = q->hGraph;  // generated_cuda_meta.h names the CUgraphExec "hGraph"
        s.stream = q->hStream;
        break;
      }
      case CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy:
        s.exec = static_cast<const cuGraphExecDestroy_params*>(p)->hGraphExec;
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuGraphDestroy:
        s.graph = static_cast<const cuGraphDestroy_params*>(p)->hGraph;
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: {
        const auto* q = static_cast<const cuLaunchKernel_params*>(p);
        s.stream = q->hStream;
        s.grid_x = q->gridDimX;
        // How a tracker recognises a launch into a capturing stream.
        t_inside = true;
        EXPECT_CU(cuStreamGetCaptureInfo_v3(q->hStream, &s.capture, &s.capture_id, nullptr, nullptr,
                                            nullptr, nullptr));
        t_inside = false;
        break;
      }
      default:
        break;
    }
  }
  std::lock_guard lk(g_mu);
  g_seen.push_back(s);
}

std::vector<Seen> Seen_(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  std::lock_guard lk(g_mu);
  std::vector<Seen> out;
  for (const Seen& s : g_seen)
    if (s.domain == domain && s.cbid == cbid) out.push_back(s);
  return out;
}

std::vector<Seen> Driver(CUpti_CallbackId cbid) {
  return Seen_(CUPTI_CB_DOMAIN_DRIVER_API, cbid);
}

class GraphCallbackTest : public SimGpuTest {
 protected:
  void SetUp() override {
    SimGpuTest::SetUp();
    if (HasFatalFailure()) return;
    {
      std::lock_guard lk(g_mu);
      g_seen.clear();
    }
    ASSERT_CUPTI(cuptiSubscribe(&subscriber_, OnApi, nullptr));
  }
  void TearDown() override {
    SimGpuTest::TearDown();
    if (subscriber_) {
      EXPECT_CUPTI(cuptiUnsubscribe(subscriber_));
    }
  }
  void Enable(CUpti_CallbackId cbid) {
    ASSERT_CUPTI(cuptiEnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API, cbid));
  }
  uint32_t ReadU32(CUdeviceptr p) {
    uint32_t v = 0;
    EXPECT_CU(cuMemcpyDtoH_v2(&v, p, sizeof v));
    return v;
  }
  CUpti_SubscriberHandle subscriber_ = nullptr;
};

// Every graph entry point fires enter and exit with its params struct;
// phGraph is filled at the exit of cuStreamEndCapture, hGraphExec is the one
// instantiated; a launch during capture fires its callbacks, and the stream's
// capture status (asked from the callback) says it is capturing.
TEST_F(GraphCallbackTest, CaptureAndGraphCallbacksCarryTheirParams) {
  for (CUpti_CallbackId cbid :
       {CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2, CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture,
        CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
        CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy, CUPTI_DRIVER_TRACE_CBID_cuGraphDestroy,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel})
    Enable(cbid);

  ASSERT_CU(Launch(dev_, 1));  // not capturing
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CU(cuStreamBeginCapture_v2(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  ASSERT_CU(Launch(dev_, 42));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(stream_, &graph));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(ReadU32(dev_), 42u);
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(graph));

  auto begin = Driver(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2);
  ASSERT_EQ(begin.size(), 2u);
  EXPECT_EQ(begin[0].site, CUPTI_API_ENTER);
  EXPECT_EQ(begin[0].name, "cuStreamBeginCapture_v2");
  EXPECT_EQ(begin[0].stream, stream_);
  EXPECT_EQ(begin[0].mode, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  EXPECT_EQ(begin[1].site, CUPTI_API_EXIT);
  EXPECT_EQ(begin[1].result, CUDA_SUCCESS);

  auto end = Driver(CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture);
  ASSERT_EQ(end.size(), 2u);
  EXPECT_EQ(end[0].stream, stream_);
  EXPECT_EQ(end[1].site, CUPTI_API_EXIT);
  EXPECT_EQ(end[1].graph, graph) << "phGraph is filled at exit";
  EXPECT_EQ(end[0].correlation_id, end[1].correlation_id);

  auto inst = Driver(CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags);
  ASSERT_EQ(inst.size(), 2u);
  EXPECT_EQ(inst[0].graph, graph);
  EXPECT_EQ(inst[1].exec, exec);

  auto launch = Driver(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch);
  ASSERT_EQ(launch.size(), 2u);
  EXPECT_EQ(launch[0].exec, exec);
  EXPECT_EQ(launch[0].stream, stream_);
  EXPECT_EQ(launch[1].result, CUDA_SUCCESS);

  auto exec_destroy = Driver(CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy);
  ASSERT_EQ(exec_destroy.size(), 2u);
  EXPECT_EQ(exec_destroy[0].exec, exec);
  auto destroy = Driver(CUPTI_DRIVER_TRACE_CBID_cuGraphDestroy);
  ASSERT_EQ(destroy.size(), 2u);
  EXPECT_EQ(destroy[0].graph, graph);

  // Launches: the one before capture and the captured one fire callbacks; the
  // graph launch does not fire cuLaunchKernel (no API call is made).
  auto kernels = Driver(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  ASSERT_EQ(kernels.size(), 4u);
  EXPECT_EQ(kernels[0].capture, CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(kernels[2].capture, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_NE(kernels[2].capture_id, 0u);
  EXPECT_EQ(kernels[3].result, CUDA_SUCCESS);
}

// A graph launch's kernels produce kernel records carrying the graph
// launch's correlation id; a launch made during capture produces none.
TEST_F(GraphCallbackTest, GraphKernelsAreRecordedWithTheLaunchCorrelation) {
  collector::Configure({});
  ASSERT_CUPTI(cuptiActivityRegisterCallbacks(collector::Request, collector::Complete));
  ASSERT_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  Enable(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch);
  Enable(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);

  ASSERT_CU(cuStreamBeginCapture_v2(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Launch(dev_, 1));
  ASSERT_CU(Launch(dev_ + 4, 2));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(stream_, &graph));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, stream_));
  ASSERT_CU(cuGraphLaunch(exec, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  ASSERT_CUPTI(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));

  auto launches = Driver(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch);
  ASSERT_EQ(launches.size(), 4u);
  const uint32_t first = launches[0].correlation_id, second = launches[2].correlation_id;
  EXPECT_NE(first, second);
  const auto records = collector::Records(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  ASSERT_EQ(records.size(), 4u) << "two kernels per graph launch, none at capture";
  std::vector<uint32_t> corr;
  for (const Record& r : records) corr.push_back(r.As<CUpti_ActivityKernel10>().correlationId);
  EXPECT_EQ(corr, (std::vector<uint32_t>{first, first, second, second}));
  for (const Seen& k : Driver(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel))
    EXPECT_EQ(std::count(corr.begin(), corr.end(), k.correlation_id), 0)
        << "captured launches produce no records of their own";
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
}

// The runtime emulation: runtime enter, then the driver's cuLaunchKernel
// enter/exit nested inside, then runtime exit; each API call has its own
// correlation id; the kernel record carries the driver call's.
TEST_F(GraphCallbackTest, RuntimeLaunchFiresRuntimeThenNestedDriverCallbacks) {
  collector::Configure({});
  ASSERT_CUPTI(cuptiActivityRegisterCallbacks(collector::Request, collector::Complete));
  ASSERT_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  Enable(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  ASSERT_CUPTI(cuptiEnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API,
                                   CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000));
  CUdeviceptr out = dev_;
  uint32_t value = 77;
  void* args[] = {&out, &value};
  ASSERT_CU(simcuda_runtime_launch(kernel_, {3, 1, 1}, {32, 1, 1}, args, 0, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(ReadU32(dev_), 77u);
  ASSERT_CUPTI(cuptiActivityFlushAll(0));
  ASSERT_CUPTI(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));

  std::vector<Seen> all;
  {
    std::lock_guard lk(g_mu);
    all = g_seen;
  }
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].domain, CUPTI_CB_DOMAIN_RUNTIME_API);
  EXPECT_EQ(all[0].site, CUPTI_API_ENTER);
  EXPECT_EQ(all[0].cbid, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
  EXPECT_EQ(all[0].name, "cudaLaunchKernel_v7000");
  EXPECT_EQ(all[0].func, reinterpret_cast<const void*>(kernel_));
  EXPECT_EQ(all[0].grid_x, 3u);
  EXPECT_EQ(all[0].stream, stream_);
  EXPECT_EQ(all[1].domain, CUPTI_CB_DOMAIN_DRIVER_API);
  EXPECT_EQ(all[1].site, CUPTI_API_ENTER);
  EXPECT_EQ(all[1].grid_x, 3u);
  EXPECT_EQ(all[2].domain, CUPTI_CB_DOMAIN_DRIVER_API);
  EXPECT_EQ(all[2].site, CUPTI_API_EXIT);
  EXPECT_EQ(all[3].domain, CUPTI_CB_DOMAIN_RUNTIME_API);
  EXPECT_EQ(all[3].site, CUPTI_API_EXIT);
  EXPECT_EQ(all[3].result, 0) << "cudaSuccess";
  EXPECT_EQ(all[0].correlation_id, all[3].correlation_id);
  EXPECT_EQ(all[1].correlation_id, all[2].correlation_id);
  EXPECT_NE(all[0].correlation_id, all[1].correlation_id) << "each API call has its own id";
  const auto records = collector::Records(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].As<CUpti_ActivityKernel10>().correlationId, all[1].correlation_id);
}

// Runtime callbacks fire only when enabled (by id or by domain).
TEST_F(GraphCallbackTest, RuntimeCallbacksFireOnlyWhenEnabled) {
  Enable(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  CUdeviceptr out = dev_;
  uint32_t value = 5;
  void* args[] = {&out, &value};
  ASSERT_CU(simcuda_runtime_launch(kernel_, {1, 1, 1}, {1, 1, 1}, args, 0, stream_));
  EXPECT_EQ(
      Seen_(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000).size(),
      0u);
  EXPECT_EQ(Driver(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel).size(), 2u);

  ASSERT_CUPTI(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API));
  ASSERT_CU(simcuda_runtime_launch(kernel_, {1, 1, 1}, {1, 1, 1}, args, 0, stream_));
  EXPECT_EQ(
      Seen_(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000).size(),
      2u);
  // A failed launch reports the error at the runtime exit too.
  ASSERT_CUPTI(cuptiEnableCallback(0, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API,
                                   CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel));
  EXPECT_EQ(simcuda_runtime_launch(kernel_, {0, 1, 1}, {1, 1, 1}, args, 0, stream_),
            CUDA_ERROR_INVALID_VALUE);
  auto rt = Seen_(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
  ASSERT_EQ(rt.size(), 4u);
  EXPECT_EQ(rt[3].result, static_cast<int>(cudaErrorInvalidValue));
}

}  // namespace
}  // namespace simcupti_test
