// The replay itself: allocations through libspillway.so's C ABI, each LAUNCH
// as a simulated kernel launched with cuLaunchKernel (the touched pointers as
// its parameters, so the shim's CUPTI tracker sees them), copies through the
// driver, and the anchor strategies' own copies. See harness/README.md.
#include "engine.h"

#include <dlfcn.h>
#include <simcuda.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pattern.h"

namespace replay {

using namespace spillway::trace;

const char* name_of(Strategy s) {
  switch (s) {
    case Strategy::kSpillway:
      return "spillway";
    case Strategy::kNone:
      return "none";
    case Strategy::kSaveOnCpu:
      return "save_on_cpu";
    case Strategy::kTorchtune:
      return "torchtune";
    case Strategy::kLayerwise:
      return "layerwise";
  }
  return "?";
}

// What a kernel does with its touches (nullptr in accounting mode). The
// engine owns it until the step's end has synchronized: a kernel queued
// after a sticky error never runs, so it cannot free its own.
struct KernelWork {
  struct Part {
    uint64_t alloc = 0;
    uint64_t offset = 0;  // of the touch in its allocation (the pointer points there)
    uint64_t length = 0;
    bool write = false;
    std::vector<std::pair<uint64_t, uint64_t>> checks;  // allocation offsets holding the pattern
  };
  uint64_t launch = 0;
  uint64_t salt = 0;  // Engine::key: the pattern's key is alloc ^ salt
  std::vector<Part> parts;
  Integrity* integrity = nullptr;
};

namespace {

void replay_kernel(const void* params, size_t, const simcuda_launch_info*, void*) {
  KernelWork* w = nullptr;
  std::memcpy(&w, params, sizeof w);
  if (!w) return;
  const auto* p = static_cast<const unsigned char*>(params);
  for (size_t i = 0; i < w->parts.size(); ++i) {
    const KernelWork::Part& part = w->parts[i];
    unsigned char* at = nullptr;
    std::memcpy(&at, p + 16 + 8 * i, sizeof at);
    uint64_t checked = 0;
    for (const auto& [b, e] : part.checks) {
      const uint64_t key = part.alloc ^ w->salt;
      const uint64_t bad = pattern_check(at + (b - part.offset), key, b, e - b);
      checked += e - b;
      if (bad != UINT64_MAX) {
        w->integrity->report(part.alloc, bad, pattern_byte(key, bad), at[bad - part.offset],
                             w->launch);
        break;
      }
    }
    w->integrity->bytes_checked += checked;
    if (part.write) pattern_fill(at, part.alloc ^ w->salt, part.offset, part.length);
  }
}

uint64_t replay_duration(const void* params, size_t, void*) {
  uint64_t d = 0;
  std::memcpy(&d, static_cast<const char*>(params) + 8, 8);
  return d;
}

void corrupt_kernel(const void* params, size_t, const simcuda_launch_info*, void*) {
  unsigned char* at = nullptr;
  std::memcpy(&at, params, sizeof at);
  *at ^= 0x5A;
}

}  // namespace

void Integrity::report(uint64_t alloc, uint64_t offset, uint8_t want, uint8_t got,
                       uint64_t launch) {
  std::lock_guard lk(mu);
  ++mismatches;
  if (!first.empty()) return;
  char buf[256];
  const int n = device ? std::snprintf(buf, sizeof buf, "device %d: ", device) : 0;
  std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n),
                "allocation %" PRIu64 " byte %" PRIu64
                ": expected 0x%02x, read 0x%02x (checked by "
                "launch %" PRIu64 ")",
                alloc, offset, want, got, launch);
  first = buf;
}

bool Integrity::ok() {
  std::lock_guard lk(mu);
  return mismatches == 0;
}

std::string Integrity::first_mismatch() {
  std::lock_guard lk(mu);
  return first;
}

Engine::Engine(const Options& o, const Analysis& a, int device, StepBarrier* steps)
    : o_(o), a_(a), device_(device), steps_(steps) {
  integrity_.device = device;
}
Engine::~Engine() {
  // Everything the replay created goes before the context and the shim,
  // once no queued work can still use it (an error: this fails at once).
  cuCtxSynchronize();
  kernel_work_.clear();
  live_.clear();
  host_hold_.clear();
  stream_events_.clear();
  streams_.clear();
  d2h_ = Stream();
  h2d_ = Stream();
}

