// The step planner (planner.h). How it plans, and why so:
//
// The problem is offline caching with sizes and transfer times: exact
// optimisation is an integer program, far too slow for a step of thousands of
// launches at each relearn. So the planner builds a few plans with fast
// heuristics (6 to 18 candidates at the cap, then up to 3 at each of
// `sweep_margins`' lower caps for the variant that won, or 18 at each when
// `thorough`; each O((L + G + uses) log)) and keeps the one its own replay
// (`predict`) says is best: fits first, then least stall, then fewest bytes
// moved. The replay is what the plans are judged by, so a
// heuristic that is wrong for some shape of step costs only the time to try
// it. A step that fits without moves gets none.
//
// Each candidate is made in two passes over the step:
//
// 1. A sweep (launch 0 to L-1) decides which gaps are evicted. A block must be
//    resident at its anchors: each use, and its allocation (allocating takes
//    the memory); between two anchors it may be out. Whenever the resident
//    bytes at a launch exceed the cap (budget - headroom), the sweep evicts
//    resident blocks not anchored there, furthest next anchor first (Belady,
//    which minimises misses for equal sizes; with sizes it is a heuristic).
//    A block in its dead gap (freed before any further use) ranks above all:
//    it is never copied back. An eviction is retroactive: the block leaves
//    right after its previous anchor, so launches already swept only get
//    lower. A carried block's gap from its last use to its first use in the
//    next step wraps: evicting it at the step's start means evicting it after
//    its last use, so it is out in the step's tail too.
//    The sweep also reserves the prefetch's window: the block comes back at
//    the launch `r` from which a copy at the planning rate lands before its
//    next use (nominal start times, below), not at the use itself, and the
//    sweep counts it resident from r, evicting others there if need be. With
//    no victim left it brings the returns in flight furthest from their use
//    back at that use instead (a stall, but within the cap). Variants: ready
//    victims first (a block whose eviction copy would be done by the launch's
//    nominal start, so the host need not wait for it: stall before Belady) or
//    plain Belady; windows at the solo rate, the bidirectional rate, or none
//    (return at the use: fewer bytes, more stall).
// 2. Pruning, then prefetch placement. Each move the cap does not need (the
//    resident bytes over its gap stay within the cap with the block in) is
//    dropped, largest first: the sweep evicts before it knows what later
//    launches evict. The copies back share one H2D engine: placed as late
//    as possible in order of their deadlines (each must start by its use's
//    nominal start less its copy, and by the start of the copy after it), each
//    gives a desired launch, the latest whose nominal start is no later than
//    its copy's. Then, in order of next use, twice, each prefetch is moved to
//    that launch, or as early as memory allows after it if the cap would be
//    crossed at some launch of [p, next_use) (a segment tree of the resident
//    bytes: range add, find the last launch over a threshold). Moving one
//    never breaks the cap: it is taken out, then put where it fits.
// The desired launches of one candidate seed the sweep of the next (up to two
// more rounds, stopping at one that is no better), so that the sweep reserves
// windows that account for the H2D queue.
// 3. Optionally (PlanOptions::polish_replays, the replayer's ideal), a local
//    search from the best candidate: a move dropped, or its prefetch issued
//    earlier or later by 1, 2, 4, ... launches, kept when the replay says
//    better. It costs a replay a try, and finds what the two passes cannot
//    see: the copies' queues as they form (vit_b16 at 60%: the ideal's
//    steady step 21.4 -> 17.9 ms with 3,000 replays, simulated).
//
// Nominal start times are those of the step replayed without copies: the host
// issues launch i no earlier than launch_host_ns after launch i-1, compute runs
// each launch for its duration, in order, never before its issue. They repeat
// with the step's period, which gives times for indices < 0 and >= L.
//
// `predict` replays three steps back to back (no synchronisation between
// them) with the moves of each, and reports the last, so that the copies a
// step's tail queues for the next (carried blocks' wrapped prefetches) cost
// what they cost in the steady state. Moves of the step before the first
// replayed one are assumed done: their evictions finished, their prefetches
// issued before it landed. At each launch the host, in order:
//   - waits until the resident bytes fit the cap: the blocks the plan has in
//     (live, not out, prefetches issued) plus those whose eviction copy is not
//     done yet; eviction copies finish in order (one D2H engine), so it waits
//     for the fewest that make room. If the plan has more in than the cap, it
//     waits for every eviction copy and goes on (`fits` false);
//   - issues the prefetches of that launch, the one needed first first (their
//     memory is taken then; an H2D copy starts at max(issue, H2D engine free,
//     its eviction done));
//   - waits for the prefetches of the blocks the launch uses (the on-demand
//     path waits on the host for the copy);
//   - issues the launch; compute runs it at max(issue, previous launch's end);
//   - queues the eviction copies after that launch, by block id: each starts
//     at max(its end, D2H engine free).
// A copy runs at the bidirectional rate while the other engine is busy with a
// copy already queued when it starts, then at the solo rate: an approximation
// that ignores copies the other engine is given after it has started. A
// block whose eviction copy is still running when its prefetch is issued
// counts once (the allocator would keep the data). A dead block's memory
// counts until its eviction copy is done, even if it is freed before.
// step_ns is the steady state's period: from the end of the second replayed
// step's last launch to the end of the third's; stall_ns is step_ns less the
// same replay's period without any copy.
#include "planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>
#include <utility>

