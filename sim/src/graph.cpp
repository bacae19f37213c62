#include "graph.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "stream.h"

namespace sim::graph {
namespace {

struct Node {
  std::string what;
  Emit emit;
};

struct GraphObj {
  Context* ctx = nullptr;
  std::vector<Node> nodes;
  bool capturing = false;  // being built by a capture: not instantiable, not destroyable
};

struct ExecObj {
  Context* ctx = nullptr;
  std::vector<Node> nodes;
  std::mutex mu;
  std::shared_ptr<Op> last;  // last op of the previous launch (launches are ordered)
};

struct Capture {
  uint64_t id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  Context* ctx = nullptr;
  uint64_t graph_handle = 0;
  std::shared_ptr<GraphObj> graph;  // reset when the capture ends
  Stream* origin = nullptr;
  std::vector<std::shared_ptr<Stream>> members;  // origin first, then joined streams
  bool invalidated = false;
  bool ended = false;
};

// A stream taking part in a capture.
struct Member {
  std::shared_ptr<Capture> cap;
  uint64_t seq = 0;    // nodes captured from this stream
  bool joined = true;  // (forked streams) no work after the last join into another member
};

// An event whose latest record was made in a capture.
struct Mark {
  std::shared_ptr<Capture> cap;
  Stream* stream = nullptr;
  uint64_t seq = 0;  // the stream's seq at the record
};

// Everything in the registry is protected by its mutex. Lock order: that
// mutex, then State::handles_mu (new_handle) -- never the other way round.
// Never destroyed, like State: API calls may still arrive during exit.
struct Registry {
  std::mutex mu;
  uint64_t next_capture_id = 1;
  std::unordered_map<Stream*, Member> members;
  std::vector<std::shared_ptr<Capture>> live;  // captures begun and not ended
  std::unordered_map<uint64_t, Mark> marks;    // by event handle
  std::unordered_map<uint64_t, std::shared_ptr<GraphObj>> graphs;
  std::unordered_map<uint64_t, std::shared_ptr<ExecObj>> execs;
};

Registry& R() {
  static Registry* const r = new Registry;
  return *r;
}

thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

uint64_t key(const void* h) {
  return reinterpret_cast<uint64_t>(h);
}

bool blocking(const Stream& s) {
  return !s.legacy && !(s.flags & CU_STREAM_NON_BLOCKING);
}

void invalidate(Capture& c) {
  c.invalidated = true;
}

// cuda.h (cuStreamIsCapturing): "When a blocking stream is capturing, the
// legacy stream is in an unusable state until the blocking stream capture is
// terminated ... attempted use would have an implicit dependency on the
// capturing stream(s)". True if a blocking stream of `ctx` captures; with
// `inv`, those captures are invalidated.
bool legacy_conflict(Context* ctx, bool inv) {
  bool found = false;
  for (const auto& c : R().live) {
    for (const auto& m : c->members) {
      if (m->ctx != ctx || !blocking(*m)) continue;
      found = true;
      if (inv) invalidate(*c);
      break;
    }
  }
  return found;
}

CUresult implicit(Context* ctx, const char* what) {
  if (!legacy_conflict(ctx, true)) return CUDA_SUCCESS;
  return refuse(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                "%s: the legacy stream is unusable while a blocking stream captures "
                "(capture invalidated)",
                what);
}

bool valid_mode(int m) {
  return m == CU_STREAM_CAPTURE_MODE_GLOBAL || m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         m == CU_STREAM_CAPTURE_MODE_RELAXED;
}

}  // namespace

CUresult intercept(const std::shared_ptr<Stream>& s, const char* what, bool host_waits,
                   const Emit& emit, bool* captured) {
  *captured = false;
  std::lock_guard lk(R().mu);
  auto it = R().members.find(s.get());
  if (it == R().members.end()) {
    if (!s->legacy) return CUDA_SUCCESS;
    CUresult e = implicit(s->ctx, what);
    *captured = e != CUDA_SUCCESS;
    return e;
  }
  *captured = true;
  Member& m = it->second;
  Capture& c = *m.cap;
  if (c.invalidated)
    return refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "%s: capture %llu was invalidated", what,
                  static_cast<unsigned long long>(c.id));
  if (host_waits) {
    invalidate(c);
    return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  "%s: the host would wait for this work, which a capturing stream never runs "
                  "(capture invalidated)",
                  what);
  }
  c.graph->nodes.push_back({what, emit});
  ++m.seq;
  if (s.get() != c.origin) m.joined = false;
  return CUDA_SUCCESS;
}