bool Engine::fail(std::string why) {
  if (error_.empty()) error_ = std::move(why);
  return false;
}

bool Engine::cu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::string why = std::string(what) + " failed: " + (name ? name : "?");
  if (r == CUDA_ERROR_ILLEGAL_ADDRESS) {
    char buf[512] = {};
    simcuda_sticky_error(0, buf, sizeof buf);
    why += std::string(" (") + buf + ")";
    device_fault_ = true;
  }
  return fail(why);
}

bool Engine::init() {
  if (!cu(retain_primary_context_for_process(device_), "cuInit/primary context")) return false;
  shim_ = dlopen(o_.shim.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!shim_) return fail(std::string("cannot load the shim: ") + dlerror());
  malloc_ = reinterpret_cast<MallocFn>(dlsym(shim_, "spillway_malloc"));
  free_ = reinterpret_cast<FreeFn>(dlsym(shim_, "spillway_free"));
  mark_step_ = reinterpret_cast<MarkStepFn>(dlsym(shim_, "spillway_mark_step"));
  stats_json_ = reinterpret_cast<StatsFn>(dlsym(shim_, "spillway_stats_json"));
  if (!malloc_ || !free_ || !mark_step_ || !stats_json_) {
    return fail(o_.shim + " lacks the spillway C ABI");
  }
  d2h_ = Stream(CU_STREAM_NON_BLOCKING);
  h2d_ = Stream(CU_STREAM_NON_BLOCKING);
  if (!d2h_ || !h2d_) return fail("cannot create the replayer's copy streams");
  static const size_t one[] = {8};
  simcuda_kernel_desc d{};
  d.name = "replay_corrupt_one_byte";
  d.fn = corrupt_kernel;
  d.param_sizes = one;
  d.num_params = 1;
  d.duration_ns = 1;
  if (!cu(simcuda_register_function(&d, &corrupt_fn_), "simcuda_register_function")) return false;
  // The anchors' offload plan, by event index.
  if (o_.strategy == Strategy::kSaveOnCpu || o_.strategy == Strategy::kTorchtune ||
      o_.strategy == Strategy::kLayerwise) {
    plan_anchor();
  }
  return true;
}

void Engine::plan_anchor() {
  const int offload_layers =
      o_.offload_layers >= 0 ? o_.offload_layers : std::max(0, a_.layers - 1);
  for (const Analysis::Saved& s : a_.saved) {
    if (o_.strategy == Strategy::kTorchtune && s.size < 1024) continue;  // min_offload_size
    if (o_.strategy == Strategy::kLayerwise) {
      if (s.layer >= offload_layers) continue;
      const auto& ends = a_.layer_end[static_cast<size_t>(a_.step[s.last_fwd])];
      if (ends.empty()) continue;  // a step whose forward launches nothing
      offload_after_[ends[static_cast<size_t>(s.layer)]].push_back(s.alloc);
    } else {
      offload_after_[s.last_fwd].push_back(s.alloc);
    }
    plan_[s.alloc] = s;
  }
  if (o_.strategy != Strategy::kLayerwise) return;
  // One layer ahead: when the backward of layer j+1 first uses one of its
  // saved tensors, layer j's offloaded tensors start coming back.
  std::map<std::pair<int64_t, int>, size_t> first_use;  // (step, layer) -> event
  for (const Analysis::Saved& s : a_.saved) {
    auto key = std::pair{a_.step[s.last_fwd], s.layer};
    auto it = first_use.find(key);
    if (it == first_use.end() || s.first_bwd < it->second) first_use[key] = s.first_bwd;
  }
  for (const auto& [alloc, s] : plan_) {
    auto next = first_use.find({a_.step[s.last_fwd], s.layer + 1});
    if (next != first_use.end() && next->second < s.first_bwd) {
      prefetch_before_[next->second].push_back(alloc);
    }
  }
}