namespace spillway::policy {
namespace {

constexpr int64_t kNone = -1;
// A rate of 0 (or less) would make a copy infinite: take it as very slow.
constexpr double kMinRate = 1e-6;

// The model, checked and indexed once for all candidates and replays.
struct Prep {
  const StepModel& m;
  uint32_t L = 0;
  uint64_t cap = 0;
  double d2h = 0, h2d = 0, bidir = 0;
  double move_ns = 0;  // PlanOptions::move_host_ns
  // Each block's anchors (launches it must be resident at), ascending:
  // anchors[off[b] .. off[b + 1]).
  std::vector<uint32_t> off, anchors;
  // Live in this step at launches [begin, end) (a carried block: [0, L)).
  std::vector<uint32_t> begin, end;
  std::vector<uint8_t> live, carried;
  // Per launch, CSR: the blocks allocated, freed and anchored there.
  std::vector<uint32_t> alloc_off, alloc_at, free_off, free_at, anchor_off, anchor_at;
  // Nominal times: compute starts of a step in the steady state (without
  // copies), and its period.
  std::vector<double> ref;
  double period = 0;

  Prep(const StepModel& model, const PlanOptions& o);

  size_t count(uint32_t b) const { return off[b + 1] - off[b]; }
  const uint32_t* first(uint32_t b) const { return anchors.data() + off[b]; }
  uint64_t bytes(uint32_t b) const { return m.blocks[b].bytes; }
  double dur(int64_t g) const { return static_cast<double>(m.launch_ns[wrap(g)]); }
  uint32_t wrap(int64_t g) const {
    const int64_t l = L;
    return static_cast<uint32_t>(((g % l) + l) % l);
  }
  // The nominal start and end of launch g (any index: other steps repeat).
  double start(int64_t g) const {
    const int64_t l = L;
    const int64_t k = g >= 0 ? g / l : -((-g + l - 1) / l);
    return ref[static_cast<size_t>(g - k * l)] + static_cast<double>(k) * period;
  }
  double finish(int64_t g) const { return start(g) + dur(g); }
  // The anchor after launch e (canonical: a carried block's wrapped anchor
  // is its first use + L), or kNone for a step's block past its last anchor.
  int64_t next_anchor(uint32_t b, uint32_t e) const {
    const uint32_t* a = first(b);
    const uint32_t* n = std::upper_bound(a, a + count(b), e);
    if (n != a + count(b)) return *n;
    return carried[b] ? int64_t{a[0]} + L : kNone;
  }
  // Whether the block may be out at all: it has an anchor (a carried block
  // with no use in the step is never moved).
  bool movable(uint32_t b) const { return live[b] && count(b) > 0; }
};

// Compute starts and ends of `steps` steps of `m` back to back, no copies.
void replay_plain(const StepModel& m, int steps, std::vector<double>& starts,
                  std::vector<double>& ends) {
  const size_t L = m.launch_ns.size();
  starts.assign(L * steps, 0);
  ends.assign(L * steps, 0);
  const double h = static_cast<double>(m.launch_host_ns);
  double issue = 0, free_at = 0;
  for (size_t g = 0; g < L * steps; ++g) {
    if (g > 0) issue += h;
    if (!m.host_extra_ns.empty()) issue += static_cast<double>(m.host_extra_ns[g % L]);
    starts[g] = std::max(issue, free_at);
    ends[g] = free_at = starts[g] + static_cast<double>(m.launch_ns[g % L]);
  }
}

constexpr int kReplaySteps = 3;

Prep::Prep(const StepModel& model, const PlanOptions& o) : m(model) {
  L = static_cast<uint32_t>(m.launch_ns.size());
  cap = o.budget > o.headroom ? o.budget - o.headroom : 0;
  d2h = std::max(o.d2h_bytes_per_ns, kMinRate);
  h2d = std::max(o.h2d_bytes_per_ns, kMinRate);
  bidir = std::max(o.bidir_bytes_per_ns, kMinRate);
  move_ns = static_cast<double>(o.move_host_ns);
  const size_t G = m.blocks.size();
  off.assign(G + 1, 0);
  begin.assign(G, 0);
  end.assign(G, 0);
  live.assign(G, 0);
  carried.assign(G, 0);
  std::vector<uint32_t> alloc_n(L + 1, 0), free_n(L + 1, 0), anchor_n(L + 1, 0);
  for (size_t b = 0; b < G; ++b) {
    const StepModel::Block& k = m.blocks[b];
    carried[b] = k.carried;
    // A step's block still live at the step's end is taken as freed there:
    // only carried blocks wrap.
    begin[b] = k.carried ? 0 : std::min(k.alloc, L);
    end[b] = k.carried ? L : std::min(k.free, L);
    live[b] = begin[b] < end[b];
    off[b + 1] = off[b];
    if (!live[b]) continue;
    if (!k.carried) anchors.push_back(begin[b]);
    for (uint32_t u : k.uses)
      if (u >= begin[b] && u < end[b]) anchors.push_back(u);
    auto first_it = anchors.begin() + off[b];
    std::sort(first_it, anchors.end());
    anchors.erase(std::unique(first_it, anchors.end()), anchors.end());
    off[b + 1] = static_cast<uint32_t>(anchors.size());
    if (!k.carried) {
      ++alloc_n[begin[b]];
      if (end[b] < L) ++free_n[end[b]];
    }
    for (uint32_t j = off[b]; j < off[b + 1]; ++j) ++anchor_n[anchors[j]];
  }
  auto csr = [&](std::vector<uint32_t>& n, std::vector<uint32_t>& o2) {
    o2.assign(L + 1, 0);
    for (uint32_t i = 0; i < L; ++i) o2[i + 1] = o2[i] + n[i];
    n.assign(o2.begin(), o2.end());  // becomes the fill cursor
  };
  csr(alloc_n, alloc_off);
  csr(free_n, free_off);
  csr(anchor_n, anchor_off);
  alloc_at.resize(alloc_off[L]);
  free_at.resize(free_off[L]);
  anchor_at.resize(anchor_off[L]);
  for (uint32_t b = 0; b < G; ++b) {
    if (!live[b]) continue;
    if (!carried[b]) {
      alloc_at[alloc_n[begin[b]]++] = b;
      if (end[b] < L) free_at[free_n[end[b]]++] = b;
    }
    for (uint32_t j = off[b]; j < off[b + 1]; ++j) anchor_at[anchor_n[anchors[j]]++] = b;
  }
  std::vector<double> s, e;
  replay_plain(m, 2, s, e);
  ref.assign(s.begin() + L, s.end());
  period = L ? e[2 * L - 1] - e[L - 1] : 0;
}

// Seconds (ns) to copy `bytes` starting at `at` on one engine while the
// other is busy until `other_busy`.
double copy_ns(double bytes, double at, double other_busy, double solo, double bidir) {
  if (other_busy <= at) return bytes / solo;
  const double shared = std::min(bytes / bidir, other_busy - at);
  return shared + (bytes - shared * bidir) / solo;
}

// A move resolved to its block's index; canonical indices (p, u up to 2L).
struct Draft {
  uint32_t block = 0;
  uint32_t e = 0;
  int64_t p = kNone;  // kNone: dead
  int64_t u = kNone;
  bool dead() const { return u == kNone; }
};

// ---------------------------------------------------------------- predict

// Replays kReplaySteps steps with `given` (all consistent with the model).
Plan replay(const Prep& P, const std::vector<Draft>& given) {
  Plan out;
  // The order of the moves is the plan's (by launch, then block id): the
  // copies queued at one launch go in that order, so a plan costs the same
  // whichever way its moves were listed.
  std::vector<Draft> drafts = given;
  std::sort(drafts.begin(), drafts.end(), [&](const Draft& a, const Draft& b) {
    if (a.e != b.e) return a.e < b.e;
    return P.m.blocks[a.block].id < P.m.blocks[b.block].id;
  });
  const uint32_t L = P.L;
  if (L == 0) {
    out.fits = P.m.pinned_bytes <= P.cap;
    out.peak_bytes = P.m.pinned_bytes;
    return out;
  }
  const int64_t N = int64_t{L} * kReplaySteps;
  // Resident bytes the plan has at each replayed launch.
  std::vector<int64_t> diff(N + 1, 0);
  auto add = [&](int64_t lo, int64_t hi, int64_t v) {
    lo = std::max<int64_t>(lo, 0);
    hi = std::min<int64_t>(hi, N);
    if (lo >= hi) return;
    diff[lo] += v;
    diff[hi] -= v;
  };
  add(0, N, static_cast<int64_t>(P.m.pinned_bytes));
  for (uint32_t b = 0; b < P.m.blocks.size(); ++b) {
    if (!P.live[b]) continue;
    const int64_t v = static_cast<int64_t>(P.bytes(b));
    for (int k = 0; k < kReplaySteps; ++k)
      add(int64_t{k} * L + P.begin[b], int64_t{k} * L + P.end[b], v);
  }
  // Move instances: move i in replayed step k (-1 .. kReplaySteps-1).
  constexpr int kFirst = -1;
  constexpr int kInst = kReplaySteps + 1;
  const size_t n_inst = drafts.size() * kInst;
  std::vector<std::vector<uint32_t>> evict_at(N), fetch_at(N), wait_at(N);
  for (size_t i = 0; i < drafts.size(); ++i) {
    const Draft& d = drafts[i];
    const int64_t v = static_cast<int64_t>(P.bytes(d.block));
    out.bytes_out += P.bytes(d.block);
    if (!d.dead()) out.bytes_in += P.bytes(d.block);
    for (int k = kFirst; k < kReplaySteps; ++k) {
      const int64_t base = int64_t{k} * L;
      const uint32_t inst = static_cast<uint32_t>(i * kInst + (k - kFirst));
      const int64_t e = base + d.e;
      const int64_t back = d.dead() ? base + P.end[d.block] : base + d.p;
      add(e + 1, back, -v);
      if (e >= 0 && e < N) evict_at[e].push_back(inst);
      if (d.dead()) continue;
      const int64_t p = base + d.p, u = base + d.u;
      if (p >= 0 && p < N) fetch_at[p].push_back(inst);
      if (u >= 0 && u < N) wait_at[u].push_back(inst);
    }
  }
  // Prefetches issued at one launch: the one needed first goes first.
  for (std::vector<uint32_t>& at : fetch_at)
    std::stable_sort(at.begin(), at.end(), [&](uint32_t x, uint32_t y) {
      return drafts[x / kInst].u + int64_t{L} * (x % kInst) <
             drafts[y / kInst].u + int64_t{L} * (y % kInst);
    });
  std::vector<double> evict_done(n_inst, 0), landed(n_inst, 0);
  std::vector<int64_t> fifo_of(n_inst, -1);
  struct Pending {
    double done;
    uint64_t bytes;
  };
  std::vector<Pending> fifo;
  size_t head = 0;
  uint64_t pending = 0;
  const double h = static_cast<double>(P.m.launch_host_ns);
  double issue = 0, compute_free = 0, d2h_free = 0, h2d_free = 0;
  // The driver makes VMM calls one at a time, whatever the thread
  // (docs/gpu.md run 19): the swaps, the job's calls before a launch and the
  // mover's before a prefetch's copy take turns on one timeline, each the
  // first gap of its length at or after it is asked for.
  std::vector<std::pair<double, double>> vmm_busy;  // [start, end), ascending
  auto occupy = [&](double at, double ns) {
    auto it = std::lower_bound(vmm_busy.begin(), vmm_busy.end(), at,
                               [](const auto& b, double t) { return b.second <= t; });
    for (; it != vmm_busy.end() && it->first < at + ns; ++it) at = std::max(at, it->second);
    vmm_busy.insert(it, {at, at + ns});
    return at + ns;
  };
  // The swaps (move_host_ns each) on one thread, in the order the copies
  // are queued: a copy's block is usable, or its device memory free, once
  // its swap is done.
  double mover_free = 0;
  auto swapped = [&](double copied) {
    if (P.move_ns <= 0) return copied;
    mover_free = occupy(std::max(copied, mover_free), P.move_ns);
    return mover_free;
  };
  std::vector<double> last_end(kReplaySteps, 0);
  int64_t resident = 0;
  uint64_t peak = 0;
  bool fits = true;
  // The mover's work before a launch's prefetch copies (fetch_extra_ns), on
  // a clock of its own: those copies start no earlier than it is done.
  double fetch_free = 0;
  for (int64_t g = 0; g < N; ++g) {
    resident += diff[g];
    double t = g == 0 ? 0 : issue + h;
    if (!P.m.host_extra_ns.empty() && P.m.host_extra_ns[P.wrap(g)] > 0)
      t = occupy(t, static_cast<double>(P.m.host_extra_ns[P.wrap(g)]));
    const uint64_t need = static_cast<uint64_t>(std::max<int64_t>(resident, 0));
    while (head < fifo.size() && fifo[head].done <= t) pending -= fifo[head++].bytes;
    while (need + pending > P.cap && head < fifo.size()) {
      t = std::max(t, fifo[head].done);
      pending -= fifo[head++].bytes;
    }
    if (g >= N - L) {
      peak = std::max(peak, need + pending);
      if (need + pending > P.cap) fits = false;
    }
    if (!P.m.fetch_extra_ns.empty() && !fetch_at[g].empty() && P.m.fetch_extra_ns[P.wrap(g)] > 0)
      fetch_free =
          occupy(std::max(fetch_free, t), static_cast<double>(P.m.fetch_extra_ns[P.wrap(g)]));
    for (uint32_t inst : fetch_at[g]) {
      const Draft& d = drafts[inst / kInst];
      const uint64_t bytes = P.bytes(d.block);
      if (fifo_of[inst] >= static_cast<int64_t>(head)) {
        pending -= fifo[fifo_of[inst]].bytes;
        fifo[fifo_of[inst]].bytes = 0;
      }
      const double s = std::max({t, h2d_free, evict_done[inst], fetch_free});
      h2d_free = s + copy_ns(static_cast<double>(bytes), s, d2h_free, P.h2d, P.bidir);
      landed[inst] = swapped(h2d_free);
    }
    for (uint32_t inst : wait_at[g]) t = std::max(t, landed[inst]);
    issue = t;
    const double s = std::max(t, compute_free);
    compute_free = s + P.dur(g);
    last_end[g / L] = compute_free;
    for (uint32_t inst : evict_at[g]) {
      const uint64_t bytes = P.bytes(drafts[inst / kInst].block);
      const double c = std::max(compute_free, d2h_free);
      evict_done[inst] = d2h_free =
          c + copy_ns(static_cast<double>(bytes), c, h2d_free, P.d2h, P.bidir);
      fifo_of[inst] = static_cast<int64_t>(fifo.size());
      fifo.push_back({swapped(d2h_free), bytes});
      pending += bytes;
    }
  }
  std::vector<double> s, e;
  replay_plain(P.m, kReplaySteps, s, e);
  const double base = e[N - 1] - e[N - L - 1];
  const double step = last_end[kReplaySteps - 1] - last_end[kReplaySteps - 2];
  out.fits = fits;
  out.peak_bytes = peak;
  out.step_ns = static_cast<uint64_t>(std::llround(std::max(step, 0.0)));
  out.stall_ns = static_cast<uint64_t>(std::llround(std::max(step - base, 0.0)));
  return out;
}

std::vector<Move> to_moves(const Prep& P, const std::vector<Draft>& drafts) {
  std::vector<Move> moves;
  moves.reserve(drafts.size());
  for (const Draft& d : drafts) {
    Move mv;
    mv.block = P.m.blocks[d.block].id;
    mv.evict_after = d.e;
    if (!d.dead()) {
      mv.prefetch_at = static_cast<uint32_t>(d.p);
      mv.next_use = static_cast<uint32_t>(d.u);
    }
    moves.push_back(mv);
  }
  std::sort(moves.begin(), moves.end(), [](const Move& a, const Move& b) {
    return a.evict_after != b.evict_after ? a.evict_after < b.evict_after : a.block < b.block;
  });
  return moves;
}

// ---------------------------------------------------------------- planning

// Resident bytes per launch of the step (indices taken modulo L): range add,
// and the last launch of a range above a threshold.
class Residency {
 public:
  explicit Residency(const std::vector<int64_t>& v) : n_(v.size()) {
    size_ = 1;
    while (size_ < n_) size_ <<= 1;
    max_.assign(2 * size_, std::numeric_limits<int64_t>::min() / 4);
    lazy_.assign(2 * size_, 0);
    for (size_t i = 0; i < n_; ++i) max_[size_ + i] = v[i];
    for (size_t i = size_ - 1; i >= 1; --i) max_[i] = std::max(max_[2 * i], max_[2 * i + 1]);
  }
  // [lo, hi) in canonical indices (0 <= lo <= hi <= lo + n).
  void add(int64_t lo, int64_t hi, int64_t v) {
    split(lo, hi, [&](size_t a, size_t b) { add(1, 0, size_, a, b, v); });
  }
  // The last index of [lo, hi) whose value exceeds `limit`, or kNone.
  int64_t last_over(int64_t lo, int64_t hi, int64_t limit) {
    const int64_t n = static_cast<int64_t>(n_);
    if (hi > n) {
      const int64_t j = last(1, 0, size_, static_cast<size_t>(std::max(lo, n) - n),
                             static_cast<size_t>(hi - n), limit);
      if (j != kNone) return j + n;
    }
    if (lo < n)
      return last(1, 0, size_, static_cast<size_t>(lo), static_cast<size_t>(std::min(hi, n)),
                  limit);
    return kNone;
  }