CUresult check_host_wait(const std::shared_ptr<Stream>& s, const char* what) {
  std::lock_guard lk(R().mu);
  auto it = R().members.find(s.get());
  if (it != R().members.end()) {
    invalidate(*it->second.cap);
    return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  "%s on a capturing stream (capture invalidated)", what);
  }
  if (s->legacy) return implicit(s->ctx, what);
  return CUDA_SUCCESS;
}

CUresult check_context_wait(Context* ctx, const char* what) {
  std::lock_guard lk(R().mu);
  bool found = false;
  for (const auto& c : R().live) {
    if (c->ctx != ctx) continue;
    invalidate(*c);
    found = true;
  }
  if (!found) return CUDA_SUCCESS;
  return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                "%s while a stream of the context captures (captures invalidated)", what);
}

// cuda.h (cuThreadExchangeStreamCaptureMode): GLOBAL: prohibited "if the
// local thread has an ongoing capture sequence that was not initiated with
// CU_STREAM_CAPTURE_MODE_RELAXED ..., or if any other thread has a concurrent
// capture sequence initiated with CU_STREAM_CAPTURE_MODE_GLOBAL";
// THREAD_LOCAL: only the first condition; RELAXED: never.
CUresult check_unsafe(const char* what) {
  if (t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  std::lock_guard lk(R().mu);
  const auto self = std::this_thread::get_id();
  bool prohibited = false;
  for (const auto& c : R().live) {
    const bool own = c->thread == self && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool other = t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->thread != self &&
                       c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (!own && !other) continue;
    invalidate(*c);
    prohibited = true;
  }
  if (!prohibited) return CUDA_SUCCESS;
  return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                "%s is potentially unsafe during stream capture in this thread's capture mode "
                "(capture invalidated)",
                what);
}

CUresult event_record(const std::shared_ptr<Stream>& s, CUevent ev, bool* captured) {
  *captured = false;
  if (stream::event_status(ev) < 0) return CUDA_SUCCESS;  // the caller reports the bad handle
  std::lock_guard lk(R().mu);
  auto it = R().members.find(s.get());
  if (it == R().members.end()) {
    if (s->legacy) {
      CUresult e = implicit(s->ctx, "cuEventRecord");
      if (e != CUDA_SUCCESS) {
        *captured = true;
        return e;
      }
    }
    R().marks.erase(key(ev));
    return CUDA_SUCCESS;
  }
  *captured = true;
  Member& m = it->second;
  if (m.cap->invalidated)
    return refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "cuEventRecord: capture invalidated");
  R().marks[key(ev)] = Mark{m.cap, s.get(), m.seq};
  return CUDA_SUCCESS;
}

CUresult wait_event(const std::shared_ptr<Stream>& s, CUevent ev, unsigned flags, bool* handled) {
  *handled = false;
  const int status = stream::event_status(ev);
  if (status < 0) return CUDA_SUCCESS;  // the caller reports the bad handle
  if (flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) return CUDA_SUCCESS;  // likewise
  std::lock_guard lk(R().mu);
  auto mit = R().marks.find(key(ev));
  Mark* mark = mit == R().marks.end() ? nullptr : &mit->second;
  auto it = R().members.find(s.get());
  if (mark && mark->cap->ended) {
    *handled = true;
    return refuse(CUDA_ERROR_CAPTURED_EVENT,
                  "cuStreamWaitEvent: event %p was last recorded in a capture that has ended", ev);
  }
  if (it != R().members.end()) {
    *handled = true;
    Capture& c = *it->second.cap;
    if (c.invalidated)
      return refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                    "cuStreamWaitEvent: capture invalidated");
    if (mark && mark->cap.get() == &c) {
      // A dependency inside the capture: the nodes run in capture order
      // anyway. Waiting on a forked stream's latest work joins it.
      if (mark->stream != s.get()) {
        auto src = R().members.find(mark->stream);
        if (src != R().members.end() && src->second.seq == mark->seq) src->second.joined = true;
      }
      return CUDA_SUCCESS;
    }
    if (mark) {
      invalidate(c);
      return refuse(CUDA_ERROR_STREAM_CAPTURE_MERGE,
                    "cuStreamWaitEvent: event %p belongs to another capture (capture invalidated)",
                    ev);
    }
    if (status == 0) return CUDA_SUCCESS;  // never recorded: nothing to wait for (cuda.h)
    if (flags & CU_EVENT_WAIT_EXTERNAL)
      return refuse(CUDA_ERROR_NOT_SUPPORTED,
                    "cuStreamWaitEvent: external event wait nodes are not simulated");
    invalidate(c);
    return refuse(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                  "cuStreamWaitEvent: event %p was recorded outside the capture (capture "
                  "invalidated)",
                  ev);
  }
  if (mark) {
    // cross-stream fork: `s` joins the capture the event was recorded in.
    *handled = true;
    Capture& c = *mark->cap;
    if (s->legacy) {
      invalidate(c);
      return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                    "cuStreamWaitEvent: the legacy stream cannot join a capture (cuda.h: "
                    "\"Capture may not be initiated if stream is CU_STREAM_LEGACY\"); capture "
                    "invalidated");
    }
    if (s->ctx != c.ctx) {
      invalidate(c);
      return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                    "cuStreamWaitEvent: a stream of another context cannot join the capture");
    }
    c.members.push_back(s);
    R().members[s.get()] = Member{mark->cap, 0, true};
    if (c.invalidated)
      return refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                    "cuStreamWaitEvent: joined a capture that is invalidated");
    return CUDA_SUCCESS;
  }
  if (s->legacy) {
    CUresult e = implicit(s->ctx, "cuStreamWaitEvent");
    *handled = e != CUDA_SUCCESS;
    return e;
  }
  return CUDA_SUCCESS;
}

