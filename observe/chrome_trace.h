// SPILLWAY_TRACE: a Chrome trace (JSON Array Format, which Perfetto and
// chrome://tracing open) of what the job ran and what spillway moved.
// docs/profiling.md describes the tracks, the clocks and the limits.
//
// Producers never format, write or wait: the observer events (the
// allocator's, under its lock, and spillway's own copies) go into a fixed
// ring, or when the writer is behind into a spill list bounded by
// Limits::spill_events, beyond which they are dropped and counted. A writer
// thread (spillway::Worker) takes them every flush_ms; CUPTI activity records
// come from the activity reader's thread (an ActivityListener). Both format
// one JSON line per event into a fixed-size buffer under the writer's lock,
// join spillway's copies to their activity records by correlation id, and
// write whole lines out.
//
// The file is valid whenever it is cut: it starts with '[' and each event is
// one line (after the first, starting with ','), written whole. Chrome's JSON
// Array Format allows the closing ']' to be missing, so a process killed by
// SIGKILL or a crash leaves a trace that loads up to the last write. finish()
// (at exit) and SIGTERM/SIGINT (install_signal_handlers) write the rest and
// close the array.
#pragma once

#include <cupti.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "activity.h"
#include "cupti_api.h"
#include "events.h"
#include "worker.h"

namespace spillway {

class ChromeEventWriter;

class ChromeTrace final : public Observer, public cupti::ActivityListener {
 public:
  struct Limits {
    size_t ring_events = 4096;      // pending allocator events (64 bytes each)
    size_t spill_events = 1 << 20;  // more of them, while the writer is behind
    size_t out_bytes = 256 * 1024;  // formatted JSON not yet written
    size_t join_slots = 512;        // each join table: copies, transfers, records
    int flush_ms = 50;              // the writer's period
  };
  // What was written, and how full each bounded structure ever got.
  struct Counters {
    uint64_t kernels = 0, memcpys = 0, memsets = 0;
    uint64_t evictions = 0, restores = 0, bytes_evicted = 0, bytes_restored = 0;
    uint64_t transfers_device_clock = 0, transfers_host_clock = 0, uncommitted_copies = 0;
    uint64_t memory_samples = 0, ooms_avoided = 0;
    uint64_t events_dropped = 0;   // allocator events lost: the ring and the spill were full
    uint64_t events_late = 0;      // arrived after the trace was closed
    uint64_t records_dropped = 0;  // activity records CUPTI had no buffer for
    uint64_t buffers_cut = 0;      // activity buffers CUPTI could not read to their end
    uint64_t clamped = 0;          // timestamps before the trace's time base
    uint64_t bytes_written = 0;
    size_t ring_peak = 0, ring_cap = 0;
    size_t spill_peak = 0, spill_cap = 0;
    size_t out_peak = 0, out_cap = 0;
    size_t join_peak = 0, join_cap = 0;
    size_t activity_buffers_peak = 0, activity_buffers = 0;
    bool closed = false;
  };

  // Creates `path` and starts the writer. With `activity` (CUPTI usable: the
  // tracker runs), timestamps are CUPTI's, and the owner makes the trace a
  // listener of `activity` for kernels, copies and sets; without, only
  // spillway's events, on the host clock. nullptr and a reason if the file
  // cannot be created.
  static std::unique_ptr<ChromeTrace> open(const std::string& path, cupti::ActivityReader* activity,
                                           std::string* why, Limits limits);
  static std::unique_ptr<ChromeTrace> open(const std::string& path, cupti::ActivityReader* activity,
                                           std::string* why) {
    return open(path, activity, why, Limits{});
  }
  ~ChromeTrace() override;
  ChromeTrace(const ChromeTrace&) = delete;
  ChromeTrace& operator=(const ChromeTrace&) = delete;