 private:
  template <typename F>
  void split(int64_t lo, int64_t hi, F f) {
    const int64_t n = static_cast<int64_t>(n_);
    if (lo >= hi) return;
    if (lo < n) f(static_cast<size_t>(lo), static_cast<size_t>(std::min(hi, n)));
    if (hi > n) f(static_cast<size_t>(std::max(lo, n) - n), static_cast<size_t>(hi - n));
  }
  void add(size_t x, size_t l, size_t r, size_t a, size_t b, int64_t v) {
    if (b <= l || r <= a) return;
    if (a <= l && r <= b) {
      max_[x] += v;
      lazy_[x] += v;
      return;
    }
    const size_t m = (l + r) / 2;
    add(2 * x, l, m, a, b, v);
    add(2 * x + 1, m, r, a, b, v);
    max_[x] = std::max(max_[2 * x], max_[2 * x + 1]) + lazy_[x];
  }
  // With `above`: the lazy additions of the node's ancestors.
  int64_t last(size_t x, size_t l, size_t r, size_t a, size_t b, int64_t limit, int64_t above = 0) {
    if (b <= l || r <= a || max_[x] + above <= limit) return kNone;
    if (r - l == 1) return static_cast<int64_t>(l);
    const size_t m = (l + r) / 2;
    above += lazy_[x];
    const int64_t j = last(2 * x + 1, m, r, a, b, limit, above);
    return j != kNone ? j : last(2 * x, l, m, a, b, limit, above);
  }