CUresult check_event_use(CUevent ev, const char* what) {
  std::lock_guard lk(R().mu);
  if (R().marks.count(key(ev)) == 0) return CUDA_SUCCESS;
  return refuse(CUDA_ERROR_CAPTURED_EVENT, "%s: event %p was last recorded in a capture", what, ev);
}

CUresult begin_capture(const std::shared_ptr<Stream>& s, CUstreamCaptureMode mode) {
  if (!valid_mode(static_cast<int>(mode)))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamBeginCapture: bad mode %d",
                  static_cast<int>(mode));
  // cuda.h: "Capture may not be initiated if stream is CU_STREAM_LEGACY".
  if (s->legacy)
    return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  "cuStreamBeginCapture: the legacy stream cannot capture");
  std::lock_guard lk(R().mu);
  // cuda.h: capture "may only be initiated if the stream is not already in
  // capture mode".
  if (R().members.count(s.get()))
    return refuse(CUDA_ERROR_ILLEGAL_STATE, "cuStreamBeginCapture: stream already capturing");
  auto g = std::make_shared<GraphObj>();
  g->ctx = s->ctx;
  g->capturing = true;
  auto c = std::make_shared<Capture>();
  c->id = R().next_capture_id++;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->ctx = s->ctx;
  c->graph = g;
  c->graph_handle = new_handle();
  c->origin = s.get();
  c->members.push_back(s);
  R().graphs[c->graph_handle] = g;
  R().members[s.get()] = Member{c, 0, true};
  R().live.push_back(c);
  return CUDA_SUCCESS;
}

CUresult end_capture(const std::shared_ptr<Stream>& s, CUgraph* out) {
  if (!out) return refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamEndCapture: null phGraph");
  std::lock_guard lk(R().mu);
  auto it = R().members.find(s.get());
  // cuda.h says only "Capture must have been initiated on hStream"; like
  // cuStreamUpdateCaptureDependencies ("Returns CUDA_ERROR_ILLEGAL_STATE if
  // the stream is not capturing"), the sim returns CUDA_ERROR_ILLEGAL_STATE.
  if (it == R().members.end())
    return refuse(CUDA_ERROR_ILLEGAL_STATE, "cuStreamEndCapture: stream is not capturing");
  std::shared_ptr<Capture> c = it->second.cap;
  if (c->origin != s.get())
    return refuse(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
                  "cuStreamEndCapture: capture was not initiated on this stream");
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != std::this_thread::get_id())
    return refuse(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                  "cuStreamEndCapture: capture begun on another thread");
  bool unjoined = false;
  for (const auto& m : c->members) {
    auto mi = R().members.find(m.get());
    if (mi != R().members.end() && m.get() != c->origin && !mi->second.joined) unjoined = true;
    R().members.erase(m.get());
  }
  c->members.clear();
  c->ended = true;
  R().live.erase(std::remove(R().live.begin(), R().live.end(), c), R().live.end());
  std::shared_ptr<GraphObj> g = std::move(c->graph);
  if (c->invalidated || unjoined) {
    // cuda.h: "If capture was invalidated ... then a NULL graph will be returned."
    R().graphs.erase(c->graph_handle);
    *out = nullptr;
    if (c->invalidated)
      return refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                    "cuStreamEndCapture: capture %llu was invalidated",
                    static_cast<unsigned long long>(c->id));
    c->invalidated = true;
    return refuse(CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                  "cuStreamEndCapture: a forked stream was not joined back");
  }
  g->capturing = false;
  *out = reinterpret_cast<CUgraph>(c->graph_handle);
  return CUDA_SUCCESS;
}

CUresult is_capturing(const std::shared_ptr<Stream>& s, CUstreamCaptureStatus* status) {
  return capture_info(s, status, nullptr, nullptr);
}

