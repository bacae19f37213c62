// The NCCL stand-in (build/sim/libnccl.so.2): communicators whose ranks all
// live in this process, on the simulated GPU. Each call (or each group, at
// its outermost ncclGroupEnd) queues one simulated kernel per communicator on
// the caller's stream. The kernel's only parameter is a pointer to a host-side
// work descriptor, as NCCL's kernels get a pointer to their work FIFO, so
// CUPTI's argument scan sees no user buffer. When every participant's kernel
// is running, the last to arrive moves the data through the buffers' device
// addresses, then every kernel completes. A buffer evicted to host memory is
// therefore read through the host mapping; a buffer whose mapping changes
// while the kernel runs is reported (see simnccl.h). docs/nccl.md.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <cuda.h>

#include "nccl.h"
#include "reduce.h"
#include "simcuda.h"
#include "simnccl.h"

#define NCCL_EXPORT extern "C" __attribute__((visibility("default")))

namespace simnccl {
namespace {

using Clock = std::chrono::steady_clock;

enum class Coll { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kSend, kRecv };

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::kAllReduce:
      return "ncclAllReduce";
    case Coll::kAllGather:
      return "ncclAllGather";
    case Coll::kReduceScatter:
      return "ncclReduceScatter";
    case Coll::kBroadcast:
      return "ncclBroadcast";
    case Coll::kReduce:
      return "ncclReduce";
    case Coll::kSend:
      return "ncclSend";
    case Coll::kRecv:
      return "ncclRecv";
  }
  return "?";
}

uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  if (*end != '\0') {
    std::fprintf(stderr, "simnccl: %s=%s is not a number; using %llu\n", name, v,
                 static_cast<unsigned long long>(dflt));
    return dflt;
  }
  return x;
}

struct Settings {
  std::atomic<uint64_t> delay_us{env_u64("SIMNCCL_DELAY_US", 0)};
  uint64_t timeout_ms = env_u64("SIMNCCL_TIMEOUT_MS", 20000);
  uint64_t gbps = std::max<uint64_t>(1, env_u64("SIMNCCL_GBPS", 100));
  bool check_mappings = env_u64("SIMNCCL_CHECK_MAPPINGS", 1) != 0;
};
Settings& settings() {
  static Settings* s = new Settings;  // never destroyed: kernels may run at exit
  return *s;
}

std::atomic<uint64_t> g_mapping_changes{0};
std::atomic<uint64_t> g_ops_completed{0};

struct Clique;

struct Comm {
  Clique* clique = nullptr;
  int rank = 0;
  int device = 0;
  uint64_t next_coll = 0;                // this rank's collectives, in call order
  std::map<int, uint64_t> sends, recvs;  // per peer, in call order
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<bool> destroyed{false};
  void fail(ncclResult_t r) {
    int expected = ncclSuccess;
    async_error.compare_exchange_strong(expected, r);
  }
};

// One rank's part in an operation.
struct Part {
  bool present = false;
  Coll coll = Coll::kAllReduce;
  Comm* comm = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclInt8;
  ncclRedOp_t op = ncclSum;
  int root = 0;  // peer for send/recv
};

// An operation across its participants: a collective (one part per rank) or
// a send/receive pair (part 0 sends, part 1 receives).
struct Instance {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Part> parts;
  int arrived = 0;  // kernels that reached it
  bool done = false;
  std::vector<unsigned char> staging;
};

struct Range {
  uintptr_t lo, hi;
};

// What one kernel does: its communicator's operations of one call or group.
struct Launch {
  Clique* clique = nullptr;
  Comm* comm = nullptr;
  std::vector<std::shared_ptr<Instance>> ops;
  std::vector<Range> ranges;  // the buffers this rank's parts use
  std::vector<uint64_t> before, after;
  uint64_t duration_ns = 0;
  std::atomic<bool> finished{false};
};

struct Clique {
  int nranks = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Comm>> comms;
  int joined = 0;                                       // ncclCommInitRank
  std::map<uint64_t, std::shared_ptr<Instance>> colls;  // by sequence, until complete
  std::map<std::tuple<int, int, uint64_t>, std::shared_ptr<Instance>> p2p;  // src, dst, seq
  std::vector<std::unique_ptr<Launch>> launches;
};

// Cliques whose kernels never finished (a fault, a timeout) when their last
// communicator was destroyed: kept, reachable, so those kernels never touch
// freed memory.
std::mutex g_graveyard_mu;
std::vector<Clique*>* g_graveyard = new std::vector<Clique*>;