  size_t n_, size_ = 1;
  std::vector<int64_t> max_, lazy_;
};

enum class Window { kNone, kSolo, kBidir };

struct Config {
  bool ready_first = true;
  Window window = Window::kSolo;
  uint64_t cap = 0;  // the sweep's and placement's: P.cap, or lower (sweep_margins)
};

class Planner {
 public:
  explicit Planner(const Prep& p) : P(p) {}

  // The gaps to evict; `desired` (per anchor index: the return launch wanted
  // for the gap after it, or kNone) overrides the window.
  std::vector<Draft> sweep(const Config& c, const std::vector<int64_t>& desired);
  // Places the prefetches of `d` (see the file's comment); fills `desired`
  // with the launches the H2D queue alone asks for.
  void place(std::vector<Draft>& d, std::vector<int64_t>& desired, uint64_t cap);

 private:
  // Latest launch in (a, u] from which a copy of `ns` lands by u's start.
  int64_t window_start(int64_t a, int64_t u, double ns) const {
    const double by = P.start(u) - ns;
    int64_t lo = a + 1, hi = u;  // answer in [lo, hi], or a + 1
    if (P.start(lo) > by) return a + 1;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (P.start(mid) <= by)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
  // First launch after i whose nominal start is at or after `t`.
  int64_t first_at(int64_t i, double t) const {
    int64_t lo = i + 1, hi = i + 1 + 2 * int64_t{P.L};
    if (P.start(hi) < t) return hi;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (P.start(mid) >= t)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }

  const Prep& P;
};

// Victims: furthest key first, then larger, then lower index (deterministic).
struct Entry {
  int64_t key;
  uint64_t bytes;
  uint32_t block;
  uint32_t version;
  bool operator<(const Entry& o) const {
    if (key != o.key) return key < o.key;
    if (bytes != o.bytes) return bytes < o.bytes;
    return block > o.block;
  }
};
// Timed events: earliest first.
struct Event {
  int64_t at;
  uint32_t block;
  uint32_t version;
  bool operator>(const Event& o) const { return at != o.at ? at > o.at : block > o.block; }
};
using EventQueue = std::priority_queue<Event, std::vector<Event>, std::greater<Event>>;

std::vector<Draft> Planner::sweep(const Config& c, const std::vector<int64_t>& desired) {
  const uint32_t L = P.L;
  const size_t G = P.m.blocks.size();
  enum class St : uint8_t { kAbsent, kIn, kOut, kReturning, kGone };
  std::vector<St> st(G, St::kAbsent);
  std::vector<uint32_t> ver(G, 0);
  // Index (in the block's anchors) of its next anchor at or after the launch
  // being swept; count(b) past its last.
  std::vector<uint32_t> nj(G, 0);
  std::vector<int64_t> draft_of(G, kNone);
  std::vector<int64_t> shift_of(G, 0);  // L for a wrapped gap evicted at the step's start
  std::vector<uint8_t> wrap_out(G, 0);
  std::vector<Draft> drafts;
  std::priority_queue<Entry> any, ready, returning;
  EventQueue returns, readies;
  const int64_t kDeadKey = 4 * int64_t{L};
  const double out_rate = P.d2h;
  const double in_rate = c.window == Window::kBidir ? P.bidir : P.h2d;
  uint64_t cur = P.m.pinned_bytes;

  // The gap that follows anchor j of block b (j = count(b): the one wrapping
  // the step, or the dead one), in the sweep's indices: (a, u).
  auto gap_key = [&](uint32_t b, int64_t a) -> int64_t {
    const uint32_t j = nj[b];
    if (j < P.count(b)) return P.first(b)[j];
    if (P.carried[b]) return int64_t{P.first(b)[0]} + L + (a < 0 ? -int64_t{L} : 0);
    return kDeadKey + P.end[b];
  };
  // Candidacy for the gap starting after anchor a (sweep index, may be < 0).
  auto offer = [&](uint32_t b, int64_t a) {
    const int64_t key = gap_key(b, a);
    const int64_t gap_end = key >= kDeadKey ? int64_t{P.end[b]} : key;
    if (gap_end <= a + 1) return;  // no launch in the gap
    any.push({key, P.bytes(b), b, ver[b]});
    const int64_t r = first_at(a, P.finish(a) + static_cast<double>(P.bytes(b)) / out_rate);
    if (r < std::min<int64_t>(gap_end, L)) readies.push({std::max<int64_t>(r, 0), b, ver[b]});
  };
  for (uint32_t b = 0; b < G; ++b) {
    if (!P.live[b] || !P.carried[b]) continue;
    st[b] = St::kIn;
    cur += P.bytes(b);
    if (P.movable(b) && P.first(b)[0] > 0) offer(b, int64_t{P.first(b)[P.count(b) - 1]} - L);
  }
  auto pop_from = [&](std::priority_queue<Entry>& q, int64_t i) -> int64_t {
    while (!q.empty()) {
      const Entry e = q.top();
      if (e.version != ver[e.block] || st[e.block] != St::kIn) {
        q.pop();
        continue;
      }
      if (e.key <= i) return kNone;  // anchored here, and so is every one left
      q.pop();
      return e.block;
    }
    return kNone;
  };

  for (uint32_t i = 0; i < L; ++i) {
    for (uint32_t k = P.free_off[i]; k < P.free_off[i + 1]; ++k) {
      const uint32_t b = P.free_at[k];
      if (st[b] == St::kIn || st[b] == St::kReturning) cur -= P.bytes(b);
      st[b] = St::kGone;
      ++ver[b];
    }
    for (uint32_t k = P.alloc_off[i]; k < P.alloc_off[i + 1]; ++k) {
      const uint32_t b = P.alloc_at[k];
      st[b] = St::kIn;
      cur += P.bytes(b);
    }
    while (!returns.empty() && returns.top().at <= i) {
      const Event e = returns.top();
      returns.pop();
      if (e.version != ver[e.block] || st[e.block] != St::kOut) continue;
      st[e.block] = St::kReturning;
      cur += P.bytes(e.block);
      returning.push({drafts[draft_of[e.block]].u - shift_of[e.block], 0, e.block, ver[e.block]});
    }
    while (!readies.empty() && readies.top().at <= i) {
      const Event e = readies.top();
      readies.pop();
      if (e.version == ver[e.block] && st[e.block] == St::kIn)
        ready.push({gap_key(e.block, i), P.bytes(e.block), e.block, e.version});
    }
    while (cur > c.cap) {
      int64_t v = c.ready_first ? pop_from(ready, i) : kNone;
      if (v == kNone) v = pop_from(any, i);
      if (v != kNone) {
        const uint32_t b = static_cast<uint32_t>(v);
        const uint32_t j = nj[b];
        const size_t n = P.count(b);
        // The anchor before launch i, in the sweep's indices.
        const int64_t a_sw = j > 0 ? int64_t{P.first(b)[j - 1]} : int64_t{P.first(b)[n - 1]} - L;
        const int64_t shift = a_sw < 0 ? L : 0;
        Draft d;
        d.block = b;
        d.e = static_cast<uint32_t>(a_sw + shift);
        const int64_t key = gap_key(b, a_sw);
        st[b] = St::kOut;
        cur -= P.bytes(b);
        ++ver[b];
        if (P.carried[b] && j == 0) wrap_out[b] = 1;
        if (key < kDeadKey) {
          d.u = key + shift;
          const size_t gap = P.off[b] + (j > 0 ? j - 1 : n - 1);
          int64_t r = desired.empty() ? kNone : desired[gap];
          if (r == kNone || r <= d.e || r > d.u)
            r = c.window == Window::kNone
                    ? d.u
                    : window_start(d.e, d.u, static_cast<double>(P.bytes(b)) / in_rate);
          d.p = std::clamp<int64_t>(r, int64_t{i} + shift + 1, d.u);
          shift_of[b] = shift;
          draft_of[b] = static_cast<int64_t>(drafts.size());
          if (d.p - shift < L) returns.push({d.p - shift, b, ver[b]});
        }
        drafts.push_back(d);
        continue;
      }
      // No block left to evict: the returning block whose use is furthest
      // comes back at that use instead (a stall rather than crossing the
      // cap; placement brings it back earlier where the memory allows).
      while (!returning.empty()) {
        const Entry e = returning.top();
        if (e.version != ver[e.block] || st[e.block] != St::kReturning) {
          returning.pop();
          continue;
        }
        break;
      }
      if (returning.empty() || returning.top().key <= i) break;  // it cannot fit
      const uint32_t b = returning.top().block;
      returning.pop();
      st[b] = St::kOut;
      cur -= P.bytes(b);
      ++ver[b];
      Draft& d = drafts[draft_of[b]];
      d.p = d.u;
      if (d.u - shift_of[b] < L) returns.push({d.u - shift_of[b], b, ver[b]});
    }
    for (uint32_t k = P.anchor_off[i]; k < P.anchor_off[i + 1]; ++k) {
      const uint32_t b = P.anchor_at[k];
      if (st[b] == St::kOut) cur += P.bytes(b);  // not expected: a return is due by its use
      st[b] = St::kIn;
      ++ver[b];
      while (nj[b] < P.count(b) && P.first(b)[nj[b]] <= i) ++nj[b];
      if (nj[b] == P.count(b) && wrap_out[b]) {
        // Its wrapped gap was evicted at the step's start: out after its
        // last use here too.
        st[b] = St::kOut;
        cur -= P.bytes(b);
        continue;
      }
      offer(b, i);
    }
  }
  return drafts;
}

void Planner::place(std::vector<Draft>& drafts, std::vector<int64_t>& desired, uint64_t cap) {
  const uint32_t L = P.L;
  std::vector<int64_t> diff(L + 1, 0);
  auto add = [&](int64_t lo, int64_t hi, int64_t v) {  // canonical, may wrap
    if (lo >= hi) return;
    auto part = [&](int64_t a, int64_t b) {
      diff[a] += v;
      diff[b] -= v;
    };
    if (lo < L) part(lo, std::min<int64_t>(hi, L));
    if (hi > L) part(std::max<int64_t>(lo, L) - L, hi - L);
  };
  add(0, L, static_cast<int64_t>(P.m.pinned_bytes));
  for (uint32_t b = 0; b < P.m.blocks.size(); ++b)
    if (P.live[b]) add(P.begin[b], P.end[b], static_cast<int64_t>(P.bytes(b)));
  auto back = [&](const Draft& d) { return d.dead() ? int64_t{P.end[d.block]} : d.p; };
  for (const Draft& d : drafts)
    add(int64_t{d.e} + 1, back(d), -static_cast<int64_t>(P.bytes(d.block)));
  std::vector<int64_t> level(L);
  int64_t run = 0;
  for (uint32_t i = 0; i < L; ++i) level[i] = run += diff[i];
  Residency res(level);
  const int64_t limit = static_cast<int64_t>(cap);

  // Moves the cap does not need, largest first: the sweep evicts before it
  // knows what later launches evict (a carried block's wrapped gap taken in
  // the step's tail is out at its start too), and a victim can be larger
  // than the excess.
  std::vector<size_t> order(drafts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const Draft &a = drafts[x], &b = drafts[y];
    if (P.bytes(a.block) != P.bytes(b.block)) return P.bytes(a.block) > P.bytes(b.block);
    return a.block != b.block ? a.block < b.block : a.e < b.e;
  });
  std::vector<uint8_t> keep(drafts.size(), 1);
  for (size_t k : order) {
    const Draft& d = drafts[k];
    const int64_t v = static_cast<int64_t>(P.bytes(d.block));
    if (res.last_over(int64_t{d.e} + 1, back(d), limit - v) != kNone) continue;
    res.add(int64_t{d.e} + 1, back(d), v);
    keep[k] = 0;
  }
  size_t kept = 0;
  for (size_t k = 0; k < drafts.size(); ++k)
    if (keep[k]) drafts[kept++] = drafts[k];
  drafts.resize(kept);
  std::vector<size_t> fetch;
  for (size_t k = 0; k < drafts.size(); ++k)
    if (!drafts[k].dead()) fetch.push_back(k);

