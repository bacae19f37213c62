// NCCL interposition (docs/nccl.md). NCCL's kernels reach their buffers
// through pointers kept in device memory, which CUPTI's argument scan cannot
// see. When libspillway.so is preloaded, these definitions come before
// libnccl.so.2's: each restores the blocks under the call's buffers, holds
// them resident, calls the next definition (dlsym RTLD_NEXT), and releases
// the hold once the work the call queued on its stream is done (a host
// function on that stream marks it; a thread of ours does the release, since
// a host function must not wait for the allocator, which may itself be
// waiting for that stream). Inside ncclGroupStart..ncclGroupEnd the work is
// queued at the outermost ncclGroupEnd, so the holds of every call of the
// group last until all the group's streams are past it.
//
// Each hook is one INTERCEPTOR(ret, name, params...) { ... } that calls on
// through REAL(name) (the macros are defined just above the hooks), so that
// the signature is written once and a new entry point is its definition, its
// name in NCCL_REAL_FUNCTIONS and a line in libspillway.map.
//
// No NCCL header is needed: the few types used are NCCL's ABI (ints and
// pointers), declared here.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "driver.h"
#include "log.h"
#include "runtime.h"

namespace spillway::nccl {
namespace {

// NCCL's ABI: ncclResult_t, ncclDataType_t and ncclRedOp_t are int-sized
// enums, ncclComm_t is `struct ncclComm*`, cudaStream_t is CUstream.
using Result = int;
constexpr Result kSuccess = 0, kSystemError = 2, kInProgress = 7;
struct ncclComm;
using Comm = ncclComm*;
using DataType = int;
using RedOp = int;

// Bytes per element of each ncclDataType_t (ncclInt8 .. ncclFloat8e5m2), 0
// for a type this build does not know.
size_t type_size(DataType t) {
  static constexpr size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return t >= 0 && static_cast<size_t>(t) < std::size(kSizes) ? kSizes[t] : 0;
}

using CommIntFn = Result (*)(Comm, int*);

// Every NCCL function reached through REAL(): the hooked ones, then the
// queries the hooks make. REAL(name) of a name missing here does not compile.
// clang-format off
#define NCCL_REAL_FUNCTIONS(X) \
  X(ncclAllReduce)            \
  X(ncclAllGather)            \
  X(ncclReduceScatter)        \
  X(ncclBroadcast)            \
  X(ncclReduce)               \
  X(ncclSend)                 \
  X(ncclRecv)                 \
  X(ncclGroupStart)           \
  X(ncclGroupEnd)             \
  X(ncclCommCount)            \
  X(ncclCommUserRank)
// clang-format on

void* find(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  // NCCL loaded with RTLD_LOCAL (dlopen by a framework) is not in the global
  // scope: look in it directly if it is loaded.
  if (!p)
    if (void* h = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD)) {
      p = dlsym(h, name);
      dlclose(h);
    }
  return p;
}

// Untyped, so that the table can precede the hooks that give each entry its
// type (REAL casts).
struct RealTable {
#define REAL_SLOT(name) void* name = nullptr;
  NCCL_REAL_FUNCTIONS(REAL_SLOT)
#undef REAL_SLOT
};

// Looked up together, once, on the first call of any hook: the hooks and the
// queries they make then never disagree on which NCCL they reach, even if
// one is loaded later.
const RealTable& real_table() {
  static const RealTable t = [] {
    RealTable x;
#define REAL_FIND(name) x.name = find(#name);
    NCCL_REAL_FUNCTIONS(REAL_FIND)
#undef REAL_FIND
    return x;
  }();
  return t;
}

// The caller reached an NCCL entry point that no library after this one
// defines (NCCL is not loaded): what NCCL returns when a system facility it
// needs is missing.
Result missing(const char* name) {
  static std::once_flag once;
  std::call_once(once, [name] {
    std::fprintf(stderr,
                 "spillway: %s called but no NCCL library is loaded after libspillway.so; "
                 "returning ncclSystemError\n",
                 name);
  });
  return kSystemError;
}

// ---- Holds waiting for their streams. A record is one call's (or one
// group's) ranges; records are recycled, so a steady state allocates nothing.
struct Record {
  std::vector<Touch> touches;
  std::atomic<uint32_t> streams_left{0};
  Record* next = nullptr;  // free list, or the done stack
};

std::mutex g_pool_mu;
Record* g_pool = nullptr;  // never freed: host functions may run at exit

Record* take_record() {
  {
    std::lock_guard lk(g_pool_mu);
    if (Record* r = g_pool) {
      g_pool = r->next;
      r->next = nullptr;
      return r;
    }
  }
  auto* r = new Record;
  r->touches.reserve(4);
  return r;
}

void give_record(Record* r) {
  r->touches.clear();
  std::lock_guard lk(g_pool_mu);
  r->next = g_pool;
  g_pool = r;
}

void release_now(Runtime& rt, Record* r) {
  if (!r->touches.empty()) rt.release(r->touches.data(), r->touches.size());
  give_record(r);
}

// Records whose streams are done, pushed by host functions (which take no
// lock), released by one thread.
std::atomic<Record*> g_done{nullptr};

void releaser() {
  for (;;) {
    g_done.wait(nullptr, std::memory_order_acquire);
    Record* r = g_done.exchange(nullptr, std::memory_order_acquire);
    Runtime* rt = Runtime::peek();
    while (r) {
      Record* nxt = r->next;
      if (rt) release_now(*rt, r);
      r = nxt;
    }
  }
}

void CUDA_CB stream_done(void* p) {
  auto* r = static_cast<Record*>(p);
  if (r->streams_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Record* head = g_done.load(std::memory_order_relaxed);
  do {
    r->next = head;
  } while (
      !g_done.compare_exchange_weak(head, r, std::memory_order_release, std::memory_order_relaxed));
  g_done.notify_one();
}

void start_releaser() {
  static std::once_flag once;
  std::call_once(once, [] { std::thread(releaser).detach(); });
}

// Releases `r` once the work queued so far on each of `streams` is done.
// On a capturing stream the work runs when the graph does, which this cannot
// follow: the hold then stays until the blocks are freed.
void release_after(Runtime& rt, Record* r, const CUstream* streams, size_t n) {
  std::string why;
  const cu::Driver* d = cu::load(&why);
  if (!d) return release_now(rt, r);
  start_releaser();
  InternalCalls internal;
  for (size_t i = 0; i < n; ++i) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d->cuStreamIsCapturing(streams[i], &st) == CUDA_SUCCESS &&
        st != CU_STREAM_CAPTURE_STATUS_NONE) {
      log::debug("NCCL call on a capturing stream: its buffers stay resident until freed");
      give_record(r);  // the holds are kept, the record is not needed
      return;
    }
  }
  r->streams_left.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    // If the function cannot be queued, nothing more runs on that stream
    // either: count it done now.
    if (CUresult e = d->cuLaunchHostFunc(streams[i], stream_done, r); e != CUDA_SUCCESS) {
      log::warn(
          "cuLaunchHostFunc({}, ...) after an NCCL call failed: {}; its buffers are "
          "released now",
          static_cast<const void*>(streams[i]), cu::describe(*d, e));
      stream_done(r);
    }
  }
}