// ---- Mappings: the simulator's signature of each range's mappings
// (simcuda.h), taken under its lock. (Reading /proc/self/maps instead is
// not atomic: a mapping changed elsewhere between two reads can repeat or
// drop a line, and the check then reports a change that did not happen.)
void mapping_signatures(const std::vector<Range>& ranges, std::vector<uint64_t>& out) {
  out.resize(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i)
    out[i] = simcuda_mapping_signature(ranges[i].lo, ranges[i].hi - ranges[i].lo);
}

// ---- The data movement, done by the last participant to arrive.
bool same_shape(const Part& a, const Part& b) {
  return a.coll == b.coll && a.count == b.count && a.type == b.type && a.op == b.op &&
         a.root == b.root;
}

void fail_all(Instance& in, ncclResult_t r, const char* why) {
  std::fprintf(stderr, "simnccl: %s: %s\n", coll_name(in.parts[0].coll), why);
  for (Part& p : in.parts)
    if (p.comm) p.comm->fail(r);
}

void execute(Instance& in) {
  const Part& p0 = in.parts[0];
  const int n = static_cast<int>(in.parts.size());
  const size_t es = type_size(p0.type);
  if (p0.coll == Coll::kSend) {
    const Part& s = in.parts[0];
    const Part& r = in.parts[1];
    if (s.count != r.count || s.type != r.type)
      return fail_all(in, ncclInvalidUsage, "send and receive differ in count or type");
    in.staging.resize(s.count * es);
    std::memcpy(in.staging.data(), s.send, in.staging.size());
    std::memcpy(r.recv, in.staging.data(), in.staging.size());
    return;
  }
  for (const Part& p : in.parts)
    if (!same_shape(p, p0))
      return fail_all(in, ncclInvalidUsage, "ranks called it with different arguments");
  const size_t bytes = p0.count * es;
  switch (p0.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kReduceScatter: {
      const size_t total = p0.coll == Coll::kReduceScatter ? bytes * n : bytes;
      const size_t elems = total / (es ? es : 1);
      in.staging.resize(total);
      std::memcpy(in.staging.data(), in.parts[0].send, total);
      for (int r = 1; r < n; ++r)
        reduce(in.staging.data(), in.parts[r].send, elems, p0.type, p0.op);
      if (p0.op == ncclAvg) divide(in.staging.data(), elems, p0.type, n);
      if (p0.coll == Coll::kAllReduce) {
        for (int r = 0; r < n; ++r) std::memcpy(in.parts[r].recv, in.staging.data(), bytes);
      } else if (p0.coll == Coll::kReduce) {
        std::memcpy(in.parts[p0.root].recv, in.staging.data(), bytes);
      } else {
        for (int r = 0; r < n; ++r)
          std::memcpy(in.parts[r].recv, in.staging.data() + r * bytes, bytes);
      }
      return;
    }
    case Coll::kAllGather:
      in.staging.resize(bytes * n);
      for (int r = 0; r < n; ++r)
        std::memcpy(in.staging.data() + r * bytes, in.parts[r].send, bytes);
      for (int r = 0; r < n; ++r)
        std::memcpy(in.parts[r].recv, in.staging.data(), in.staging.size());
      return;
    case Coll::kBroadcast:
      in.staging.resize(bytes);
      std::memcpy(in.staging.data(), in.parts[p0.root].send, bytes);
      for (int r = 0; r < n; ++r) std::memcpy(in.parts[r].recv, in.staging.data(), bytes);
      return;
    default:
      return;
  }
}