  // As late as possible on the H2D engine, latest deadline first.
  std::sort(fetch.begin(), fetch.end(), [&](size_t x, size_t y) {
    const Draft &a = drafts[x], &b = drafts[y];
    return a.u != b.u ? a.u > b.u : a.block < b.block;
  });
  std::vector<int64_t> want(drafts.size(), kNone);
  double next = std::numeric_limits<double>::infinity();
  for (size_t k : fetch) {
    const Draft& d = drafts[k];
    const double by = std::min(P.start(d.u), next) - static_cast<double>(P.bytes(d.block)) / P.h2d;
    next = by;
    // The latest launch whose nominal start is at or before `by`.
    const int64_t w = window_start(d.e, d.u, P.start(d.u) - by);
    want[k] = w;
    desired[P.off[d.block] +
            static_cast<size_t>(
                std::lower_bound(P.first(d.block), P.first(d.block) + P.count(d.block), d.e) -
                P.first(d.block))] = w;
  }
  std::reverse(fetch.begin(), fetch.end());  // earliest use first
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k : fetch) {
      Draft& d = drafts[k];
      const int64_t v = static_cast<int64_t>(P.bytes(d.block));
      res.add(d.p, d.u, -v);
      const int64_t over = res.last_over(int64_t{d.e} + 1, d.u, limit - v);
      const int64_t room = over == kNone ? int64_t{d.e} + 1 : over + 1;
      d.p = std::min(std::max(want[k], room), d.u);
      res.add(d.p, d.u, v);
    }
  }
}

