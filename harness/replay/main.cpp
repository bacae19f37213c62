// spillway-replay RECORD [options]: see --help and harness/README.md.
// Exit codes: 0 the replay ran to its end (an OOM is a result: "oom": true),
// 1 integrity failure or the replay itself failed, 2 bad arguments or trace.
#include <simcuda.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "chrome_events.h"
#include "output_file.h"
#include "engine.h"
#include "ideal.h"
#include "replay.h"
#include "spillway_version.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace replay;

constexpr const char* kUsage =
    "usage: spillway-replay RECORD [--budget SIZE|PCT%] [options]; --help describes each\n";

[[noreturn]] void bad_usage(const std::string& why) {
  std::fprintf(stderr, "spillway-replay: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

// The first of `relatives` (to this executable's directory: the build tree's
// layout, then the installed one, cmake/install.cmake) that exists, else
// `fallback` (this build tree's absolute path).
std::string default_path(std::initializer_list<const char*> relatives, const char* fallback) {
  const std::string exe = self_exe();
  if (!exe.empty()) {
    for (const char* relative : relatives) {
      const fs::path p = fs::path(exe).parent_path() / relative;
      if (fs::exists(p)) return p.lexically_normal().string();
    }
  }
  return fallback;
}

Options options_or_exit(int argc, char** argv) {
  Args r = replay::parse_args(argc, argv);
  switch (r.action) {
    case Args::Action::kHelp:
      std::fputs(r.help.c_str(), stdout);
      std::exit(0);
    case Args::Action::kVersion:
      std::printf("spillway-replay %s\n", spillway::kVersion);
      std::exit(0);
    case Args::Action::kBad:
      bad_usage(r.error);
    case Args::Action::kRun:
      break;
  }
  Options& o = r.options;
  if (o.shim.empty())
    o.shim = default_path({"../lib/libspillway.so", REPLAY_INSTALLED_SHIM}, REPLAY_DEFAULT_SHIM);
  return o;
}

std::string read_text(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The driver entry points spillway calls on its own behalf (shim/src),
// reported in the JSON with their call counts (base names: every version).
constexpr const char* kCountedCalls[] = {
    "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
    "cuMemAddressReserve", "cuMemAddressFree", "cuMemcpyDtoDAsync", "cuEventCreate",
    "cuEventRecord", "cuEventSynchronize", "cuEventQuery", "cuStreamCreate",
    "cuStreamCreateWithPriority", "cuStreamWaitEvent", "cuStreamQuery",
    "cuMemGetAllocationGranularity", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
    "cuDeviceTotalMem", "cuMemGetInfo",
    // SPILLWAY_MODE=managed
    "cuMemAllocManaged", "cuMemFree", "cuMemPrefetchAsync"};

struct Baseline {
  uint64_t peak = 0;
  uint64_t median_step_ns = 0;
  std::vector<uint64_t> step_ns;
};

// Strategy none with memory to spare, accounting mode, in a child process
// (a process holds one simulated GPU and one shim).
bool run_baseline(const Options& o, const Analysis& a, Baseline& b) {
  const std::string exe = self_exe();
  const uint64_t big = std::max<uint64_t>(80ull << 30, 2 * a.peak_live_bytes + (16ull << 30));
  char tmpl[] = "/tmp/spillway-replay-baseline-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return false;
  close(fd);
  std::vector<std::string> args = {exe,
                                   o.trace,
                                   "--strategy",
                                   "none",
                                   "--device-memory",
                                   std::to_string(big),
                                   "--no-data",
                                   "--json",
                                   tmpl,
                                   "--baseline-child",
                                   "--quiet",
                                   "--shim",
                                   o.shim};
  if (o.steps >= 0) {
    args.push_back("--steps");
    args.push_back(std::to_string(o.steps));
  }
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  // Injected faults (SIMCUDA_FAIL) are for the run under test: the baseline
  // is its yardstick and runs without them.
  std::vector<char*> envp;
  for (char** v = environ; *v; ++v)
    if (std::strncmp(*v, "SIMCUDA_FAIL=", 13) != 0) envp.push_back(*v);
  envp.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return false;
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string json = read_text(tmpl);
  std::remove(tmpl);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || json.empty()) return false;
  if (json.find("\"oom\": true") != std::string::npos) return false;
  b.peak = json_u64(json, "peak_device_bytes");
  b.median_step_ns = json_u64(json, "sim_step_time_ns");
  b.step_ns = json_array(json, "step_times_ns");
  return true;
}

// What one device's replay ended with (--devices: the engines of devices
// 1..N-1 run on their own threads, and are made and destroyed there, in
// their device's context).
struct DeviceRun {
  int device = 0;
  bool ran = false;
  std::string error;
  bool oom = false;
  std::string oom_what;
  bool integrity_ok = true;
  std::string first_mismatch;
  uint64_t bytes_checked = 0;
  uint64_t steps_completed = 0;
  uint64_t peak = 0;
};

void finish_device(Engine& e, bool ran, bool no_data, DeviceRun& r) {
  cuCtxSynchronize();
  r.ran = ran;
  r.error = e.error();
  r.oom = e.oom();
  r.oom_what = e.oom_what();
  r.integrity_ok = no_data || (e.integrity().ok() && !e.device_fault());
  r.first_mismatch = e.integrity().first_mismatch();
  if (r.first_mismatch.empty() && !r.integrity_ok)
    r.first_mismatch = (r.device ? "device " + std::to_string(r.device) + ": " : "") + e.error();
  r.bytes_checked = e.integrity().bytes_checked.load();
  r.steps_completed = e.steps_completed();
  simcuda_memory_stats ms;
  simcuda_get_memory_stats(r.device, &ms);
  r.peak = ms.device_peak;
}

void run_device(const Options& o, const Analysis& a, int device, Engine::StepBarrier* steps,
                DeviceRun& r) {
  r.device = device;
  Engine e(o, a, device, steps);
  const bool ran = e.init() && e.run();
  e.leave_steps();
  finish_device(e, ran, o.no_data, r);
}

double env_gbps(const char* name, double dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtod(v, nullptr) : dflt;
}

uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : dflt;
}

// Two bounds per step of the record, neither below the step's measured
// baseline (moving memory cannot make a step faster than the same step with
// no memory limit; a formula built from kernel durations alone ignores the
// host's launch costs and fell below it).
//
// `lower`, design.md section 9: max(compute, out / BW_d2h) for the forward
// plus max(compute, in / BW_h2d) for the backward plus the rest of the
// step's compute, where out = in = the bytes the budget forces off the GPU:
// the step's peak of live requested bytes minus the budget (requested
// sizes, before any rounding, so this stays a bound). Without phase markers:
// max(compute, out / BW_d2h + in / BW_h2d).
//
// `cyclic`, for the step repeated forever (the steady state the cyclic ideal
// plans): the bytes live and read again at the step's peak, less the budget,
// are off the device then; in a cycle each comes in for its read and goes
// out again, so each link carries them once a step: max(E / BW_d2h,
// E / BW_h2d). Copies may overlap compute and each other, so nothing adds.
// It holds for a plan that moves bytes for this step in the step before,
// where `lower` does not; for a step that is not repeated (a record's first
// or last) it is no bound: bytes may leave earlier and never come back.
struct StepBounds {
  std::vector<uint64_t> lower, cyclic;
};

StepBounds step_bounds(const Analysis& a, uint64_t steps, uint64_t budget, const Baseline& base) {
  const double d2h = env_gbps("SIMCUDA_D2H_GBPS", 55), h2d = env_gbps("SIMCUDA_H2D_GBPS", 55);
  auto over = [budget](uint64_t need) {
    return need > budget ? static_cast<double>(need - budget) : 0.0;
  };
  StepBounds r;
  for (uint64_t s = 0; s < steps && s < a.compute_ns.size(); ++s) {
    const double forced = over(a.step_peak_live[s]);
    const double out = forced / d2h, in = forced / h2d;
    const auto& c = a.compute_ns[s];
    double t;
    if (a.has_phases) {
      t = std::max(static_cast<double>(c[1]), out) + std::max(static_cast<double>(c[2]), in) +
          static_cast<double>(c[0] + c[3]);
    } else {
      t = std::max(static_cast<double>(c[0] + c[1] + c[2] + c[3]), out + in);
    }
    const double needed = over(a.step_peak_needed[s]);
    const double link = std::max(needed / d2h, needed / h2d);
    const uint64_t b = s < base.step_ns.size() ? base.step_ns[s] : base.median_step_ns;
    r.lower.push_back(std::max(static_cast<uint64_t>(t), b));
    r.cyclic.push_back(std::max(static_cast<uint64_t>(link), b));
  }
  return r;
}

uint64_t median_of(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The replay's steps and memory on the replay thread's simulated clock, in
// the shim's trace format (base/chrome_events.h): Perfetto and
// chrome://tracing open both alike. Closes `fd`; the errno of a failed
// write, else 0.
int write_chrome_trace(int fd, Engine& e, const Options& o) {
  spillway::ChromeEventWriter w(fd, 256 * 1024);
  w.event(
      "{\"name\":\"spillway-replay trace start\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":0,"
      "\"ts\":0.000,\"args\":{\"spillway_version\":\"%s\",\"schema\":%d,\"clock\":\"simulated "
      "(sim virtual host "
      "time)\",\"simulated_time\":true,\"simulated_gpu\":true,\"strategy\":\"%s\"}}",
      spillway::kVersion, spillway::kJsonSchema, name_of(o.strategy));
  w.process_name(1, "spillway-replay (simulated time)");
  const auto& spans = e.step_spans();
  for (size_t i = 0; i < spans.size(); ++i) {
    w.event("{\"name\":\"step %zu\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%s,\"dur\":%s}", i,
            spillway::ChromeEventWriter::micros(spans[i].first).c_str(),
            spillway::ChromeEventWriter::micros(spans[i].second - spans[i].first).c_str());
  }
  for (const MemorySample& m : e.timeline()) {
    w.event(
        "{\"name\":\"memory\",\"ph\":\"C\",\"pid\":1,\"ts\":%s,\"args\":{\"device_bytes\":%" PRIu64
        ",\"host_bytes\":%" PRIu64 "}}",
        spillway::ChromeEventWriter::micros(m.t_ns).c_str(), m.device_used, m.host_used);
  }
  return w.close() ? 0 : w.error();
}

}  // namespace

// An output file (--json, --trace-out), opened before the replay, so that a
// path that cannot be written stops the command at once, named
// (base/output_file.h), not after a replay whose result is lost.
int open_output_or_exit(const std::string& path, const char* option) {
  std::string why;
  const int fd = spillway::open_output(path, &why);
  if (fd < 0) {
    std::fprintf(stderr, "spillway-replay: cannot write %s '%s': %s\n", option, path.c_str(),
                 why.c_str());
    std::exit(2);
  }
  return fd;
}

// Writes and closes; false (and says so) on a failed write.
bool write_and_close(int fd, const std::string& text, const std::string& path) {
  if (!spillway::write_all(fd, text.data(), text.size())) {
    std::fprintf(stderr, "spillway-replay: writing '%s' failed: %s\n", path.c_str(),
                 std::strerror(errno));
    ::close(fd);
    return false;
  }
  return ::close(fd) == 0;
}

int main(int argc, char** argv) {
  Options o = options_or_exit(argc, argv);
  const int json_fd = o.json_out.empty() ? -1 : open_output_or_exit(o.json_out, "--json");
  const int trace_fd = o.trace_out.empty() ? -1 : open_output_or_exit(o.trace_out, "--trace-out");
  Analysis a;
  std::string why;
  if (!analyze(o.trace, o.layers, a, why)) {
    std::fprintf(stderr, "spillway-replay: %s: %s\n", o.trace.c_str(), why.c_str());
    return 2;
  }

  // The unconstrained run: peak and step times without any memory limit.
  Baseline base;
  if (!o.baseline_child) {
    if (!o.quiet)
      std::fprintf(stderr, "spillway-replay: baseline run (strategy none, no memory limit)\n");
    if (!run_baseline(o, a, base)) {
      std::fprintf(stderr,
                   "spillway-replay: the baseline run (strategy none, no memory limit) "
                   "failed\n");
      return 1;
    }
  }

  uint64_t budget = 0;
  if (!o.budget.empty()) {
    std::string bad;
    const auto b = parse_budget(o.budget, base.peak, &bad);
    if (!b) bad_usage(bad);
    budget = *b;
  }

  // Configure the sim and the shim before anything starts them.
  if (o.device_memory) setenv("SIMCUDA_DEVICE_MEMORY", std::to_string(o.device_memory).c_str(), 1);
  if (o.no_data) {
    setenv("SIMCUDA_DATA", "0", 1);  // nor do the evictions move bytes
    // Host memory is simulated too, so the shim's default (half of this
    // machine's RAM) does not apply: one GPU's share of a DGX H100's 2 TB.
    setenv("SPILLWAY_HOST_BUDGET", "256GiB", 0);
  }
  const bool spillway = o.strategy == Strategy::kSpillway && o.mode != "off";
  const std::string mode = spillway ? o.mode : "off";
  setenv("SPILLWAY_MODE", mode.c_str(), 1);
  if (spillway && budget) setenv("SPILLWAY_GPU_BUDGET", std::to_string(budget).c_str(), 1);
  const std::string cupti = default_path({"../sim/libcupti.so.13", REPLAY_INSTALLED_CUPTI},
                                         REPLAY_SIM_DIR "/libcupti.so.13");
  setenv("SPILLWAY_CUPTI_PATH", cupti.c_str(), 0);

  if (o.devices > 1) {
    // Enough simulated devices, unless the environment already has more.
    const char* have = std::getenv("SIMCUDA_DEVICE_COUNT");
    if (!have || std::atoi(have) < o.devices)
      setenv("SIMCUDA_DEVICE_COUNT", std::to_string(o.devices).c_str(), 1);
  }
  std::optional<Engine::StepBarrier> step_barrier;
  if (o.devices > 1) step_barrier.emplace(o.devices);
  Engine::StepBarrier* steps_met = step_barrier ? &*step_barrier : nullptr;
  std::vector<DeviceRun> others(static_cast<size_t>(o.devices - 1));
  std::vector<std::thread> threads;
  for (int d = 1; d < o.devices; ++d)
    threads.emplace_back(run_device, std::cref(o), std::cref(a), d, steps_met,
                         std::ref(others[static_cast<size_t>(d - 1)]));
  Engine e(o, a, 0, steps_met);
  const bool ran = e.init() && e.run();
  e.leave_steps();
  for (std::thread& t : threads) t.join();
  if (!ran) {
    std::fprintf(stderr, "spillway-replay: replay failed: %s\n", e.error().c_str());
  }
  DeviceRun first;
  finish_device(e, ran, o.no_data, first);
  // Several devices: the report's flags and counts are all devices' (the
  // integrity of each, an OOM on any, the fewest steps, the highest peak);
  // the times, bytes moved and the ideal are device 0's.
  for (const DeviceRun& r : others) {
    if (!r.ran && !r.oom)
      std::fprintf(stderr, "spillway-replay: replay on device %d failed: %s\n", r.device,
                   r.error.c_str());
  }
  std::vector<const DeviceRun*> runs{&first};
  for (const DeviceRun& r : others) runs.push_back(&r);
  const DeviceRun *oom_run = nullptr, *failed_run = nullptr, *bad_run = nullptr;
  uint64_t bytes_checked = 0, steps = first.steps_completed, peak = 0;
  for (const DeviceRun* r : runs) {
    if (r->oom && !oom_run) oom_run = r;
    if (!r->ran && !r->oom && !failed_run) failed_run = r;
    if (!r->integrity_ok && !bad_run) bad_run = r;
    bytes_checked += r->bytes_checked;
    steps = std::min(steps, r->steps_completed);
    peak = std::max(peak, r->peak);
  }
  auto named = [](const DeviceRun* r, const std::string& what) {
    return r->device ? "device " + std::to_string(r->device) + ": " + what : what;
  };

  simcuda_memory_stats ms;
  simcuda_get_memory_stats(0, &ms);
  const std::string stats = e.shim_stats();
  const bool integrity_ok = !o.no_data && !bad_run;
  if (!budget) {
    budget = json_u64(stats, "budget_bytes");
    if (!budget) budget = ms.device_capacity;
  }
  const uint64_t unconstrained = o.baseline_child ? peak : base.peak;
  const uint64_t forced = unconstrained > budget ? unconstrained - budget : 0;
  const auto [d2h, h2d] = e.strategy_bytes();
  const uint64_t median = e.median_step_ns();
  uint64_t stall = 0;
  for (size_t i = 0; i < e.step_times().size(); ++i) {
    const uint64_t b = i < base.step_ns.size() ? base.step_ns[i] : base.median_step_ns;
    if (e.step_times()[i] > b) stall += e.step_times()[i] - b;
  }

  // The ideal (ideal.h): per step, the measured baseline plus the stall the
  // planner predicts for its plan given the step's exact future (its
  // prediction less its own prediction of the step with nothing moved), and
  // the bytes that plan moves.
  std::vector<uint64_t> ideal_ns;
  // The same plans with device memory in handles of exact sizes, their VMM
  // calls charged at the simulator's costs (handle_churn.h): empty when
  // every VMM call is free.
  std::vector<uint64_t> handles_ns;
  spillway::policy::HandleChurn last_churn;
  std::vector<uint64_t> ideal_bytes_by_step;
  uint64_t ideal_move_ns = 0;
  bool ideal_fits = true;
  // The last step planned without foresight (ideal.h).
  struct Fresh {
    uint64_t ns = 0, bytes = 0;
    bool fits = false;
  };
  std::optional<Fresh> fresh_last;
  if (!o.baseline_child && budget) {
    ModelRules rules;
    rules.launch_host_ns = env_u64("SIMCUDA_LAUNCH_NS", rules.launch_host_ns);
    spillway::policy::PlanOptions po;
    po.budget = budget;
    po.d2h_bytes_per_ns = env_gbps("SIMCUDA_D2H_GBPS", 55);
    po.h2d_bytes_per_ns = env_gbps("SIMCUDA_H2D_GBPS", 55);
    po.bidir_bytes_per_ns = env_gbps("SIMCUDA_BIDIR_GBPS", 45);
    po.thorough = true;  // offline: every candidate the planner has
    // And a local search from its best plan (planner.h): 3,000 replays bring
    // the eight-step records' steady ideal 0.3-16% lower (vit_b16 at 60%
    // 21.4 -> 17.9 ms, simulated) for about 0.1-2 s of the replayer's time a
    // step; 10,000 bring a little more (16.9 ms) for three times that.
    po.polish_replays = 3000;
    // A move's swap, as the sim charges it (SIMCUDA_VMM_NS, SIMCUDA_CALL_NS):
    // an unmap, a map and an access grant, one host piece.
    po.move_host_ns = simcuda_call_cost_ns("cuMemUnmap") + simcuda_call_cost_ns("cuMemMap") +
                      simcuda_call_cost_ns("cuMemSetAccess");
    ideal_move_ns = po.move_host_ns;
    spillway::policy::VmmCallCosts calls;
    calls.create_ns = simcuda_call_cost_ns("cuMemCreate");
    calls.map_ns = simcuda_call_cost_ns("cuMemMap");
    calls.grant_ns = simcuda_call_cost_ns("cuMemSetAccess");
    calls.unmap_ns = simcuda_call_cost_ns("cuMemUnmap");
    calls.release_ns = simcuda_call_cost_ns("cuMemRelease");
    for (uint64_t s = 0; s < a.steps; ++s) {
      const bool last = s + 1 == a.steps;
      const Ideal id = ideal(a, s, rules, po, calls, last);
      if (!id.valid) continue;
      const uint64_t b = s < base.step_ns.size() ? base.step_ns[s] : base.median_step_ns;
      // A plan's stall: its step over the same model's with nothing moved.
      auto over = [](const spillway::policy::Plan& p, const spillway::policy::Plan& none) {
        return p.step_ns > none.step_ns ? p.step_ns - none.step_ns : 0;
      };
      if (last)
        fresh_last = Fresh{b + over(id.fresh, id.fresh_unconstrained),
                           id.fresh.bytes_out + id.fresh.bytes_in, id.fresh.fits};
      const uint64_t extra = over(id.plan, id.unconstrained);
      ideal_ns.push_back(b + extra);
      if (calls.any()) {
        handles_ns.push_back(b + over(id.handles, id.unconstrained));
        last_churn = id.churn;
      }
      ideal_bytes_by_step.push_back(id.plan.bytes_out + id.plan.bytes_in);
      ideal_fits = ideal_fits && id.plan.fits;
    }
  }
  const uint64_t ideal_bytes =
      std::accumulate(ideal_bytes_by_step.begin(), ideal_bytes_by_step.end(), uint64_t{0});
  const StepBounds bounds = step_bounds(a, a.steps, budget, base);
  const std::vector<uint64_t>& lower_bounds = bounds.lower;
  const uint64_t lower_bound = median_of(lower_bounds);

  // The report (harness/README.md has its fields), in this order.
  nlohmann::ordered_json j;
  j["version"] = spillway::kVersion;
  j["schema"] = spillway::kJsonSchema;
  j["time_units"] = "simulated nanoseconds (sim virtual clock)";
  j["record"] = o.trace;
  j["strategy"] = name_of(o.strategy);
  j["mode"] = mode;
  j["data_checked"] = !o.no_data;
  j["steps_in_record"] = a.steps;
  j["steps_completed"] = steps;
  j["devices"] = o.devices;
  j["oom"] = oom_run != nullptr;
  if (failed_run) j["replay_error"] = named(failed_run, failed_run->error);
  if (oom_run) j["oom_at"] = named(oom_run, oom_run->oom_what);
  j["integrity_ok"] = o.no_data ? nlohmann::ordered_json() : nlohmann::ordered_json(integrity_ok);
  if (bad_run && !o.no_data) j["first_mismatch"] = bad_run->first_mismatch;
  j["bytes_checked"] = bytes_checked;
  j["peak_device_bytes"] = peak;
  j["budget_bytes"] = budget;
  j["within_budget"] = peak <= budget;
  if (o.devices > 1) {
    nlohmann::ordered_json per = nlohmann::ordered_json::array();
    for (const DeviceRun* r : runs) {
      nlohmann::ordered_json d;
      d["device"] = r->device;
      d["steps_completed"] = r->steps_completed;
      d["oom"] = r->oom;
      if (!r->ran && !r->oom) d["replay_error"] = r->error;
      d["integrity_ok"] =
          o.no_data ? nlohmann::ordered_json() : nlohmann::ordered_json(r->integrity_ok);
      d["bytes_checked"] = r->bytes_checked;
      d["peak_device_bytes"] = r->peak;
      per.push_back(std::move(d));
    }
    j["per_device"] = std::move(per);
  }
  j["device_memory_bytes"] = ms.device_capacity;
  j["unconstrained_peak_bytes"] = unconstrained;
  j["record_peak_live_bytes"] = a.peak_live_bytes;
  j["bytes_device_to_host"] = d2h;
  j["bytes_host_to_device"] = h2d;
  j["bytes_forced_off_at_peak"] = forced;
  j["record_copy_bytes_device_to_host"] = e.trace_d2h_bytes();
  j["record_copy_bytes_host_to_device"] = e.trace_h2d_bytes();
  j["remote_access_bytes"] = ms.remote_access_bytes;
  j["host_peak_bytes"] = ms.host_peak;
  j["sim_step_time_ns"] = median;
  j["sim_baseline_step_time_ns"] = o.baseline_child ? median : base.median_step_ns;
  j["sim_lower_bound_step_time_ns"] = lower_bound;
  j["sim_lower_bound_step_times_ns"] = lower_bounds;
  j["sim_cyclic_bound_step_times_ns"] = bounds.cyclic;
  if (!ideal_ns.empty()) {
    j["ideal_step_times_ns"] = ideal_ns;
    j["ideal_step_time_ns"] = ideal_ns.back();
    j["min_bytes_moved"] = ideal_bytes;
    j["ideal_step_bytes_moved"] = ideal_bytes_by_step;
    j["ideal_move_host_ns"] = ideal_move_ns;
    j["ideal_fits"] = ideal_fits;
    if (fresh_last) {
      j["ideal_without_foresight_last_step_ns"] = fresh_last->ns;
      j["ideal_without_foresight_last_step_bytes_moved"] = fresh_last->bytes;
      j["ideal_without_foresight_fits"] = fresh_last->fits;
    }
  }
  if (!handles_ns.empty()) {
    j["ideal_handles_step_times_ns"] = handles_ns;
    j["ideal_handles_step_time_ns"] = handles_ns.back();
    j["ideal_handles_last_step_calls"] = {{"creates", last_churn.creates},
                                          {"maps", last_churn.maps},
                                          {"unmaps", last_churn.unmaps},
                                          {"releases", last_churn.releases},
                                          {"reused", last_churn.reused}};
  }
  j["stall_ns"] = stall;
  j["step_times_ns"] = e.step_times();
  {
    std::vector<uint64_t> out, in;
    for (const auto& [d2h_bytes, h2d_bytes] : e.step_bytes()) {
      out.push_back(d2h_bytes);
      in.push_back(h2d_bytes);
    }
    j["step_bytes_device_to_host"] = out;
    j["step_bytes_host_to_device"] = in;
  }
  // How often the run called each driver entry point spillway uses, so
  // that a fault can be injected at any one of those calls (SIMCUDA_FAIL;
  // harness/faults/).
  nlohmann::ordered_json calls = nlohmann::ordered_json::object();
  for (const char* name : kCountedCalls) calls[name] = simcuda_call_count(name);
  j["driver_calls"] = std::move(calls);
  // The shim's statistics as it wrote them (one object; {} without them).
  nlohmann::ordered_json shim = nlohmann::ordered_json::parse(stats, nullptr, false);
  j["shim"] = shim.is_object() ? std::move(shim) : nlohmann::ordered_json::object();
  // The keys' names before "trace" meant the Chrome/Perfetto file only and
  // "record" the .spwt file (session 19): scripts may read them.
  for (const char* key : {"record", "steps_in_record", "record_peak_live_bytes",
                          "record_copy_bytes_device_to_host", "record_copy_bytes_host_to_device"}) {
    std::string old = key;
    old.replace(old.find("record"), 6, "trace");
    j[old] = j[key];
  }
  // Bytes that are not UTF-8 (a path, a damaged record's text) are replaced,
  // not thrown at.
  const std::string report =
      j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  bool written = json_fd < 0 || write_and_close(json_fd, report, o.json_out);
  if (const int err = trace_fd < 0 ? 0 : write_chrome_trace(trace_fd, e, o); err != 0) {
    std::fprintf(stderr, "spillway-replay: writing '%s' failed: %s\n", o.trace_out.c_str(),
                 std::strerror(err));
    written = false;
  }
  if (!written) return 1;

  if (!o.quiet) {
    std::printf(
        "spillway-replay: %s, strategy %s (all times simulated)\n"
        "  steps %" PRIu64 "/%" PRIu64
        "%s, integrity %s\n"
        "  peak device %.1f MiB, budget %.1f MiB, unconstrained peak %.1f MiB\n"
        "  moved: %.1f MiB device-to-host, %.1f MiB host-to-device\n"
        "  step (median, simulated): %.3f ms, baseline %.3f ms, lower bound %.3f ms, stall %.3f "
        "ms total\n",
        o.trace.c_str(), name_of(o.strategy), steps, a.steps,
        oom_run ? (", OOM: " + named(oom_run, oom_run->oom_what)).c_str() : "",
        o.no_data      ? "not checked (--no-data)"
        : integrity_ok ? "ok"
                       : "FAILED",
        static_cast<double>(peak) / (1 << 20), static_cast<double>(budget) / (1 << 20),
        static_cast<double>(unconstrained) / (1 << 20), static_cast<double>(d2h) / (1 << 20),
        static_cast<double>(h2d) / (1 << 20), static_cast<double>(median) / 1e6,
        static_cast<double>(o.baseline_child ? median : base.median_step_ns) / 1e6,
        static_cast<double>(lower_bound) / 1e6, static_cast<double>(stall) / 1e6);
    if (!ideal_ns.empty() && !e.step_times().empty() && !lower_bounds.empty())
      std::printf(
          "  ideal (the planner given the trace's exact future, %.1f us a swap): last step %.3f "
          "ms, %.1f MiB moved in all; spillway/ideal: time %.2fx, bytes %.2fx; the last step's "
          "lower bound %.3f ms (ideal/bound %.2fx)\n",
          static_cast<double>(ideal_move_ns) / 1e3, static_cast<double>(ideal_ns.back()) / 1e6,
          static_cast<double>(ideal_bytes) / (1 << 20),
          static_cast<double>(e.step_times().back()) / static_cast<double>(ideal_ns.back()),
          ideal_bytes ? static_cast<double>(d2h + h2d) / static_cast<double>(ideal_bytes) : 0.0,
          static_cast<double>(lower_bounds.back()) / 1e6,
          static_cast<double>(ideal_ns.back()) / static_cast<double>(lower_bounds.back()));
    if (fresh_last && fresh_last->ns && !e.step_times().empty())
      std::printf(
          "  ideal without foresight (the last step planned with nothing carried from the step "
          "before): %.3f ms, %.1f MiB moved%s; spillway/that: %.2fx\n",
          static_cast<double>(fresh_last->ns) / 1e6,
          static_cast<double>(fresh_last->bytes) / (1 << 20),
          fresh_last->fits ? "" : " (its plan does not fit the budget)",
          static_cast<double>(e.step_times().back()) / static_cast<double>(fresh_last->ns));
    if (!handles_ns.empty() && !e.step_times().empty())
      std::printf(
          "  ideal with exact-size handles (the same plan, its allocations' VMM calls charged): "
          "last step %.3f ms; spillway/that: %.2fx\n",
          static_cast<double>(handles_ns.back()) / 1e6,
          static_cast<double>(e.step_times().back()) / static_cast<double>(handles_ns.back()));
    if (bad_run && !o.no_data)
      std::printf("  first mismatch: %s\n", bad_run->first_mismatch.c_str());
  }
  std::fflush(stdout);
  if (failed_run) return 1;
  if (!o.no_data && !integrity_ok) return 1;
  return 0;
}