// The kernel. Runs on the stream's worker under the simulator's fault guard:
// a fault in execute() abandons this stack, so no lock is held across it and
// nothing here owns memory.
void kernel(const void* params, size_t, const simcuda_launch_info*, void*) {
  Launch* l = nullptr;
  std::memcpy(&l, params, sizeof l);
  Settings& cfg = settings();
  if (cfg.check_mappings) mapping_signatures(l->ranges, l->before);
  if (uint64_t us = cfg.delay_us.load(std::memory_order_relaxed))
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  // Arrive everywhere first (a group's sends and receives may be matched in
  // any order by the peers), executing what this kernel completes.
  for (auto& op : l->ops) {
    Instance& in = *op;
    bool last;
    {
      std::lock_guard lk(in.mu);
      last = ++in.arrived == static_cast<int>(in.parts.size());
    }
    if (!last) continue;
    execute(in);
    g_ops_completed.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard lk(in.mu);
      in.done = true;
    }
    in.cv.notify_all();
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(cfg.timeout_ms);
  for (auto& op : l->ops) {
    Instance& in = *op;
    std::unique_lock lk(in.mu);
    if (!in.cv.wait_until(lk, deadline, [&] { return in.done; })) {
      std::fprintf(stderr,
                   "simnccl: rank %d: %s still waits for its peers after %llu ms "
                   "(SIMNCCL_TIMEOUT_MS); giving up\n",
                   l->comm->rank, coll_name(in.parts[0].coll),
                   static_cast<unsigned long long>(cfg.timeout_ms));
      l->comm->fail(ncclRemoteError);
      break;
    }
  }
  if (cfg.check_mappings) {
    mapping_signatures(l->ranges, l->after);
    for (size_t i = 0; i < l->ranges.size(); ++i) {
      if (l->before[i] == l->after[i]) continue;
      g_mapping_changes.fetch_add(1, std::memory_order_relaxed);
      l->comm->fail(ncclUnhandledCudaError);
      std::fprintf(stderr,
                   "simnccl: rank %d: the mapping of [%#lx, %#lx) changed while a collective "
                   "used it\n",
                   l->comm->rank, static_cast<unsigned long>(l->ranges[i].lo),
                   static_cast<unsigned long>(l->ranges[i].hi));
    }
  }
  Clique* c = l->clique;
  std::lock_guard lk(c->mu);
  l->finished.store(true);
  c->cv.notify_all();
}

uint64_t kernel_duration(const void* params, size_t, void*) {
  Launch* l = nullptr;
  std::memcpy(&l, params, sizeof l);
  return l->duration_ns;
}

// The kernel, registered once per device (in that device's context).
std::mutex g_fn_mu;
std::map<int, CUfunction> g_fns;

CUresult kernel_for(int device, CUfunction* out) {
  std::lock_guard lk(g_fn_mu);
  if (auto it = g_fns.find(device); it != g_fns.end()) {
    *out = it->second;
    return CUDA_SUCCESS;
  }
  static const size_t sizes[] = {sizeof(void*)};
  simcuda_kernel_desc d{};
  d.name = "ncclDevKernel_simnccl";
  d.fn = kernel;
  d.param_sizes = sizes;
  d.num_params = 1;
  d.duration_fn = kernel_duration;
  CUresult r = simcuda_register_function(&d, out);
  if (r == CUDA_SUCCESS) g_fns[device] = *out;
  return r;
}