// Better: fits, then less stall, then fewer bytes, then lower peak.
bool better(const Plan& a, const Plan& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.stall_ns != b.stall_ns) return a.stall_ns < b.stall_ns;
  if (a.bytes_out + a.bytes_in != b.bytes_out + b.bytes_in)
    return a.bytes_out + a.bytes_in < b.bytes_out + b.bytes_in;
  return a.peak_bytes < b.peak_bytes;
}

// Local search from the best candidate (PlanOptions::polish_replays): the
// sweep fixes which gaps are out before it knows the prefetch queue, and
// placement times the prefetches by nominal starts; the replay judges each
// change with the queues as they form. First improvement, move by move, until
// a pass changes nothing or the replays run out; deterministic.
void polish(const Prep& P, std::vector<Draft>& drafts, Plan& best, uint32_t max_replays) {
  uint32_t replays = 0;
  auto take_if_better = [&](std::vector<Draft>& trial) {
    ++replays;
    Plan p = replay(P, trial);
    if (!better(p, best)) return false;
    best = std::move(p);
    drafts.swap(trial);
    return true;
  };
  for (bool changed = true; changed && replays < max_replays;) {
    changed = false;
    for (size_t k = 0; k < drafts.size() && replays < max_replays; ++k) {
      // Without this move: its gap stays resident (fewer bytes, if it fits).
      std::vector<Draft> trial = drafts;
      trial.erase(trial.begin() + static_cast<std::ptrdiff_t>(k));
      if (take_if_better(trial)) {
        changed = true;
        --k;
        continue;
      }
      if (drafts[k].dead()) continue;
      const int64_t e = drafts[k].e, u = drafts[k].u, p0 = drafts[k].p;
      bool moved = false;
      for (int64_t step = 1; step <= int64_t{P.L} && !moved && replays < max_replays; step *= 2)
        for (int64_t p : {p0 - step, p0 + step}) {
          if (p <= e || p > u) continue;
          trial = drafts;
          trial[k].p = p;
          if ((moved = take_if_better(trial))) break;
        }
      changed |= moved;
    }
  }
}

}  // namespace