CUresult capture_info(const std::shared_ptr<Stream>& s, CUstreamCaptureStatus* status,
                      cuuint64_t* id, CUgraph* graph) {
  if (!status) return refuse(CUDA_ERROR_INVALID_VALUE, "capture status: null output");
  std::lock_guard lk(R().mu);
  auto it = R().members.find(s.get());
  if (it == R().members.end()) {
    // cuda.h: on the legacy stream while a blocking stream captures, this
    // returns CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; "The blocking stream
    // capture is not invalidated."
    if (s->legacy && legacy_conflict(s->ctx, false))
      return refuse(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                    "capture status of the legacy stream while a blocking stream captures");
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  const Capture& c = *it->second.cap;
  if (c.invalidated) {
    *status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    return CUDA_SUCCESS;
  }
  *status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id) *id = c.id;
  if (graph) *graph = reinterpret_cast<CUgraph>(c.graph_handle);
  return CUDA_SUCCESS;
}

CUresult exchange_mode(CUstreamCaptureMode* mode) {
  if (!mode || !valid_mode(static_cast<int>(*mode)))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuThreadExchangeStreamCaptureMode: bad mode");
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

CUresult instantiate(Context* ctx, CUgraphExec* out, CUgraph g, unsigned long long flags) {
  if (!out) return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: null phGraphExec");
  // Graphs here have no allocation nodes, so AUTO_FREE_ON_LAUNCH changes
  // nothing; UPLOAD needs cuGraphInstantiateWithParams; device launch is not
  // simulated.
  constexpr unsigned long long kAccepted = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                           CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (flags & ~kAccepted)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: unsupported flags %#llx", flags);
  std::lock_guard lk(R().mu);
  auto it = R().graphs.find(key(g));
  if (it == R().graphs.end())
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: graph %p does not exist", g);
  // cuda.h (cuStreamBeginCaptureToGraph): "The graph will not be
  // instantiable until the user calls cuStreamEndCapture."
  if (it->second->capturing)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: graph %p is being captured", g);
  if (it->second->ctx != ctx)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: graph of another context");
  auto e = std::make_shared<ExecObj>();
  e->ctx = ctx;
  e->nodes = it->second->nodes;
  const uint64_t h = new_handle();
  R().execs[h] = e;
  *out = reinterpret_cast<CUgraphExec>(h);
  return CUDA_SUCCESS;
}

CUresult launch(CUgraphExec exec, const std::shared_ptr<Stream>& s, CUstream user_handle) {
  std::shared_ptr<ExecObj> e;
  {
    std::lock_guard lk(R().mu);
    auto it = R().execs.find(key(exec));
    if (it == R().execs.end())
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphLaunch: graph exec %p does not exist", exec);
    e = it->second;
  }
  if (e->ctx != s->ctx)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphLaunch: stream of another context");
  // cuda.h (cuGraphLaunch): "Each launch is ordered behind both any previous
  // work in hStream and any previous launches of hGraphExec."
  Emit emit = [e](const std::shared_ptr<Stream>& st, CUstream h) -> std::shared_ptr<Op> {
    std::lock_guard lk(e->mu);
    auto gate = std::make_shared<Op>();
    gate->what = "graph launch";
    if (e->last) gate->deps.push_back(e->last);
    stream::enqueue_marker(st, gate);
    std::shared_ptr<Op> last = gate;
    for (const Node& n : e->nodes)
      if (auto op = n.emit(st, h)) last = op;
    e->last = last;
    return last;
  };
  // Launching into a capturing stream captures the whole graph as one node
  // (a child graph on hardware).
  bool captured = false;
  if (CUresult r = intercept(s, "cuGraphLaunch", false, emit, &captured); captured) return r;
  emit(s, user_handle);
  return CUDA_SUCCESS;
}

CUresult exec_destroy(CUgraphExec exec) {
  std::lock_guard lk(R().mu);
  // cuda.h: an in-flight executable graph "will not be terminated, but rather
  // freed asynchronously on completion" (queued ops own what they need).
  if (R().execs.erase(key(exec)) == 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphExecDestroy: graph exec %p does not exist",
                  exec);
  return CUDA_SUCCESS;
}

CUresult destroy(CUgraph g) {
  std::lock_guard lk(R().mu);
  auto it = R().graphs.find(key(g));
  if (it == R().graphs.end())
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphDestroy: graph %p does not exist", g);
  // cuda.h (cuStreamGetCaptureInfo): "All operations other than destroy and
  // node removal are permitted on the graph while the capture sequence is in
  // progress."
  if (it->second->capturing)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphDestroy: graph %p is being captured", g);
  R().graphs.erase(it);
  return CUDA_SUCCESS;
}

}  // namespace sim::graph
