// The simulated driver's objects: devices, contexts, streams, operations,
// events and functions, and the process-wide registry that maps opaque CUDA
// handles to them. Handles are never reused, so a destroyed handle is always
// recognised as such (CUDA_ERROR_INVALID_HANDLE) instead of aliasing a new
// object as it may on hardware.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <cuda.h>

#include "config.h"
#include "cupti_bridge.h"

namespace sim {

struct Context;
struct Stream;

enum class Engine : uint8_t { kNone, kCompute, kCopyH2D, kCopyD2H };

struct Range {
  uintptr_t lo;
  uintptr_t hi;  // exclusive
  bool overlaps(uintptr_t a, uintptr_t b) const { return lo < b && a < hi; }
};

// One unit of work on a stream. Scheduled in virtual time when enqueued,
// executed for real by the stream's worker thread.
struct Op {
  enum class Kind : uint8_t { kKernel, kCopy, kMemset, kHostFn, kMarker };
  Kind kind = Kind::kMarker;
  Engine engine = Engine::kNone;
  std::function<void()> effect;           // the real work (device accesses guarded)
  std::vector<std::shared_ptr<Op>> deps;  // ops on other streams to wait for
  std::vector<Range> touched;             // address ranges the op may access
  uint64_t vstart = 0, vend = 0;          // virtual interval
  std::atomic<bool> done{false};
  std::string what;                // for error messages: "kernel foo", "copy HtoD ..."
  simbridge::Activity activity{};  // filled for kernels, copies, memsets
  bool report_activity = false;
};

struct Stream {
  uint64_t handle_id = 0;  // 0 for the legacy default stream
  uint32_t stream_id = 0;  // CUPTI stream id
  Context* ctx = nullptr;
  unsigned flags = 0;
  int priority = 0;
  bool legacy = false;      // the NULL / CU_STREAM_LEGACY stream
  bool per_thread = false;  // a CU_STREAM_PER_THREAD stream

  // Protected by Device::sched_mu.
  uint64_t tail = 0;         // virtual time when its last op ends
  std::shared_ptr<Op> last;  // most recently enqueued op

  // The worker's queue: protected by mu.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Op>> queue;
  bool retiring = false;  // destroyed by the user: drain then exit
};

struct Event {
  unsigned flags = 0;
  Context* ctx = nullptr;
  std::shared_ptr<Op> recorded;  // marker op of the latest record, null if never recorded
  uint64_t vtime = 0;
};

struct Function {
  std::string name;
  void* fn = nullptr;  // simcuda_kernel_fn
  void* user = nullptr;
  std::vector<size_t> offsets, sizes;
  size_t params_size = 0;
  uint64_t duration_ns = 0;
  void* duration_fn = nullptr;  // simcuda_duration_fn
  bool library_kernel = false;
  int device = 0;
};

struct EngineState {
  uint64_t free_at = 0;
  // Recent busy intervals, for the opposite copy engine's bandwidth sharing.
  std::deque<std::pair<uint64_t, uint64_t>> busy;
};

struct Device {
  int ordinal = 0;
  std::mutex sched_mu;  // virtual scheduling: engines, stream tails/last
  EngineState compute, h2d, d2h;
  std::atomic<uint64_t> idle_at{0};
  std::atomic<uint64_t> bytes_h2d{0}, bytes_d2h{0}, remote_access_bytes{0};
  std::atomic<uint64_t> managed_fault_bytes{0};  // kernel-driven managed migrations
};

struct Context {
  int device = 0;
  uint32_t id = 0;
  unsigned flags = 0;
  std::atomic<int> retain_count{0};
  std::atomic<CUresult> sticky{CUDA_SUCCESS};
  std::mutex sticky_mu;
  std::string sticky_what;
  std::shared_ptr<Stream> legacy;
  std::mutex streams_mu;
  std::vector<std::shared_ptr<Stream>> streams;  // live user and per-thread streams
};

// Process-wide state. Created at cuInit and never destroyed: stream workers
// are detached and may still run while the process exits.
struct State {
  Config config;
  // Host cost of the entry points SIMCUDA_VMM_NS / SIMCUDA_CALL_NS name, by
  // exported name (keys view the cuGetProcAddress table's static strings).
  // Built before the state is published, read-only after.
  std::unordered_map<std::string_view, uint64_t> call_ns;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Context>> primary;  // one primary context per device

  std::mutex handles_mu;
  uint64_t next_handle = 0x5100;  // never reused
  std::unordered_map<uint64_t, std::shared_ptr<Stream>> streams;
  std::unordered_map<uint64_t, std::shared_ptr<Event>> events;
  std::unordered_map<uint64_t, std::shared_ptr<Function>> functions;
  std::unordered_map<uint64_t, std::shared_ptr<Function>> kernels;
  std::atomic<uint32_t> next_stream_id{1};

  // Completion of any op: waiters re-check their condition.
  std::mutex done_mu;
  std::condition_variable done_cv;

  // Ops enqueued and not yet done, for "unmap with pending work" checks.
  std::mutex pending_mu;
  std::vector<std::shared_ptr<Op>> pending;

  std::atomic<uint32_t> next_correlation{1};

  // The driver makes device VMM calls one at a time, whatever the threads
  // (docs/gpu.md run 19): the recent calls' [start, end) in virtual time,
  // ascending by start (docs/sim.md, "VMM calls are one at a time").
  std::mutex vmm_mu;
  std::deque<std::pair<uint64_t, uint64_t>> vmm_busy;
};

// The CUPTI stand-in's hooks (null when it is not loaded or not attached).
// Outside State: CUPTI may attach before cuInit.
const simbridge::Hooks* cupti_hooks();
void set_cupti_hooks(const simbridge::Hooks* hooks);

// nullptr until cuInit succeeded.
State* state();
// cuInit: reads the configuration and builds the devices. Idempotent.
CUresult init_state();
uint64_t new_handle();

// The calling thread's current context, or an error: not initialized,
// no current context, or the context's sticky error.
CUresult current_context(Context** out);
// The calling thread's context stack (cuCtxPushCurrent / cuCtxSetCurrent).
std::vector<Context*>& context_stack();
// The primary context behind a CUcontext handle, or nullptr.
Context* context_from_handle(CUcontext ctx);

// Record a sticky error on the context (first one wins for the description).
void set_sticky(Context* ctx, CUresult err, const std::string& what);

// A refused call: with SIMCUDA_LOG=1 the reason goes to stderr.
CUresult refuse(CUresult err, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace sim