bool same_step(const StepModel& a, const StepModel& b, uint32_t within, uint64_t pinned_slack) {
  auto near = [within](uint64_t x, uint64_t y) {
    return std::max(x, y) - std::min(x, y) <= std::max(x, y) / std::max<uint32_t>(within, 1);
  };
  if (a.launch_ns.size() != b.launch_ns.size() || a.blocks.size() != b.blocks.size() ||
      a.launch_host_ns != b.launch_host_ns ||
      !(near(a.pinned_bytes, b.pinned_bytes) ||
        std::max(a.pinned_bytes, b.pinned_bytes) - std::min(a.pinned_bytes, b.pinned_bytes) <=
            pinned_slack) ||
      a.host_extra_ns != b.host_extra_ns || a.fetch_extra_ns != b.fetch_extra_ns)
    return false;
  const uint64_t ta = std::accumulate(a.launch_ns.begin(), a.launch_ns.end(), uint64_t{0});
  const uint64_t tb = std::accumulate(b.launch_ns.begin(), b.launch_ns.end(), uint64_t{0});
  if (!near(ta, tb)) return false;
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    const StepModel::Block &x = a.blocks[i], &y = b.blocks[i];
    if (x.id != y.id || x.bytes != y.bytes || x.alloc != y.alloc || x.free != y.free ||
        x.carried != y.carried || x.uses != y.uses)
      return false;
  }
  return true;
}