CUstream Engine::stream(uint64_t id) {
  if (id == 0) return nullptr;  // the legacy default stream, as PyTorch's default
  auto it = streams_.find(id);
  if (it == streams_.end()) {
    it = streams_.emplace(id, Stream(CU_STREAM_NON_BLOCKING)).first;
  }
  return it->second.get();
}

// The trace names no events: a use on another stream than the allocation's
// last user waits for that stream, so data dependencies survive the replay.
bool Engine::order(Live& l, uint64_t s) {
  if (l.last_stream == s) return true;
  Event& e = stream_events_[l.last_stream];
  if (!e) e = Event(CU_EVENT_DISABLE_TIMING);
  if (!cu(cuEventRecord(e.get(), stream(l.last_stream)), "cuEventRecord") ||
      !cu(cuStreamWaitEvent(stream(s), e.get(), 0), "cuStreamWaitEvent")) {
    return false;
  }
  l.last_stream = s;
  return true;
}

void Engine::sample_memory() {
  if (o_.trace_out.empty()) return;
  simcuda_memory_stats ms;
  simcuda_get_memory_stats(device_, &ms);
  timeline_.push_back({simcuda_now_ns(), ms.device_used, ms.host_used});
}

bool Engine::do_alloc(const AllocRec& r) {
  void* p = malloc_(r.size, device_, stream(r.stream));
  if (!p) {
    oom_ = true;
    char buf[160];
    std::snprintf(buf, sizeof buf, "allocation %" PRIu64 " of %" PRIu64 " bytes returned NULL",
                  r.alloc, r.size);
    oom_what_ = buf;
    return false;
  }
  Live l;
  l.ptr = static_cast<unsigned char*>(p);
  l.size = r.size;
  l.stream = r.stream;
  l.last_stream = r.stream;
  live_[r.alloc] = std::move(l);
  sample_memory();
  return true;
}

bool Engine::do_free(const FreeRec& r) {
  auto it = live_.find(r.alloc);
  Live& l = it->second;
  if (l.ptr) {
    if (!order(l, r.stream)) return false;
    free_(l.ptr, l.size, device_, stream(r.stream));
  }
  if (l.host) host_hold_.push_back(std::move(l.host));
  live_.erase(it);
  sample_memory();
  return true;
}

// ---- Anchors: offload and reload -------------------------------------------

bool Engine::offload(uint64_t id) {
  Live& l = live_.at(id);
  if (!l.ptr || l.host) return true;
  auto host = std::make_unique<PinnedBuffer>(l.size);
  if (!*host) return fail("cuMemHostAlloc failed for an offloaded tensor");
  CUstream s = stream(l.last_stream);
  if (o_.strategy == Strategy::kSaveOnCpu) {
    // save_on_cpu(pin_memory=True): packed.copy_(tensor), a blocking copy,
    // then the GPU tensor is released.
    if (!cu(cuMemcpyDtoHAsync(host->get(), reinterpret_cast<CUdeviceptr>(l.ptr), l.size, s),
            "cuMemcpyDtoHAsync") ||
        !cu(cuStreamSynchronize(s), "cuStreamSynchronize")) {
      return false;
    }
    free_(l.ptr, l.size, device_, s);
    l.ptr = nullptr;
  } else {
    // torchtune / TransformerEngine: the copy runs on a side stream after
    // the compute stream's work so far; the GPU memory goes back later,
    // once the compute stream has waited for the copy (release_pending).
    Event before(CU_EVENT_DISABLE_TIMING), after(CU_EVENT_DISABLE_TIMING);
    if (!cu(cuEventRecord(before.get(), s), "cuEventRecord") ||
        !cu(cuStreamWaitEvent(d2h_.get(), before.get(), 0), "cuStreamWaitEvent") ||
        !cu(cuMemcpyDtoHAsync(host->get(), reinterpret_cast<CUdeviceptr>(l.ptr), l.size,
                              d2h_.get()),
            "cuMemcpyDtoHAsync") ||
        !cu(cuEventRecord(after.get(), d2h_.get()), "cuEventRecord")) {
      return false;
    }
    pending_.push_back({id, std::move(after)});
  }
  offload_bytes_ += l.size;
  l.host = std::move(host);
  l.reloaded = false;
  return true;
}