// ---- Groups (thread-local, as NCCL's own group state is).
struct Group {
  int depth = 0;
  Record* rec = nullptr;          // the holds of the group's calls
  std::vector<CUstream> streams;  // distinct
};
thread_local Group t_group;

// The ranges of one call that spillway may own.
struct Ranges {
  Touch t[2];
  size_t n = 0;
  void add(Runtime& rt, const void* p, size_t bytes) {
    if (!p || bytes == 0) return;
    const auto lo = reinterpret_cast<uintptr_t>(p);
    if (rt.may_own(lo)) t[n++] = {lo, lo + bytes};
  }
};

// Around one call: restore and hold its buffers, call, then release when
// its stream work is done (or at once if it failed to queue anything).
template <class Call>
Result around(const char* name, const void* send, size_t send_bytes, const void* recv,
              size_t recv_bytes, CUstream stream, Call&& call) {
  Runtime* rt = Runtime::peek();
  if (!rt || InternalCalls::active()) return call();
  Ranges rs;
  rs.add(*rt, send, send_bytes);
  rs.add(*rt, recv, recv_bytes);
  if (rs.n == 0) return call();  // nothing of ours: nothing to do
  Access a;
  a.kind = Access::Kind::kCollective;
  a.stream = stream;
  a.name = name;
  a.seq = rt->next_access_seq();
  // before_use restores the blocks, records the call's stream as a user
  // (their free waits for it) and holds them: no eviction can start on one
  // before the call is queued, nor while the collective runs (released then).
  rt->before_use(a, rs.t, rs.n);
  const Result res = call();
  Group& g = t_group;
  const bool queued = res == kSuccess || res == kInProgress;
  if (!queued) {
    // Nothing was queued (NCCL checks its arguments before queueing).
    rt->release(rs.t, rs.n);
    return res;
  }
  if (g.depth > 0) {
    if (!g.rec) g.rec = take_record();
    g.rec->touches.insert(g.rec->touches.end(), rs.t, rs.t + rs.n);
    if (std::find(g.streams.begin(), g.streams.end(), stream) == g.streams.end())
      g.streams.push_back(stream);
    return res;
  }
  Record* r = take_record();
  r->touches.assign(rs.t, rs.t + rs.n);
  release_after(*rt, r, &stream, 1);
  return res;
}

// `count` elements of `t` in bytes. For a type this build does not know
// (a newer NCCL's), one byte: the block under the pointer is still held.
size_t bytes(size_t count, DataType t) {
  const size_t s = type_size(t);
  return count == 0 ? 0 : s ? count * s : 1;
}

int comm_int(CommIntFn f, Comm comm, int fallback) {
  int v = fallback;
  if (!f || f(comm, &v) != kSuccess) return fallback;
  return v;
}

}  // namespace
}  // namespace spillway::nccl

using namespace spillway::nccl;