Plan plan_step(const StepModel& m, const PlanOptions& o) {
  const Prep P(m, o);
  Plan best = replay(P, {});
  if (best.fits || P.L == 0) return best;
  Planner planner(P);
  bool have = false;
  Config won;
  std::vector<Draft> best_drafts;  // the best plan's, for the search and its moves
  // One candidate family: a sweep, placement, then up to two more rounds
  // that reserve the windows the H2D queue asked for in the round before;
  // they stop at the first that is no better (more often than not the
  // first: when the link is the bottleneck, wider windows only evict more).
  auto family = [&](const Config& c) {
    std::vector<int64_t> desired;
    Plan last;
    for (int round = 0; round < 3; ++round) {
      std::vector<Draft> drafts = planner.sweep(c, desired);
      desired.assign(P.anchors.size(), kNone);
      planner.place(drafts, desired, c.cap);
      Plan p = replay(P, drafts);
      const bool improved = round == 0 || better(p, last);
      if (!have || better(p, best)) {
        best = p;
        best_drafts = drafts;
        have = true;
        won = c;
      }
      if (!improved) break;
      last = std::move(p);
    }
  };
  for (bool ready_first : {true, false})
    for (Window w : {Window::kSolo, Window::kBidir, Window::kNone}) family({ready_first, w, P.cap});
  // Sweeps under a lower cap: Belady with sizes evicts at the last moment,
  // and a tighter sweep makes room earlier, for prefetch windows and the
  // next launches' allocations; each plan is still judged at the true cap.
  const Config won_at_cap = won;
  for (double margin : o.sweep_margins) {
    if (!(margin > 0 && margin < 1)) continue;
    const auto cap = static_cast<uint64_t>(static_cast<double>(P.cap) * (1.0 - margin));
    if (!o.thorough) {
      family({won_at_cap.ready_first, won_at_cap.window, cap});
      continue;
    }
    for (bool ready_first : {true, false})
      for (Window w : {Window::kSolo, Window::kBidir, Window::kNone}) family({ready_first, w, cap});
  }
  if (!have) return best;
  if (o.polish_replays > 0) polish(P, best_drafts, best, o.polish_replays);
  // The moves once, of the plan kept.
  best.moves = to_moves(P, best_drafts);
  return best;
}

Plan predict(const StepModel& m, const PlanOptions& o, std::vector<Move> moves) {
  const Prep P(m, o);
  // Ids to indices (the first block of an id, if the caller repeated one).
  std::vector<std::pair<uint64_t, uint32_t>> ids;
  ids.reserve(m.blocks.size());
  for (uint32_t b = 0; b < m.blocks.size(); ++b) ids.emplace_back(m.blocks[b].id, b);
  std::stable_sort(ids.begin(), ids.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<Draft, size_t>> resolved;
  for (size_t k = 0; k < moves.size(); ++k) {
    const Move& mv = moves[k];
    auto it = std::lower_bound(ids.begin(), ids.end(), mv.block,
                               [](const auto& a, uint64_t id) { return a.first < id; });
    if (it == ids.end() || it->first != mv.block) continue;
    const uint32_t b = it->second;
    if (!P.movable(b) || mv.evict_after >= P.L) continue;
    if (mv.evict_after < P.begin[b] || mv.evict_after >= P.end[b]) continue;
    // A carried block's wrapped gap is named by its last use, not by a launch
    // before its first.
    if (P.carried[b] && mv.evict_after < P.first(b)[0]) continue;
    const int64_t u = P.next_anchor(b, mv.evict_after);
    Draft d;
    d.block = b;
    d.e = mv.evict_after;
    if (mv.next_use == Move::kNever || mv.prefetch_at == Move::kNever) {
      if (u != kNone || mv.next_use != mv.prefetch_at) continue;
    } else {
      if (u != int64_t{mv.next_use} || mv.prefetch_at <= mv.evict_after || mv.prefetch_at > u)
        continue;
      d.p = mv.prefetch_at;
      d.u = u;
    }
    resolved.emplace_back(d, k);
  }
  // One move per gap: by block, then launch; a move starting inside the gap
  // of the one before is dropped.
  std::sort(resolved.begin(), resolved.end(), [](const auto& x, const auto& y) {
    return x.first.block != y.first.block ? x.first.block < y.first.block : x.first.e < y.first.e;
  });
  std::vector<Draft> drafts;
  std::vector<Move> kept;
  for (size_t k = 0; k < resolved.size(); ++k) {
    const Draft& d = resolved[k].first;
    if (!drafts.empty() && drafts.back().block == d.block &&
        (drafts.back().dead() || int64_t{d.e} < drafts.back().u))
      continue;
    drafts.push_back(d);
    kept.push_back(moves[resolved[k].second]);
  }
  Plan p = replay(P, drafts);
  std::sort(kept.begin(), kept.end(), [](const Move& a, const Move& b) {
    return a.evict_after != b.evict_after ? a.evict_after < b.evict_after : a.block < b.block;
  });
  p.moves = std::move(kept);
  return p;
}

}  // namespace spillway::policy