bool Engine::release_pending() {
  for (Pending& p : pending_) {
    Live& l = live_.at(p.alloc);
    CUstream s = stream(l.last_stream);
    if (!cu(cuStreamWaitEvent(s, p.done.get(), 0), "cuStreamWaitEvent")) return false;
    free_(l.ptr, l.size, device_, s);
    l.ptr = nullptr;
  }
  pending_.clear();
  sample_memory();
  return true;
}

bool Engine::reload(uint64_t id, uint64_t use_stream) {
  Live& l = live_.at(id);
  if (!l.host || l.reloaded) return true;
  if (l.ptr) {
    // Offloaded but not yet released (its copy may still run): keep it.
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->alloc == id) {
        if (!cu(cuStreamWaitEvent(stream(l.last_stream), it->done.get(), 0), "cuStreamWaitEvent")) {
          return false;
        }
        pending_.erase(it);
        break;
      }
    }
    host_hold_.push_back(std::move(l.host));
    l.reloaded = true;
    return true;
  }
  CUstream s = stream(use_stream);
  void* p = malloc_(l.size, device_, s);
  if (!p) {
    oom_ = true;
    oom_what_ = "reloading an offloaded tensor of " + std::to_string(l.size) + " bytes";
    return false;
  }
  l.ptr = static_cast<unsigned char*>(p);
  l.last_stream = use_stream;
  if (o_.strategy == Strategy::kSaveOnCpu) {
    // unpack: packed.to(device, non_blocking=True) on the current stream.
    if (!cu(cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(l.ptr), l.host->get(), l.size, s),
            "cuMemcpyHtoDAsync")) {
      return false;
    }
  } else {
    Event before(CU_EVENT_DISABLE_TIMING), after(CU_EVENT_DISABLE_TIMING);
    if (!cu(cuEventRecord(before.get(), s), "cuEventRecord") ||
        !cu(cuStreamWaitEvent(h2d_.get(), before.get(), 0), "cuStreamWaitEvent") ||
        !cu(cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(l.ptr), l.host->get(), l.size,
                              h2d_.get()),
            "cuMemcpyHtoDAsync") ||
        !cu(cuEventRecord(after.get(), h2d_.get()), "cuEventRecord")) {
      return false;
    }
    l.ready = std::move(after);
  }
  reload_bytes_ += l.size;
  host_hold_.push_back(std::move(l.host));
  l.reloaded = true;
  sample_memory();
  return true;
}

// Before an event uses `id` on stream `s`: anchors bring it back if needed.
bool Engine::ensure(uint64_t id, uint64_t s) {
  Live& l = live_.at(id);
  if (l.host && !l.reloaded && !reload(id, s)) return false;
  if (l.ready) {
    if (!cu(cuStreamWaitEvent(stream(s), l.ready.get(), 0), "cuStreamWaitEvent")) return false;
    l.ready = Event();
  }
  return order(l, s);
}

// ---- Launches and copies ----------------------------------------------------

CUfunction Engine::kernel(uint64_t name, size_t n) {
  auto key = std::pair{name, n};
  auto it = kernels_.find(key);
  if (it != kernels_.end()) return it->second;
  auto& sizes = param_sizes_[n];
  sizes.assign(2 + n, 8);
  const auto named = a_.names.find(name);
  kernel_names_.push_back(named != a_.names.end() && !named->second.empty() ? named->second
                                                                            : "replay_kernel");
  simcuda_kernel_desc d{};
  d.name = kernel_names_.back().c_str();
  d.fn = replay_kernel;
  d.param_sizes = sizes.data();
  d.num_params = sizes.size();
  d.duration_fn = replay_duration;
  CUfunction f = nullptr;
  if (!cu(simcuda_register_function(&d, &f), "simcuda_register_function")) return nullptr;
  kernels_.emplace(key, f);
  return f;
}

