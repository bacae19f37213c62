// spillway-replay: replays a .spwt record through the real libspillway.so on
// the simulated GPU. See harness/README.md. Every time figure is simulated.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace/trace.h"

namespace replay {

enum class Strategy { kSpillway, kNone, kSaveOnCpu, kTorchtune, kLayerwise };
const char* name_of(Strategy s);

struct Options {
  std::string trace;
  std::string budget;          // as given: SIZE or PCT% ("" = the shim's default)
  uint64_t device_memory = 0;  // 0: the sim's default
  std::string mode = "host";
  Strategy strategy = Strategy::kSpillway;
  int64_t steps = -1;  // -1: all
  int devices = 1;     // the record replayed on each, at once (--devices)
  std::string json_out;
  std::string trace_out;
  bool no_data = false;
  // What a step's end waits for: the record's streams (false: what
  // `loss.item()` does, a copy on the job's stream and a wait for it) or the
  // whole context (true: `torch.cuda.synchronize()`, every stream,
  // spillway's copy streams too). --step-sync.
  bool step_sync_context = false;
  int64_t inject_corruption = -1;  // hidden test seam: corrupt a byte after this launch
  bool baseline_child = false;     // hidden: this process is the baseline run
  bool quiet = false;              // hidden: no progress lines
  std::string shim;                // path of libspillway.so ("" = next to the binary)
  int layers = 0;                  // layerwise: layers in the model (0: meta, else 8)
  int offload_layers = -1;         // layerwise: layers offloaded (-1: all but the last)
};

// The most layers the layerwise analysis cuts a step's forward into
// (--layers, or the trace's meta): each step keeps one event index a layer.
inline constexpr int kMaxLayers = 10000;

// The trace loaded in memory, checked by trace::Reader, with what the
// strategies need to know ahead of time.
struct Analysis {
  std::string meta;
  std::vector<spillway::trace::Event> events;
  // String id -> text. A map: ids are any 64-bit number the trace gives (a
  // vector indexed by id once grew to the largest id, 2^56 and more).
  std::unordered_map<uint64_t, std::string> names;
  std::vector<uint8_t> phase;            // phase in force at each event
  std::vector<int64_t> step;             // step of each event (-1: set-up)
  uint64_t peak_live_bytes = 0;          // peak of the sum of requested sizes
  std::vector<uint64_t> step_peak_live;  // the same, per step
  // Per step, the peak of the bytes live *and read again* before their free
  // (or live at the record's end: read in the next step, were it repeated).
  // A byte no read needs can be dropped unmoved, so only these must be kept
  // somewhere at each moment (the cyclic bound, main.cpp).
  std::vector<uint64_t> step_peak_needed;
  uint64_t steps = 0;
  bool has_phases = false;
  // Per step, the summed durations of launches in each phase (0-3).
  std::vector<std::array<uint64_t, 4>> compute_ns;
  // Saved tensors: allocated in the forward phase of a step, read in its
  // backward phase.
  struct Saved {
    uint64_t alloc = 0;
    uint64_t size = 0;
    size_t last_fwd = 0;   // event index of its last forward touch (or its ALLOC)
    size_t first_bwd = 0;  // event index of its first backward touch
    int layer = 0;         // layerwise: forward span of its last forward touch
  };
  std::vector<Saved> saved;
  // layerwise: per step, the event index ending each layer's forward.
  std::vector<std::vector<size_t>> layer_end;
  int layers = 0;
};

// Loads and checks the trace; false with `error` set (offset included).
bool analyze(const std::string& path, int layers, Analysis& a, std::string& error);

}  // namespace replay