// Makes a context current on the calling thread if none is (what the CUDA
// runtime does on first use), and returns its device.
ncclResult_t current_device(int* device) {
  if (cuInit(0) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  CUcontext ctx = nullptr;
  if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  if (!ctx) {
    CUdevice dev = 0;
    if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
      return ncclUnhandledCudaError;
  }
  CUdevice dev = 0;
  if (cuCtxGetDevice(&dev) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  *device = dev;
  return ncclSuccess;
}

// ---- Calls, and groups.
struct Call {
  Part part;
  CUstream stream = nullptr;
};

struct GroupState {
  int depth = 0;
  ncclResult_t error = ncclSuccess;  // the first failed call inside the group
  std::vector<Call> calls;
};
thread_local GroupState t_group;

ncclResult_t check_comm(ncclComm_t comm) {
  return comm && !reinterpret_cast<Comm*>(comm)->destroyed ? ncclSuccess : ncclInvalidArgument;
}

size_t bytes_of(const Part& p) {
  return p.count * type_size(p.type);
}

// Queues one kernel per communicator of `calls`.
ncclResult_t launch(std::vector<Call>& calls) {
  // Group by communicator, in call order; one stream per communicator, and
  // no two ranks of a clique on one stream (their kernels wait for each other).
  std::vector<std::pair<Comm*, std::vector<Call*>>> by_comm;
  for (Call& c : calls) {
    auto it = std::find_if(by_comm.begin(), by_comm.end(),
                           [&](auto& e) { return e.first == c.part.comm; });
    if (it == by_comm.end()) {
      by_comm.push_back({c.part.comm, {}});
      it = by_comm.end() - 1;
    }
    if (!it->second.empty() && it->second[0]->stream != c.stream) {
      std::fprintf(stderr, "simnccl: one communicator used with two streams in a group\n");
      return ncclInvalidUsage;
    }
    it->second.push_back(&c);
  }
  for (size_t i = 0; i < by_comm.size(); ++i)
    for (size_t j = i + 1; j < by_comm.size(); ++j)
      if (by_comm[i].first->clique == by_comm[j].first->clique &&
          by_comm[i].second[0]->stream == by_comm[j].second[0]->stream) {
        std::fprintf(stderr, "simnccl: two ranks of a communicator on one stream\n");
        return ncclInvalidUsage;
      }
  for (auto& [comm, cs] : by_comm) {
    CUfunction fn = nullptr;
    if (kernel_for(comm->device, &fn) != CUDA_SUCCESS) return ncclUnhandledCudaError;
    Clique* cl = comm->clique;
    auto l = std::make_unique<Launch>();
    l->clique = cl;
    l->comm = comm;
    const int n = cl->nranks;
    uint64_t bytes = 0;
    {
      std::lock_guard lk(cl->mu);
      // Forget the kernels that are done.
      std::erase_if(cl->launches,
                    [](const std::unique_ptr<Launch>& x) { return x->finished.load(); });
      for (Call* c : cs) {
        const Part& p = c->part;
        std::shared_ptr<Instance> in;
        size_t slot = 0;
        if (p.coll == Coll::kSend || p.coll == Coll::kRecv) {
          const bool send = p.coll == Coll::kSend;
          const int src = send ? comm->rank : p.root, dst = send ? p.root : comm->rank;
          const uint64_t seq = (send ? comm->sends : comm->recvs)[p.root]++;
          auto key = std::make_tuple(src, dst, seq);
          auto& slot_in = cl->p2p[key];
          if (!slot_in) {
            slot_in = std::make_shared<Instance>();
            slot_in->parts.resize(2);
          }
          in = slot_in;
          slot = send ? 0 : 1;
          in->parts[slot] = p;
          in->parts[slot].present = true;
          if (in->parts[0].present && in->parts[1].present) cl->p2p.erase(key);
        } else {
          auto& slot_in = cl->colls[comm->next_coll++];
          if (!slot_in) {
            slot_in = std::make_shared<Instance>();
            slot_in->parts.resize(static_cast<size_t>(n));
          }
          in = slot_in;
          slot = static_cast<size_t>(comm->rank);
          in->parts[slot] = p;
          in->parts[slot].present = true;
          if (std::all_of(in->parts.begin(), in->parts.end(), [](auto& q) { return q.present; }))
            cl->colls.erase(comm->next_coll - 1);
        }
        l->ops.push_back(std::move(in));
        // The ranges this rank's part touches (mapping checks).
        const size_t b = bytes_of(p);
        const bool root = comm->rank == p.root;
        size_t sb = b, rb = b;
        if (p.coll == Coll::kAllGather) rb = b * static_cast<size_t>(n);
        if (p.coll == Coll::kReduceScatter) sb = b * static_cast<size_t>(n);
        if (p.coll == Coll::kBroadcast && !root) sb = 0;
        if (p.coll == Coll::kReduce && !root) rb = 0;
        if (p.coll == Coll::kSend) rb = 0;
        if (p.coll == Coll::kRecv) sb = 0;
        auto add = [&](const void* q, size_t len) {
          const auto lo = reinterpret_cast<uintptr_t>(q);
          if (!q || !len) return;
          for (const Range& x : l->ranges)
            if (x.lo == lo && x.hi == lo + len) return;  // in place: once
          l->ranges.push_back({lo, lo + len});
        };
        add(p.send, sb);
        add(p.recv, rb);
        bytes += std::max(sb, rb);
      }
      l->before.reserve(l->ranges.size());
      l->after.reserve(l->ranges.size());
      // Virtual time: a fixed latency per operation plus bytes at the link rate.
      l->duration_ns = 5000 * cs.size() + bytes / settings().gbps;
    }
    Launch* raw = l.get();
    void* args[] = {&raw};
    {
      std::lock_guard lk(cl->mu);
      cl->launches.push_back(std::move(l));
    }
    CUresult r = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, cs[0]->stream, args, nullptr);
    if (r != CUDA_SUCCESS) {
      std::lock_guard lk(cl->mu);
      raw->finished.store(true);  // it never runs; its peers time out
      return ncclUnhandledCudaError;
    }
  }
  return ncclSuccess;
}

ncclResult_t submit(const Part& p, cudaStream_t stream) {
  ncclResult_t r = check_comm(reinterpret_cast<ncclComm_t>(p.comm));
  if (r != ncclSuccess) {
    if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = r;
    return r;
  }
  const int n = p.comm->clique->nranks;
  const bool reducing =
      p.coll == Coll::kAllReduce || p.coll == Coll::kReduce || p.coll == Coll::kReduceScatter;
  if (type_size(p.type) == 0 || (reducing && !reducible(p.type))) r = ncclInvalidArgument;
  if (reducing && (p.op < ncclSum || p.op >= ncclNumOps)) r = ncclInvalidArgument;
  if (p.root < 0 || p.root >= n) r = ncclInvalidArgument;
  const bool root = p.comm->rank == p.root;
  const bool needs_send = p.coll != Coll::kRecv && (p.coll != Coll::kBroadcast || root);
  const bool needs_recv = p.coll != Coll::kSend && (p.coll != Coll::kReduce || root);
  if (p.count > 0 && ((needs_send && !p.send) || (needs_recv && !p.recv))) r = ncclInvalidArgument;
  if (r != ncclSuccess) {
    if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = r;
    return r;
  }
  Call c{p, reinterpret_cast<CUstream>(stream)};
  if (t_group.depth > 0) {
    t_group.calls.push_back(c);
    return ncclSuccess;
  }
  std::vector<Call> one{c};
  return launch(one);
}

Part part(Coll coll, ncclComm_t comm, const void* send, void* recv, size_t count,
          ncclDataType_t type, ncclRedOp_t op, int root) {
  Part p;
  p.coll = coll;
  p.comm = reinterpret_cast<Comm*>(comm);
  p.send = send;
  p.recv = recv;
  p.count = count;
  p.type = type;
  p.op = op;
  p.root = root;
  return p;
}

Clique* new_clique(int nranks) {
  auto* c = new Clique;
  c->nranks = nranks;
  for (int r = 0; r < nranks; ++r) {
    auto comm = std::make_unique<Comm>();
    comm->clique = c;
    comm->rank = r;
    c->comms.push_back(std::move(comm));
  }
  return c;
}

// ncclCommInitRank: cliques being formed, by id.
std::mutex g_init_mu;
std::condition_variable g_init_cv;
std::map<std::string, Clique*>* g_forming = new std::map<std::string, Clique*>;

}  // namespace
}  // namespace simnccl