bool Engine::launch(uint64_t stream_id, uint64_t name, uint64_t duration_ns,
                    const std::vector<TouchRec>& touches) {
  for (const TouchRec& t : touches) {
    if (!ensure(t.alloc, stream_id)) return false;
  }
  CUfunction f = kernel(name, touches.size());
  if (!f) return false;
  std::vector<uint64_t> params(2 + touches.size());
  KernelWork* w = nullptr;
  if (!o_.no_data) {
    w = kernel_work_.emplace_back(std::make_unique<KernelWork>()).get();
    w->launch = launches_;
    w->salt = key(0);
    w->integrity = &integrity_;
    w->parts.reserve(touches.size());
  }
  for (size_t i = 0; i < touches.size(); ++i) {
    const TouchRec& t = touches[i];
    Live& l = live_.at(t.alloc);
    params[2 + i] = reinterpret_cast<uint64_t>(l.ptr + (t.length ? t.offset : 0));
    if (!w) continue;
    KernelWork::Part part;
    part.alloc = t.alloc;
    part.offset = t.length ? t.offset : 0;
    part.length = t.length;
    if (t.mode != kModeWrite) part.checks = l.defined.intersect(t.offset, t.offset + t.length);
    part.write = t.mode != kModeRead;
    if (part.write) l.defined.add(t.offset, t.offset + t.length);
    w->parts.push_back(std::move(part));
  }
  params[0] = reinterpret_cast<uint64_t>(w);
  params[1] = duration_ns;
  std::vector<void*> args(params.size());
  for (size_t i = 0; i < params.size(); ++i) args[i] = &params[i];
  if (!cu(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream(stream_id), args.data(), nullptr),
          "cuLaunchKernel")) {
    if (w) kernel_work_.pop_back();
    return false;
  }
  if (static_cast<int64_t>(launches_) == o_.inject_corruption) {
    // Test seam: flip one byte the launch just wrote, behind the pattern's back.
    for (const TouchRec& t : touches) {
      if (t.mode == kModeRead || t.length == 0) continue;
      uint64_t at = reinterpret_cast<uint64_t>(live_.at(t.alloc).ptr + t.offset);
      void* arg[] = {&at};
      if (!cu(cuLaunchKernel(corrupt_fn_, 1, 1, 1, 1, 1, 1, 0, stream(stream_id), arg, nullptr),
              "cuLaunchKernel")) {
        return false;
      }
      std::fprintf(stderr,
                   "spillway-replay: corrupted byte %" PRIu64 " of allocation %" PRIu64
                   " after launch %" PRIu64 " (--inject-corruption)\n",
                   t.offset, t.alloc, launches_);
      break;
    }
  }
  ++launches_;
  return true;
}

bool Engine::copy(const CopyRec& c) {
  const uint64_t dev_refs = (c.dst.alloc != 0) + (c.src.alloc != 0);
  if (dev_refs == 0 || c.bytes == 0) return true;  // host to host: nothing on the device
  const bool both = c.dst.alloc && c.src.alloc;
  if (both || c.kind == CopyKind::kMemset || c.kind == CopyKind::kDeviceToDevice) {
    // On the compute engine, as the sim runs device copies and sets: one
    // kernel that reads the source and writes the destination.
    std::vector<TouchRec> t;
    if (c.src.alloc) t.push_back({c.src.alloc, c.src.offset, c.bytes, kModeRead});
    if (c.dst.alloc) t.push_back({c.dst.alloc, c.dst.offset, c.bytes, kModeWrite});
    uint64_t d = c.duration_ns;
    if (d == 0) {
      const double hbm = 3000.0;  // bytes per ns (SIMCUDA_HBM_GBPS default)
      d = static_cast<uint64_t>(static_cast<double>(c.bytes) *
                                (c.kind == CopyKind::kMemset ? 1 : 2) / hbm) +
          1;
    }
    const uint64_t saved = launches_;
    bool ok = launch(c.stream, 0, d, t);
    launches_ = saved;  // not a LAUNCH of the trace
    return ok;
  }
  if (staging_.size() < c.bytes) staging_.resize(c.bytes);
  if (c.dst.alloc) {  // host to device (pageable: synchronous)
    if (!ensure(c.dst.alloc, c.stream)) return false;
    Live& l = live_.at(c.dst.alloc);
    if (!o_.no_data) pattern_fill(staging_.data(), key(c.dst.alloc), c.dst.offset, c.bytes);
    if (!cu(cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(l.ptr + c.dst.offset), staging_.data(),
                              c.bytes, stream(c.stream)),
            "cuMemcpyHtoDAsync")) {
      return false;
    }
    if (!o_.no_data) l.defined.add(c.dst.offset, c.dst.offset + c.bytes);
    trace_h2d_ += c.bytes;
    return true;
  }
  if (!ensure(c.src.alloc, c.stream)) return false;  // device to host
  Live& l = live_.at(c.src.alloc);
  if (!cu(cuMemcpyDtoHAsync(staging_.data(), reinterpret_cast<CUdeviceptr>(l.ptr + c.src.offset),
                            c.bytes, stream(c.stream)),
          "cuMemcpyDtoHAsync") ||
      !cu(cuStreamSynchronize(stream(c.stream)), "cuStreamSynchronize")) {
    return false;
  }
  trace_d2h_ += c.bytes;
  if (!o_.no_data) {
    for (const auto& [b, e] : l.defined.intersect(c.src.offset, c.src.offset + c.bytes)) {
      const uint64_t bad =
          pattern_check(staging_.data() + (b - c.src.offset), key(c.src.alloc), b, e - b);
      integrity_.bytes_checked += e - b;
      if (bad != UINT64_MAX) {
        integrity_.report(c.src.alloc, bad, pattern_byte(key(c.src.alloc), bad),
                          staging_[bad - c.src.offset], launches_);
        break;
      }
    }
  }
  return true;
}