  // Observer (called with the allocator's lock held: pushes, never waits).
  void on_transfer(const Transfer& t) override;
  void on_memory(int device, uint64_t resident, uint64_t host, uint64_t budget) override;
  void on_oom_avoided(int device, size_t need, size_t freed) override;
  // spillway's own copies, to find their records.
  void on_own_copy(const OwnCopy& c) override;
  // ActivityListener (the reader's thread): kernels, copies, sets.
  void on_records(std::span<const cupti::DeviceRecord> records) override;

  // Writes everything seen so far and closes the array; later events are
  // counted as late. Stop the activity reader first, so that its last
  // records are in. Idempotent; does nothing in a forked child.
  void finish();
  // SIGTERM and SIGINT: the trace is written out (and closed, when the
  // previous disposition would end the process) before the previous
  // disposition runs. Not installed over an ignored signal. One trace only.
  void install_signal_handlers();

  Counters counters() const;
  const std::string& path() const { return path_; }
  // One line for the exit summary: the path and what the trace holds.
  std::string describe() const;

 private:
  struct HostEvent;
  struct Join;
  ChromeTrace(std::string path, cupti::ActivityReader* activity, Limits limits);
  void push(const HostEvent& e);
  uint64_t now() const;  // the trace clock: CUPTI's if there is one
  void run();            // the writer thread's pass
  void take_events();    // the ring and the spill, handled (write_mu_ held)
  void close_file();     // leftovers, the end event, ']' (write_mu_ held)
  void on_host_event(const HostEvent& e);
  void on_record(const cupti::DeviceRecord& r);
  void emit_transfer(const HostEvent& t, const cupti::DeviceRecord* r);
  void emit_uncommitted(const cupti::DeviceRecord& r, uint64_t stream);
  void emit_record(const cupti::DeviceRecord& r);
  void ensure_track(uint32_t pid, uint64_t tid);
  void note_join();
  void line(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  void write_out();
  std::string ts(uint64_t t);  // microseconds since the base, 3 decimals
 public:
  void signal_flush(bool fatal);  // async-signal-safe; see install_signal_handlers

 private:
  const std::string path_;
  cupti::ActivityReader* const activity_;
  const cupti::Api* const api_;
  const Limits limits_;
  const int owner_pid_;
  bool simulated_ = false;   // the trace clock is the simulator's virtual clock
  bool sim_driver_ = false;  // the driver is the simulator
  uint64_t base_ = 0, start_trace_ns_ = 0, start_monotonic_ns_ = 0;

  // The ring and the spill (producers and the writer).
  mutable std::mutex ring_mu_;
  std::unique_ptr<HostEvent[]> ring_, batch_;
  size_t ring_head_ = 0, ring_count_ = 0;
  std::vector<HostEvent> spill_, spill_batch_;  // after the ring's events, in order
  bool accepting_ = true;
  uint64_t dropped_ = 0, late_ = 0;  // counters of the producers
  size_t ring_peak_ = 0, spill_peak_ = 0;
  struct LastMemory {
    uint64_t resident = ~0ull, host = ~0ull, budget = ~0ull;
  };
  std::vector<LastMemory> last_memory_;  // per device, to skip unchanged samples

  // The writer's state: the writer thread, the activity reader's, a signal's
  // flush and finish(), one at a time under write_mu_.
  std::mutex write_mu_;
  std::unique_ptr<ChromeEventWriter> out_;  // the file (base/chrome_events.h)
  std::unique_ptr<Join> join_;
  std::vector<std::pair<uint32_t, uint64_t>> tracks_;  // (pid, tid) named so far (capped)

  mutable std::mutex counters_mu_;
  Counters c_;

  std::unique_ptr<Worker> writer_;
  std::atomic<bool> stop_{false};
  std::mutex finish_mu_;
  bool finished_ = false;
  // Signals: a request counter the handler bumps, and what the writer has done.
  std::atomic<uint64_t> sig_requests_{0}, sig_done_{0};
  std::atomic<bool> sig_fatal_{false}, closed_{false};
};

}  // namespace spillway