using namespace simnccl;

NCCL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_EXPORT const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  static std::atomic<uint64_t> counter{0};
  std::memset(id->internal, 0, sizeof id->internal);
  const uint64_t words[3] = {static_cast<uint64_t>(::getpid()), counter.fetch_add(1),
                             static_cast<uint64_t>(Clock::now().time_since_epoch().count())};
  std::memcpy(id->internal, words, sizeof words);
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms || ndev <= 0) return ncclInvalidArgument;
  int device = 0;
  if (ncclResult_t r = current_device(&device); r != ncclSuccess) return r;
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_SUCCESS || count <= 0) return ncclUnhandledCudaError;
  for (int i = 0; devlist && i < ndev; ++i)
    if (devlist[i] < 0 || devlist[i] >= count) return ncclInvalidArgument;
  CUfunction fn;
  if (kernel_for(device, &fn) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  Clique* c = new_clique(ndev);
  for (int r = 0; r < ndev; ++r) {
    // Ranks share the simulated device(s): rank r on devlist[r], or r modulo
    // the device count without a list.
    c->comms[static_cast<size_t>(r)]->device = devlist ? devlist[r] : r % count;
    comms[r] = reinterpret_cast<ncclComm_t>(c->comms[static_cast<size_t>(r)].get());
  }
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || nranks <= 0 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  int device = 0;
  if (ncclResult_t r = current_device(&device); r != ncclSuccess) return r;
  CUfunction fn;
  if (kernel_for(device, &fn) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  const std::string key(id.internal, sizeof id.internal);
  std::unique_lock lk(g_init_mu);
  Clique*& c = (*g_forming)[key];
  if (!c) c = new_clique(nranks);
  Clique* cl = c;
  if (cl->nranks != nranks) return ncclInvalidArgument;
  Comm* me = cl->comms[static_cast<size_t>(rank)].get();
  me->device = device;
  if (++cl->joined == nranks) {
    g_forming->erase(key);
    g_init_cv.notify_all();
  } else if (!g_init_cv.wait_for(lk, std::chrono::milliseconds(settings().timeout_ms),
                                 [&] { return cl->joined == nranks; })) {
    std::fprintf(stderr,
                 "simnccl: ncclCommInitRank: %d of %d ranks joined (ranks in other processes "
                 "are not modelled)\n",
                 cl->joined, nranks);
    --cl->joined;
    return ncclSystemError;
  }
  *comm = reinterpret_cast<ncclComm_t>(me);
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (check_comm(comm) != ncclSuccess) return ncclInvalidArgument;
  Comm* me = reinterpret_cast<Comm*>(comm);
  Clique* c = me->clique;
  std::unique_lock lk(c->mu);
  auto mine_done = [&] {
    for (auto& l : c->launches)
      if (l->comm == me && !l->finished.load()) return false;
    return true;
  };
  // Wait for this rank's kernels, but not for ever: after a fault the
  // context drops queued work, which then never finishes.
  const auto deadline = Clock::now() + std::chrono::milliseconds(settings().timeout_ms);
  while (!mine_done() && Clock::now() < deadline) {
    if (simcuda_sticky_error(me->device, nullptr, 0) != CUDA_SUCCESS) break;
    c->cv.wait_for(lk, std::chrono::milliseconds(10));
  }
  me->destroyed = true;
  for (auto& other : c->comms)
    if (!other->destroyed) return ncclSuccess;
  const bool all_done = std::all_of(c->launches.begin(), c->launches.end(),
                                    [](auto& l) { return l->finished.load(); });
  lk.unlock();
  if (all_done) {
    delete c;
  } else {
    std::lock_guard g(g_graveyard_mu);
    g_graveyard->push_back(c);
  }
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  if (check_comm(comm) != ncclSuccess || !err) return ncclInvalidArgument;
  *err = static_cast<ncclResult_t>(reinterpret_cast<Comm*>(comm)->async_error.load());
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (check_comm(comm) != ncclSuccess || !count) return ncclInvalidArgument;
  *count = reinterpret_cast<Comm*>(comm)->clique->nranks;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (check_comm(comm) != ncclSuccess || !device) return ncclInvalidArgument;
  *device = reinterpret_cast<Comm*>(comm)->device;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (check_comm(comm) != ncclSuccess || !rank) return ncclInvalidArgument;
  *rank = reinterpret_cast<Comm*>(comm)->rank;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  return submit(part(Coll::kAllReduce, comm, sendbuff, recvbuff, count, datatype, op, 0), stream);
}

NCCL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       cudaStream_t stream) {
  return submit(part(Coll::kAllGather, comm, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0),
                stream);
}

NCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  return submit(part(Coll::kReduceScatter, comm, sendbuff, recvbuff, recvcount, datatype, op, 0),
                stream);
}

NCCL_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  return submit(part(Coll::kBroadcast, comm, sendbuff, recvbuff, count, datatype, ncclSum, root),
                stream);
}

NCCL_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  return submit(part(Coll::kReduce, comm, sendbuff, recvbuff, count, datatype, op, root), stream);
}

NCCL_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                  int peer, ncclComm_t comm, cudaStream_t stream) {
  return submit(part(Coll::kSend, comm, sendbuff, nullptr, count, datatype, ncclSum, peer), stream);
}

NCCL_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  return submit(part(Coll::kRecv, comm, nullptr, recvbuff, count, datatype, ncclSum, peer), stream);
}

NCCL_EXPORT ncclResult_t ncclGroupStart(void) {
  ++t_group.depth;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclGroupEnd(void) {
  if (t_group.depth == 0) return ncclInvalidUsage;
  if (--t_group.depth > 0) return ncclSuccess;
  std::vector<Call> calls;
  calls.swap(t_group.calls);
  const ncclResult_t earlier = t_group.error;
  t_group.error = ncclSuccess;
  // A call that failed inside the group fails the group: nothing is queued.
  if (earlier != ncclSuccess) return earlier;
  return calls.empty() ? ncclSuccess : launch(calls);
}

NCCL_EXPORT void simnccl_set_delay_us(uint64_t us) {
  settings().delay_us.store(us);
}

NCCL_EXPORT uint64_t simnccl_mapping_changes(void) {
  return g_mapping_changes.load();
}

NCCL_EXPORT uint64_t simnccl_ops_completed(void) {
  return g_ops_completed.load();
}