// ---- Steps -------------------------------------------------------------------

bool Engine::end_step() {
  if (step_ < 0) return true;
  if (!sync_step()) return false;
  host_hold_.clear();    // pinned buffers whose copies are now done
  kernel_work_.clear();  // and kernels
  const uint64_t now = simcuda_now_ns();
  const uint64_t t = now - step_start_ns_;
  step_times_.push_back(t);
  step_spans_.push_back({step_start_ns_, now});
  const auto moved = strategy_bytes();
  step_bytes_.push_back({moved.first - counted_.first, moved.second - counted_.second});
  counted_ = moved;
  ++steps_completed_;
  if (!o_.quiet && device_ == 0) {
    simcuda_memory_stats ms;
    simcuda_get_memory_stats(device_, &ms);
    std::fprintf(stderr,
                 "spillway-replay: step %" PRId64 " done (%" PRIu64 "/%" PRIu64
                 "): %.3f ms simulated, device peak %.1f MiB, moved %.1f / %.1f MiB\n",
                 step_, steps_completed_, total_steps_, static_cast<double>(t) / 1e6,
                 static_cast<double>(ms.device_peak) / (1 << 20),
                 static_cast<double>(step_bytes_.back().first) / (1 << 20),
                 static_cast<double>(step_bytes_.back().second) / (1 << 20));
  }
  return true;
}

std::pair<uint64_t, uint64_t> Engine::strategy_bytes() const {
  simcuda_memory_stats ms;
  simcuda_get_memory_stats(device_, &ms);
  return {ms.bytes_d2h - trace_d2h_, ms.bytes_h2d - trace_h2d_};
}

bool Engine::sync_step() {
  if (o_.step_sync_context) return cu(cuCtxSynchronize(), "cuCtxSynchronize");
  // The record's streams, the legacy one among them, then the replayer's own
  // copy streams (an anchor strategy's copies, whose pinned buffers the
  // step's end lets go): not spillway's, whose copies may run on into the
  // next step as in a job that reads its loss and goes on. A training loop
  // synchronizes no more: loss.item() copies on the current stream and waits
  // for that stream alone (PyTorch's _local_scalar_dense_cuda,
  // at::cuda::memcpy_and_sync).
  if (!cu(cuStreamSynchronize(nullptr), "cuStreamSynchronize")) return false;
  for (auto& [id, s] : streams_)
    if (!cu(cuStreamSynchronize(s.get()), "cuStreamSynchronize")) return false;
  return cu(cuStreamSynchronize(d2h_.get()), "cuStreamSynchronize") &&
         cu(cuStreamSynchronize(h2d_.get()), "cuStreamSynchronize");
}