// INTERCEPTOR(ret, name, params...) { body } defines the exported `name`,
// whose body reaches the definition it stands in front of as REAL(name): null
// when no library after this one defines it, so each body checks it first.
// DECLARE_REAL types a function the hooks call without interposing on it.
#define DECLARE_REAL(ret, name, ...) using name##_real_t = ret (*)(__VA_ARGS__)
#define INTERCEPTOR(ret, name, ...)     \
  DECLARE_REAL(ret, name, __VA_ARGS__); \
  extern "C" __attribute__((visibility("default"))) ret name(__VA_ARGS__)
#define REAL(name) reinterpret_cast<name##_real_t>(::spillway::nccl::real_table().name)

DECLARE_REAL(Result, ncclCommCount, Comm comm, int* count);
DECLARE_REAL(Result, ncclCommUserRank, Comm comm, int* rank);

INTERCEPTOR(Result, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
            DataType datatype, RedOp op, Comm comm, CUstream stream) {
  if (!REAL(ncclAllReduce)) return missing(__func__);
  const size_t b = bytes(count, datatype);
  return around(__func__, sendbuff, b, recvbuff, b, stream, [&] {
    return REAL(ncclAllReduce)(sendbuff, recvbuff, count, datatype, op, comm, stream);
  });
}

INTERCEPTOR(Result, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
            DataType datatype, Comm comm, CUstream stream) {
  if (!REAL(ncclAllGather)) return missing(__func__);
  const size_t b = bytes(sendcount, datatype);
  const size_t ranks = static_cast<size_t>(std::max(1, comm_int(REAL(ncclCommCount), comm, 1)));
  return around(__func__, sendbuff, b, recvbuff, b * ranks, stream, [&] {
    return REAL(ncclAllGather)(sendbuff, recvbuff, sendcount, datatype, comm, stream);
  });
}

INTERCEPTOR(Result, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
            DataType datatype, RedOp op, Comm comm, CUstream stream) {
  if (!REAL(ncclReduceScatter)) return missing(__func__);
  const size_t b = bytes(recvcount, datatype);
  const size_t ranks = static_cast<size_t>(std::max(1, comm_int(REAL(ncclCommCount), comm, 1)));
  return around(__func__, sendbuff, b * ranks, recvbuff, b, stream, [&] {
    return REAL(ncclReduceScatter)(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  });
}

INTERCEPTOR(Result, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
            DataType datatype, int root, Comm comm, CUstream stream) {
  if (!REAL(ncclBroadcast)) return missing(__func__);
  const size_t b = bytes(count, datatype);
  // sendbuff is read on the root only (elsewhere it may be anything).
  const bool is_root = comm_int(REAL(ncclCommUserRank), comm, root) == root;
  return around(__func__, is_root ? sendbuff : nullptr, b, recvbuff, b, stream, [&] {
    return REAL(ncclBroadcast)(sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

INTERCEPTOR(Result, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
            DataType datatype, RedOp op, int root, Comm comm, CUstream stream) {
  if (!REAL(ncclReduce)) return missing(__func__);
  const size_t b = bytes(count, datatype);
  // recvbuff is written on the root only.
  const bool is_root = comm_int(REAL(ncclCommUserRank), comm, root) == root;
  return around(__func__, sendbuff, b, is_root ? recvbuff : nullptr, b, stream, [&] {
    return REAL(ncclReduce)(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  });
}

INTERCEPTOR(Result, ncclSend, const void* sendbuff, size_t count, DataType datatype, int peer,
            Comm comm, CUstream stream) {
  if (!REAL(ncclSend)) return missing(__func__);
  return around(__func__, sendbuff, bytes(count, datatype), nullptr, 0, stream,
                [&] { return REAL(ncclSend)(sendbuff, count, datatype, peer, comm, stream); });
}

INTERCEPTOR(Result, ncclRecv, void* recvbuff, size_t count, DataType datatype, int peer, Comm comm,
            CUstream stream) {
  if (!REAL(ncclRecv)) return missing(__func__);
  return around(__func__, nullptr, 0, recvbuff, bytes(count, datatype), stream,
                [&] { return REAL(ncclRecv)(recvbuff, count, datatype, peer, comm, stream); });
}

INTERCEPTOR(Result, ncclGroupStart) {
  if (!REAL(ncclGroupStart)) return missing(__func__);
  const Result r = REAL(ncclGroupStart)();
  if (r == kSuccess) ++t_group.depth;
  return r;
}

INTERCEPTOR(Result, ncclGroupEnd) {
  if (!REAL(ncclGroupEnd)) return missing(__func__);
  const Result r = REAL(ncclGroupEnd)();
  Group& g = t_group;
  if (g.depth == 0 || --g.depth > 0) return r;
  Record* rec = g.rec;
  g.rec = nullptr;
  if (!rec) {
    g.streams.clear();
    return r;
  }
  // Whatever the result, the group's work (if any was queued) is on these
  // streams: release behind it.
  spillway::Runtime* rt = spillway::Runtime::peek();
  if (rt) release_after(*rt, rec, g.streams.data(), g.streams.size());
  g.streams.clear();
  return r;
}