// A step's end: the devices' engines meet, device 0's marks the step (the
// shim's mark is the process's, for every device, as a job's one call), and
// none starts the next step before the mark. An engine that stops early
// (an OOM, an error, --steps) leaves the barrier, so the others never wait
// for it.
void Engine::meet_at_step() {
  if (!steps_) {
    mark_step_();
    return;
  }
  steps_->arrive_and_wait();
  if (device_ == 0) mark_step_();
  steps_->arrive_and_wait();
}

void Engine::leave_steps() {
  if (steps_ && !left_steps_) {
    left_steps_ = true;
    steps_->arrive_and_drop();
  }
}

bool Engine::run() {
  const auto& ev = a_.events;
  total_steps_ = a_.steps;
  if (o_.steps >= 0)
    total_steps_ = std::min<uint64_t>(total_steps_, static_cast<uint64_t>(o_.steps));
  const bool anchor = !plan_.empty() || o_.strategy == Strategy::kSaveOnCpu ||
                      o_.strategy == Strategy::kTorchtune || o_.strategy == Strategy::kLayerwise;
  uint8_t phase = 0;
  for (size_t i = 0; i < ev.size(); ++i) {
    const spillway::trace::Event& e = ev[i];
    if (const auto* st = std::get_if<StepRec>(&e)) {
      (void)st;
      if (!end_step()) return false;
      if (o_.steps >= 0 && static_cast<int64_t>(steps_completed_) >= o_.steps) {
        truncated_ = true;
        break;
      }
      // A job marks after each optimizer step() (docs/python.md), so not
      // before its first step: everything up to the first mark, the set-up
      // included, is one step to spillway.
      if (step_++ >= 0) meet_at_step();
      step_start_ns_ = simcuda_now_ns();
      phase = 0;
      continue;
    }
    if (anchor) {
      if (auto it = prefetch_before_.find(i); it != prefetch_before_.end()) {
        const uint64_t s = 0;
        for (uint64_t id : it->second) {
          if (live_.count(id) && !reload(id, s)) return oom_ ? finish_oom() : false;
        }
      }
    }
    bool ok = true;
    if (const auto* al = std::get_if<AllocRec>(&e)) {
      ok = do_alloc(*al);
    } else if (const auto* f = std::get_if<FreeRec>(&e)) {
      ok = do_free(*f);
    } else if (const auto* l = std::get_if<LaunchRec>(&e)) {
      ok = launch(l->stream, l->name, l->duration_ns, l->touches);
    } else if (const auto* c = std::get_if<CopyRec>(&e)) {
      ok = copy(*c);
    } else if (const auto* p = std::get_if<PhaseRec>(&e)) {
      const auto np = static_cast<uint8_t>(p->phase);
      if (anchor && phase == 1 && np != 1) ok = release_pending();
      phase = np;
    }
    if (!ok) return oom_ ? finish_oom() : false;
    if (anchor) {
      if (auto it = offload_after_.find(i); it != offload_after_.end()) {
        // torchtune frees the previous tensors at the next pack; TE frees
        // the previous layer's at the next layer's commit.
        if (o_.strategy != Strategy::kSaveOnCpu && !release_pending()) return false;
        for (uint64_t id : it->second) {
          if (live_.count(id) && !offload(id)) return oom_ ? finish_oom() : false;
        }
      }
    }
  }
  if (!truncated_ && !end_step()) return false;
  if (step_ >= 0) meet_at_step();  // the last step()'s mark
  return true;
}

bool Engine::finish_oom() {
  cuCtxSynchronize();
  return true;
}

uint64_t Engine::median_step_ns() const {
  if (step_times_.empty()) return 0;
  std::vector<uint64_t> t = step_times_;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string Engine::shim_stats() {
  if (!stats_json_) return {};  // init failed before the shim was loaded
  // The mover may still change the counters between the two calls: the
  // second says how long the text was, and a longer one is asked for again
  // (a shorter one left NULs in the JSON, which the fault matrix found).
  std::string s;
  for (size_t n = stats_json_(nullptr, 0);;) {
    s.assign(n + 1, '\0');
    const size_t written = stats_json_(s.data(), s.size());
    if (written <= n) {
      s.resize(written);
      return s;
    }
    n = written;
  }
}

}  // namespace replay
