#include "memory.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "stream.h"

namespace sim::mem {
namespace {

constexpr size_t kPage = 4096;
// Offsets into the backing memfd are never reused; the file is sparse and a
// released allocation's pages are punched out, so its size costs nothing.
constexpr uint64_t kBackingSize = 1ull << 50;

struct Physical {
  uint64_t id = 0;
  uint64_t offset = 0;  // into the backing memfd
  size_t size = 0;
  bool host = false;  // host-located (CU_MEM_LOCATION_TYPE_HOST / HOST_NUMA)
  int device = 0;     // device-located: ordinal; host-located: device whose context created it
  CUmemAllocationProp prop{};
  int mappings = 0;
  bool released = false;
  // Virtual time of its latest cuMemUnmap: the unmapping thread's clock once
  // that unmap has waited for the mapping's work (docs/sim.md, "Handing
  // physical memory between threads"). cuMemMap of it starts no earlier.
  uint64_t unmapped_at = 0;
  // Virtual time of the creating thread once cuMemCreate returned: nobody
  // can map the memory before it exists (a handle created on one thread and
  // mapped on another).
  uint64_t ready_at = 0;
};

struct Mapping {
  uintptr_t va = 0;
  size_t size = 0;
  std::shared_ptr<Physical> phys;
  unsigned long long access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  uint64_t serial = 0;  // new at every map and access change (mapping_signature)
  // Virtual end of the latest op (copy, memset, kernel) that used this
  // mapping and has really completed; cuMemUnmap starts no earlier.
  uint64_t last_use_end = 0;
};

struct Reservation {
  uintptr_t base = 0;
  size_t size = 0;
  int device = 0;
  bool classic = false;  // made by cuMemAlloc, not visible to the VMM API
  std::map<uintptr_t, Mapping> maps;
};

struct HostRange {
  uintptr_t base;
  size_t size;
  bool allocated;  // cuMemHostAlloc (we own it) vs cuMemHostRegister
};

// Residency of one granule of a managed allocation.
constexpr int kUnpopulated = -2;
constexpr int kOnHost = -1;

struct Granule {
  int where = kUnpopulated;  // device ordinal, kOnHost or kUnpopulated
  uint64_t stamp = 0;        // LRU key while device-resident
  bool read_mostly = false;
  CUmemLocation preferred{CU_MEM_LOCATION_TYPE_INVALID, 0};
  CUmemLocation last_prefetch{CU_MEM_LOCATION_TYPE_INVALID, 0};
  uint32_t accessed_by = 0;  // bit d: device d; kAccessedByHost: the host
};
constexpr uint32_t kAccessedByHost = 1u << 31;

struct Managed {
  uintptr_t base = 0;
  size_t size = 0;  // page-rounded
  uint64_t offset = 0;
  int device = 0;  // the device whose context allocated it
  std::vector<Granule> g;
};

struct DeviceUsage {
  uint64_t used = 0, peak = 0, external = 0;
};

struct Memory {
  std::mutex mu;
  Config cfg;
  int fd = -1;
  uint64_t next_offset = 0;
  uint64_t next_handle = 0xA110C000;
  uint64_t next_mapping = 1;
  std::map<uintptr_t, Reservation> reservations;  // by base
  std::unordered_map<uint64_t, std::shared_ptr<Physical>> handles;
  std::map<uintptr_t, HostRange> host_ranges;  // by base
  std::vector<DeviceUsage> dev;
  uint64_t host_used = 0, host_peak = 0;
  std::map<uintptr_t, Managed> managed;  // by base; nodes are stable
  // Per device: device-resident managed granules by last use (oldest first).
  std::vector<std::map<uint64_t, std::pair<Managed*, size_t>>> lru;
  uint64_t next_stamp = 0;
  // Host-located cuMemCreate calls, [start, end) in virtual time: one at a
  // time, and every VMM call of any thread that falls inside one waits for
  // its end (measured on an H200, docs/gpu.md check (f); docs/sim.md,
  // "Host memory creation holds the VMM calls").
  std::deque<std::pair<uint64_t, uint64_t>> creating;
  uint64_t creating_free_at = 0;
};

Memory& M() {
  static Memory* m = new Memory;  // never destroyed: workers may outlive exit
  return *m;
}

size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

Reservation* find_reservation(Memory& m, uintptr_t p) {
  auto it = m.reservations.upper_bound(p);
  if (it == m.reservations.begin()) return nullptr;
  --it;
  Reservation& r = it->second;
  return p < r.base + r.size ? &r : nullptr;
}

Mapping* find_mapping(Reservation& r, uintptr_t p) {
  auto it = r.maps.upper_bound(p);
  if (it == r.maps.begin()) return nullptr;
  --it;
  return p < it->second.va + it->second.size ? &it->second : nullptr;
}

const HostRange* find_host(Memory& m, uintptr_t p) {
  auto it = m.host_ranges.upper_bound(p);
  if (it == m.host_ranges.begin()) return nullptr;
  --it;
  return p < it->second.base + it->second.size ? &it->second : nullptr;
}

Managed* find_managed(Memory& m, uintptr_t p) {
  auto it = m.managed.upper_bound(p);
  if (it == m.managed.begin()) return nullptr;
  --it;
  return p < it->second.base + it->second.size ? &it->second : nullptr;
}

bool overlaps_host(Memory& m, uintptr_t lo, uintptr_t hi) {
  auto it = m.host_ranges.lower_bound(hi);
  if (it == m.host_ranges.begin()) return false;
  --it;
  return it->second.base + it->second.size > lo;
}

CUresult charge_device(Memory& m, int device, uint64_t bytes) {
  DeviceUsage& u = m.dev[device];
  if (u.used + u.external + bytes > m.cfg.device_memory)
    return refuse(CUDA_ERROR_OUT_OF_MEMORY,
                  "device %d out of memory: %llu used + %llu external + %llu requested > %llu",
                  device, (unsigned long long)u.used, (unsigned long long)u.external,
                  (unsigned long long)bytes, (unsigned long long)m.cfg.device_memory);
  u.used += bytes;
  u.peak = std::max(u.peak, u.used + u.external);
  return CUDA_SUCCESS;
}

CUresult charge_host(Memory& m, uint64_t bytes) {
  if (m.host_used + bytes > m.cfg.host_memory)
    return refuse(CUDA_ERROR_OUT_OF_MEMORY, "host memory cap reached: %llu used + %llu > %llu",
                  (unsigned long long)m.host_used, (unsigned long long)bytes,
                  (unsigned long long)m.cfg.host_memory);
  m.host_used += bytes;
  m.host_peak = std::max(m.host_peak, m.host_used);
  return CUDA_SUCCESS;
}

void uncharge(Memory& m, const Physical& p) {
  if (p.host)
    m.host_used -= p.size;
  else
    m.dev[p.device].used -= p.size;
}

// Returns physical memory to the system once it is neither mapped nor owned.
// A VMM call of the calling thread starts once the host creation its clock
// falls inside has ended (Memory::creating). Caller holds m.mu.
void wait_for_creation(const Memory& m) {
  const uint64_t t = clock::now();
  for (const auto& [start, end] : m.creating)
    if (start <= t && t < end) clock::advance_to(end);
}

void maybe_free(Memory& m, const std::shared_ptr<Physical>& p) {
  if (!p->released || p->mappings > 0) return;
  fallocate(m.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(p->offset),
            static_cast<off_t>(p->size));
  uncharge(m, *p);
  m.handles.erase(p->id);
}

void* map_fixed_none(uintptr_t va, size_t size) {
  return mmap(reinterpret_cast<void*>(va), size, PROT_NONE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}

int prot_of(unsigned long long access) {
  switch (access) {
    case CU_MEM_ACCESS_FLAGS_PROT_READ:
      return PROT_READ;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
      return PROT_READ | PROT_WRITE;
    default:
      return PROT_NONE;
  }
}

// Reserves VA with the requested alignment (mmap only guarantees pages).
uintptr_t reserve_va(size_t size, size_t alignment, uintptr_t hint) {
  size_t span = size + alignment;
  void* p = mmap(reinterpret_cast<void*>(hint), span, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return 0;
  uintptr_t raw = reinterpret_cast<uintptr_t>(p);
  uintptr_t base = round_up(raw, alignment);
  if (base > raw) munmap(p, base - raw);
  uintptr_t end = raw + span;
  if (end > base + size) munmap(reinterpret_cast<void*>(base + size), end - (base + size));
  return base;
}

// The mappings exactly covering [lo, hi) in one reservation, or an error:
// cuMemUnmap / cuMemSetAccess act on whole mappings only.
CUresult whole_mappings(Memory& m, uintptr_t lo, size_t size, const char* api,
                        std::vector<Mapping*>* out, Reservation** res) {
  uintptr_t hi = lo + size;
  Reservation* r = find_reservation(m, lo);
  if (!r || r->classic || size == 0 || hi > r->base + r->size)
    return refuse(CUDA_ERROR_INVALID_VALUE, "%s: [%#lx, +%zu) is not inside one VA reservation",
                  api, lo, size);
  uintptr_t at = lo;
  while (at < hi) {
    auto it = r->maps.find(at);
    if (it == r->maps.end()) {
      Mapping* inside = find_mapping(*r, at);
      if (inside)
        return refuse(CUDA_ERROR_INVALID_VALUE,
                      "%s: %#lx is inside the mapping [%#lx, +%zu); only whole mappings can be "
                      "unmapped or given access (cuda.h: cuMemUnmap)",
                      api, at, inside->va, inside->size);
      return refuse(CUDA_ERROR_INVALID_VALUE, "%s: %#lx is not mapped", api, at);
    }
    if (at + it->second.size > hi)
      return refuse(CUDA_ERROR_INVALID_VALUE,
                    "%s: range ends inside the mapping [%#lx, +%zu) (partial unmap/access)", api,
                    it->second.va, it->second.size);
    out->push_back(&it->second);
    at += it->second.size;
  }
  *res = r;
  return CUDA_SUCCESS;
}

// ---- managed memory ----

size_t granule_bytes(const Memory& m, const Managed& a, size_t i) {
  return std::min<size_t>(m.cfg.granularity, a.size - i * m.cfg.granularity);
}

// A granule no prefetch, kernel or copy populated may still have been written
// (or read) by the host: the CPU's first touch places a page in host memory.
// The host's accesses are invisible to the sim, except that they make the
// memfd pages exist; mincore tells. Reads no byte, so SIMCUDA_DATA=0 holds.
int resolve(Memory& m, Managed& a, size_t i) {
  Granule& gr = a.g[i];
  if (gr.where != kUnpopulated) return gr.where;
  const size_t bytes = granule_bytes(m, a, i);
  std::vector<unsigned char> vec((bytes + kPage - 1) / kPage);
  void* at = reinterpret_cast<void*>(a.base + i * m.cfg.granularity);
  if (mincore(at, bytes, vec.data()) == 0)
    for (unsigned char v : vec)
      if (v & 1) {
        gr.where = kOnHost;
        break;
      }
  return gr.where;
}

void stamp(Memory& m, Managed& a, size_t i) {
  Granule& gr = a.g[i];
  auto& lru = m.lru[static_cast<size_t>(gr.where)];
  if (gr.stamp) lru.erase(gr.stamp);
  gr.stamp = ++m.next_stamp;
  lru[gr.stamp] = {&a, i};
}

void leave_device(Memory& m, Managed& a, size_t i) {
  Granule& gr = a.g[i];
  m.dev[static_cast<size_t>(gr.where)].used -= granule_bytes(m, a, i);
  m.lru[static_cast<size_t>(gr.where)].erase(gr.stamp);
  gr.stamp = 0;
  gr.where = kOnHost;
}

// Makes granule i of `a` resident on `device`, evicting the least recently
// used managed granules that `pinned` does not hold (cuda.h,
// cuMemPrefetchAsync: "the Unified Memory driver may evict pages from other
// cuMemAllocManaged allocations to host memory in order to make room").
// False if the room cannot be made: the granule stays where it is.
template <class Pinned>
bool place_on_device(Memory& m, Managed& a, size_t i, int device, Pinned&& pinned, Migration* mig) {
  const uint64_t bytes = granule_bytes(m, a, i);
  DeviceUsage& u = m.dev[static_cast<size_t>(device)];
  auto& lru = m.lru[static_cast<size_t>(device)];
  // cuda.h (cuMemAllocManaged): "Device memory oversubscription is possible
  // for GPUs that have a non-zero value for ... CONCURRENT_MANAGED_ACCESS".
  const bool may_evict = m.cfg.concurrent_managed;
  auto it = lru.begin();
  while (u.used + u.external + bytes > m.cfg.device_memory) {
    while (it != lru.end() && pinned(it->second.first, it->second.second)) ++it;
    if (!may_evict || it == lru.end()) return false;
    auto [victim, vi] = it->second;
    ++it;  // leave_device erases the entry
    const uint64_t vb = granule_bytes(m, *victim, vi);
    leave_device(m, *victim, vi);
    mig->evicted += vb;
    mig->to_host += vb;
  }
  u.used += bytes;
  u.peak = std::max(u.peak, u.used + u.external);
  a.g[i].where = device;
  stamp(m, a, i);
  return true;
}

bool host_location(const CUmemLocation& l) {
  return l.type == CU_MEM_LOCATION_TYPE_HOST || l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
         l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

CUresult managed_free(Memory& m, uintptr_t base) {
  auto it = m.managed.find(base);
  if (it == m.managed.end())
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFree: %#lx freed concurrently",
                  static_cast<unsigned long>(base));
  Managed& a = it->second;
  for (size_t i = 0; i < a.g.size(); ++i)
    if (a.g[i].where >= 0) leave_device(m, a, i);
  munmap(reinterpret_cast<void*>(a.base), a.size);
  fallocate(m.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(a.offset),
            static_cast<off_t>(a.size));
  m.managed.erase(it);
  return CUDA_SUCCESS;
}

}  // namespace

void init(const Config& cfg) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  m.cfg = cfg;
  m.dev.assign(static_cast<size_t>(cfg.device_count), DeviceUsage{});
  m.lru.assign(static_cast<size_t>(cfg.device_count), {});
  if (m.fd < 0) {
    m.fd = memfd_create("simcuda-physical", MFD_CLOEXEC);
    if (m.fd >= 0 && ftruncate(m.fd, static_cast<off_t>(kBackingSize)) != 0) {
      close(m.fd);
      m.fd = -1;
    }
  }
}

CUresult address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                         unsigned long long flags) {
  Memory& m = M();
  if (!ptr || size == 0 || flags != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: null ptr, zero size or flags");
  if (alignment == 0) alignment = m.cfg.granularity;
  if ((alignment & (alignment - 1)) != 0 || size % kPage != 0 || addr % kPage != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemAddressReserve: size %zu / addr %#llx must be page multiples and "
                  "alignment %zu a power of two (cuda.h)",
                  size, addr, alignment);
  alignment = std::max(alignment, kPage);
  uintptr_t base = reserve_va(size, alignment, addr);
  if (!base) return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve: no VA for %zu", size);
  int device = 0;
  Context* ctx = nullptr;
  if (current_context(&ctx) == CUDA_SUCCESS) device = ctx->device;
  std::lock_guard lk(m.mu);
  Reservation& r = m.reservations[base];
  r.base = base;
  r.size = size;
  r.device = device;
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult address_free(CUdeviceptr ptr, size_t size) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  auto it = m.reservations.find(ptr);
  if (it == m.reservations.end() || it->second.classic || it->second.size != size)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemAddressFree: [%#llx, +%zu) is not a reservation (ptr and size must match "
                  "cuMemAddressReserve)",
                  ptr, size);
  if (!it->second.maps.empty())
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemAddressFree: reservation %#llx still has %zu mapping(s); unmap first", ptr,
                  it->second.maps.size());
  munmap(reinterpret_cast<void*>(ptr), size);
  m.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                unsigned long long flags) {
  Memory& m = M();
  if (!handle || !prop || flags != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: null argument or nonzero flags");
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: only CU_MEM_ALLOCATION_TYPE_PINNED");
  if (size == 0 || size % m.cfg.granularity != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemCreate: size %zu is not a multiple of the granularity %llu", size,
                  (unsigned long long)m.cfg.granularity);
  auto p = std::make_shared<Physical>();
  p->size = size;
  p->prop = *prop;
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (prop->location.id < 0 || prop->location.id >= m.cfg.device_count)
        return refuse(CUDA_ERROR_INVALID_DEVICE, "cuMemCreate: no device %d", prop->location.id);
      p->device = prop->location.id;
      break;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      // cuda.h: "Specifying CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as the
      // CUmemLocation::type will result in CUDA_ERROR_INVALID_VALUE."
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: HOST_NUMA_CURRENT is not allowed");
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      if (!m.cfg.host_numa_vmm)
        return refuse(CUDA_ERROR_NOT_SUPPORTED,
                      "cuMemCreate: host-located memory unsupported "
                      "(HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=0)");
      // cuda.h: HOST allocations are not IPC capable; requestedHandleTypes must be 0.
      if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return refuse(CUDA_ERROR_INVALID_VALUE,
                      "cuMemCreate: host-located memory needs requestedHandleTypes == 0");
      // The simulated machine has one NUMA node, id 0 (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID).
      if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && prop->location.id != 0)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: no host NUMA node %d",
                      prop->location.id);
      p->host = true;
      break;
    default:
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: location type %d unsupported",
                    static_cast<int>(prop->location.type));
  }
  {
    std::lock_guard lk(m.mu);
    if (m.fd < 0) return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate: no backing memfd");
    if (m.next_offset + size > kBackingSize)
      return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate: backing file exhausted");
    if (p->host) {
      // HOST allocations belong to whichever device's context made them.
      Context* ctx = nullptr;
      if (current_context(&ctx) == CUDA_SUCCESS) p->device = ctx->device;
    }
    wait_for_creation(m);
    CUresult r = p->host ? charge_host(m, size) : charge_device(m, p->device, size);
    if (r != CUDA_SUCCESS) return r;
    p->offset = m.next_offset;
    m.next_offset += size;
    p->id = m.next_handle++;
    m.handles[p->id] = p;
    *handle = p->id;
    // Pinning and clearing the pages, on the calling thread
    // (SIMCUDA_HOST_CREATE_GBPS), after any other creation: it did not go
    // faster on several threads (docs/gpu.md check (f)).
    if (p->host && m.cfg.host_create_bytes_per_ns > 0) {
      const uint64_t start = std::max(clock::now(), m.creating_free_at);
      const uint64_t end =
          start + static_cast<uint64_t>(static_cast<double>(size) / m.cfg.host_create_bytes_per_ns);
      m.creating.emplace_back(start, end);
      while (m.creating.size() > 256) m.creating.pop_front();  // only the recent past matters
      m.creating_free_at = end;
      clock::advance_to(end);
    }
    p->ready_at = clock::now();
  }
  return CUDA_SUCCESS;
}

CUresult release(CUmemGenericAllocationHandle handle) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  auto it = m.handles.find(handle);
  if (it == m.handles.end() || it->second->released)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemRelease: unknown or already released handle %#llx", handle);
  wait_for_creation(m);
  auto p = it->second;
  p->released = true;
  maybe_free(m, p);  // otherwise freed by the last cuMemUnmap (cuda.h: cuMemRelease)
  return CUDA_SUCCESS;
}

CUresult map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
             unsigned long long flags) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  if (flags != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: flags must be zero");
  if (offset != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: offset must be zero (cuda.h: cuMemMap)");
  if (size == 0 || ptr % m.cfg.granularity != 0 || size % m.cfg.granularity != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemMap: ptr %#llx and size %zu must be multiples of the granularity %llu", ptr,
                  size, (unsigned long long)m.cfg.granularity);
  auto hit = m.handles.find(handle);
  if (hit == m.handles.end() || hit->second->released)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: unknown or released handle %#llx", handle);
  auto p = hit->second;
  if (offset + size > p->size)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: size %zu exceeds the allocation (%zu)", size,
                  p->size);
  // cuda.h reads as if a part could be mapped ("offset + size must be less
  // than the size of the memory allocation"); an H100 with driver 580.159.04
  // refused the first granule of a two-granule handle with
  // CUDA_ERROR_NOT_SUPPORTED (docs/gpu.md, run 17). Stricter than the text,
  // as hardware is.
  if (size != p->size)
    return refuse(CUDA_ERROR_NOT_SUPPORTED,
                  "cuMemMap: %zu bytes of an allocation of %zu: a part of an allocation cannot "
                  "be mapped (refused on an H100, docs/gpu.md run 17)",
                  size, p->size);
  Reservation* r = find_reservation(m, ptr);
  if (!r || r->classic || ptr + size > r->base + r->size)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemMap: [%#llx, +%zu) is not inside one VA reservation (cuda.h: cuMemMap can "
                  "only create mappings on VA range reservations)",
                  ptr, size);
  // The range must be free: mapping over a mapping is an error.
  auto next = r->maps.lower_bound(ptr);
  if (next != r->maps.end() && next->second.va < ptr + size)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: [%#llx, +%zu) overlaps the mapping at %#lx",
                  ptr, size, next->second.va);
  if (Mapping* prev = find_mapping(*r, ptr))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: %#llx is inside the mapping at %#lx", ptr,
                  prev->va);
  void* got = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, m.fd,
                   static_cast<off_t>(p->offset + offset));
  if (got == MAP_FAILED) return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemMap: mmap failed");
  Mapping& mp = r->maps[ptr];
  mp.va = ptr;
  mp.size = size;
  mp.phys = p;
  mp.serial = m.next_mapping++;
  p->mappings++;
  // The memory was given up at p->unmapped_at (virtual time of the thread
  // that unmapped it), and came to exist at p->ready_at (of the thread that
  // created it); nobody can map it before then (docs/sim.md, "Handing
  // physical memory between threads").
  clock::advance_to(std::max(p->unmapped_at, p->ready_at));
  wait_for_creation(m);
  return CUDA_SUCCESS;
}

CUresult unmap(CUdeviceptr ptr, size_t size) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  std::vector<Mapping*> maps;
  Reservation* r = nullptr;
  if (CUresult e = whole_mappings(m, ptr, size, "cuMemUnmap", &maps, &r); e != CUDA_SUCCESS)
    return e;
  // Hardware may tear down a range still in use by queued work (PyTorch notes
  // cuMemUnmap "does not appear to synchronize in all cases"); refuse instead.
  std::string user;
  if (stream::pending_overlaps(ptr, ptr + size, &user))
    return refuse(CUDA_ERROR_NOT_PERMITTED,
                  "cuMemUnmap: [%#llx, +%zu) is used by pending work (%s); wait for it first", ptr,
                  size, user.c_str());
  // No work on the range is pending, so every op that used these mappings
  // has completed and noted its end (note_completed_use). The caller cannot
  // give the memory up before that end in virtual time, even if it learnt of
  // the completion from another thread; and whoever maps the memory next
  // starts no earlier than this unmap (docs/sim.md, "Handing physical memory
  // between threads").
  uint64_t last_use = 0;
  for (const Mapping* mp : maps) last_use = std::max(last_use, mp->last_use_end);
  clock::advance_to(last_use);
  wait_for_creation(m);
  const uint64_t now = clock::now();
  for (Mapping* mp : maps) {
    map_fixed_none(mp->va, mp->size);
    auto p = mp->phys;
    p->mappings--;
    p->unmapped_at = std::max(p->unmapped_at, now);
    r->maps.erase(mp->va);
    maybe_free(m, p);
  }
  return CUDA_SUCCESS;
}

void note_completed_use(const std::vector<Range>& touched, uint64_t vend) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  for (const Range& t : touched) {
    auto it = m.reservations.upper_bound(t.lo);
    if (it != m.reservations.begin()) --it;
    for (; it != m.reservations.end() && it->second.base < t.hi; ++it) {
      Reservation& r = it->second;
      if (r.base + r.size <= t.lo) continue;
      auto mi = r.maps.upper_bound(t.lo);
      if (mi != r.maps.begin()) --mi;
      for (; mi != r.maps.end() && mi->first < t.hi; ++mi) {
        Mapping& mp = mi->second;
        if (mp.va + mp.size <= t.lo) continue;
        mp.last_use_end = std::max(mp.last_use_end, vend);
      }
    }
  }
}

CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  Memory& m = M();
  if (!desc || count == 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: no descriptors");
  unsigned long long access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: only device locations are modeled");
    if (desc[i].location.id < 0 || desc[i].location.id >= m.cfg.device_count)
      return refuse(CUDA_ERROR_INVALID_DEVICE, "cuMemSetAccess: no device %d", desc[i].location.id);
    if (desc[i].flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE || desc[i].flags == 2)
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: bad flags %d",
                    static_cast<int>(desc[i].flags));
    // One address space serves every simulated device: the widest grant wins.
    access = std::max<unsigned long long>(access, desc[i].flags);
  }
  std::lock_guard lk(m.mu);
  std::vector<Mapping*> maps;
  Reservation* r = nullptr;
  if (CUresult e = whole_mappings(m, ptr, size, "cuMemSetAccess", &maps, &r); e != CUDA_SUCCESS)
    return e;
  wait_for_creation(m);
  for (Mapping* mp : maps) {
    mprotect(reinterpret_cast<void*>(mp->va), mp->size, prot_of(access));
    mp->access = access;
    mp->serial = m.next_mapping++;  // a change, even one undone later
  }
  return CUDA_SUCCESS;
}

CUresult get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  Memory& m = M();
  if (!flags || !location) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAccess: null");
  std::lock_guard lk(m.mu);
  Reservation* r = find_reservation(m, ptr);
  Mapping* mp = r ? find_mapping(*r, ptr) : nullptr;
  if (!mp) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAccess: %#llx is not mapped", ptr);
  *flags = mp->access;
  return CUDA_SUCCESS;
}

CUresult granularity(size_t* out, const CUmemAllocationProp* prop,
                     CUmemAllocationGranularity_flags option) {
  if (!out || !prop) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: null");
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: bad option");
  *out = M().cfg.granularity;
  return CUDA_SUCCESS;
}

CUresult properties_from_handle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  auto it = m.handles.find(handle);
  if (!prop || it == m.handles.end() || it->second->released)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationPropertiesFromHandle: bad handle");
  *prop = it->second->prop;
  return CUDA_SUCCESS;
}

uint64_t mapping_signature(uintptr_t lo, uintptr_t hi) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the words below
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ull;
  };
  auto it = m.reservations.upper_bound(lo);
  if (it != m.reservations.begin()) --it;
  for (; it != m.reservations.end() && it->second.base < hi; ++it) {
    const Reservation& r = it->second;
    if (r.base + r.size <= lo) continue;
    // From the last mapping starting at or below lo: a reservation (spillway's
    // arena) may hold thousands.
    auto m0 = r.maps.upper_bound(lo);
    if (m0 != r.maps.begin()) --m0;
    for (auto mi = m0; mi != r.maps.end() && mi->first < hi; ++mi) {
      const auto& [va, mp] = *mi;
      if (va + mp.size <= lo) continue;
      mix(va);
      mix(mp.size);
      mix(mp.serial);
    }
  }
  // Managed allocations are one mapping each for their whole life; their
  // migrations move pages, not addresses, and do not count.
  auto mt = m.managed.upper_bound(lo);
  if (mt != m.managed.begin()) --mt;
  for (; mt != m.managed.end() && mt->second.base < hi; ++mt)
    if (mt->second.base + mt->second.size > lo) {
      mix(mt->second.base);
      mix(mt->second.offset);
    }
  return h;
}

CUresult mem_alloc(int device, CUdeviceptr* dptr, size_t size) {
  Memory& m = M();
  if (!dptr || size == 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc: null or zero size");
  size_t bytes = round_up(size, kPage);
  std::lock_guard lk(m.mu);
  if (CUresult e = charge_device(m, device, bytes); e != CUDA_SUCCESS) return e;
  uintptr_t base = reserve_va(bytes, kPage, 0);
  void* got = base ? mmap(reinterpret_cast<void*>(base), bytes, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_FIXED, m.fd, static_cast<off_t>(m.next_offset))
                   : MAP_FAILED;
  if (got == MAP_FAILED) {
    if (base) munmap(reinterpret_cast<void*>(base), bytes);
    m.dev[device].used -= bytes;
    return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc: mmap failed");
  }
  auto p = std::make_shared<Physical>();
  p->offset = m.next_offset;
  m.next_offset += bytes;
  p->size = bytes;
  p->device = device;
  p->mappings = 1;
  p->released = true;  // owned by the mapping: freed with it
  Reservation& r = m.reservations[base];
  r.base = base;
  r.size = bytes;
  r.device = device;
  r.classic = true;
  Mapping& mp = r.maps[base];
  mp.va = base;
  mp.size = bytes;
  mp.phys = p;
  mp.serial = m.next_mapping++;
  mp.access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  *dptr = base;
  return CUDA_SUCCESS;
}

CUresult mem_free(CUdeviceptr dptr) {
  Memory& m = M();
  size_t size = 0;
  bool managed = false;
  {
    std::lock_guard lk(m.mu);
    if (auto mi = m.managed.find(dptr); mi != m.managed.end()) {
      managed = true;
      size = mi->second.size;
    } else {
      auto it = m.reservations.find(dptr);
      if (it == m.reservations.end() || !it->second.classic)
        return refuse(CUDA_ERROR_INVALID_VALUE,
                      "cuMemFree: %#llx is not a cuMemAlloc or cuMemAllocManaged pointer", dptr);
      size = it->second.size;
    }
  }
  // cuMemFree synchronizes with the device (CUDA programming guide, "implicit
  // synchronization"): wait for work that may use the range, then free.
  stream::wait_for_range(dptr, dptr + size);
  std::lock_guard lk(m.mu);
  if (managed) return managed_free(m, dptr);
  auto it = m.reservations.find(dptr);
  if (it == m.reservations.end() || !it->second.classic)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFree: %#llx freed concurrently", dptr);
  Reservation& r = it->second;
  auto p = r.maps.begin()->second.phys;
  munmap(reinterpret_cast<void*>(r.base), r.size);
  p->mappings = 0;
  m.reservations.erase(it);
  maybe_free(m, p);
  return CUDA_SUCCESS;
}

CUresult host_alloc(void** pp, size_t size, unsigned flags) {
  Memory& m = M();
  if (!pp || size == 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc: null or zero");
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (flags & ~kKnown)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc: bad flags %#x", flags);
  size_t bytes = round_up(size, kPage);
  std::lock_guard lk(m.mu);
  if (CUresult e = charge_host(m, bytes); e != CUDA_SUCCESS) return e;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    m.host_used -= bytes;
    return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc: mmap failed");
  }
  uintptr_t base = reinterpret_cast<uintptr_t>(p);
  m.host_ranges[base] = HostRange{base, bytes, true};
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult host_free(void* p) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  auto it = m.host_ranges.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.host_ranges.end() || !it->second.allocated)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost: %p is not from cuMemHostAlloc", p);
  munmap(p, it->second.size);
  m.host_used -= it->second.size;
  m.host_ranges.erase(it);
  return CUDA_SUCCESS;
}

CUresult host_register(void* p, size_t size, unsigned flags) {
  Memory& m = M();
  uintptr_t base = reinterpret_cast<uintptr_t>(p);
  if (!p || size == 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister: null or zero");
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (flags & ~kKnown) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister: bad flags");
  std::lock_guard lk(m.mu);
  if (find_reservation(m, base) || find_managed(m, base))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister: %p is device or managed memory", p);
  if (overlaps_host(m, base, base + size))
    return refuse(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                  "cuMemHostRegister: [%p, +%zu) overlaps pinned memory", p, size);
  if (CUresult e = charge_host(m, size); e != CUDA_SUCCESS) return e;
  m.host_ranges[base] = HostRange{base, size, false};
  return CUDA_SUCCESS;
}

CUresult host_unregister(void* p) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  auto it = m.host_ranges.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.host_ranges.end() || it->second.allocated)
    return refuse(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                  "cuMemHostUnregister: %p was not registered", p);
  m.host_used -= it->second.size;
  m.host_ranges.erase(it);
  return CUDA_SUCCESS;
}

CUresult get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  Memory& m = M();
  if (!free_bytes || !total_bytes) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetInfo: null");
  std::lock_guard lk(m.mu);
  const DeviceUsage& u = m.dev[device];
  uint64_t taken = std::min<uint64_t>(u.used + u.external, m.cfg.device_memory);
  *total_bytes = m.cfg.device_memory;
  *free_bytes = m.cfg.device_memory - taken;
  return CUDA_SUCCESS;
}

CUresult set_external_usage(int device, uint64_t bytes) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  if (device < 0 || device >= static_cast<int>(m.dev.size())) return CUDA_ERROR_INVALID_DEVICE;
  DeviceUsage& u = m.dev[device];
  if (u.used + bytes > m.cfg.device_memory) return CUDA_ERROR_OUT_OF_MEMORY;
  u.external = bytes;
  u.peak = std::max(u.peak, u.used + u.external);
  return CUDA_SUCCESS;
}

Located locate(uintptr_t p) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  if (Managed* a = find_managed(m, p)) {
    const Granule& gr = a->g[(p - a->base) / m.cfg.granularity];
    const bool dev = gr.where >= 0;
    return {dev ? Where::kDevice : Where::kHostMapped,
            dev ? gr.where : a->device,
            {a->base, a->base + a->size},
            true};
  }
  if (Reservation* r = find_reservation(m, p)) {
    Mapping* mp = find_mapping(*r, p);
    if (!mp) return {Where::kUnmapped, r->device, {p, p + 1}};
    return {mp->phys->host ? Where::kHostMapped : Where::kDevice,
            mp->phys->device,
            {mp->va, mp->va + mp->size}};
  }
  if (find_host(m, p)) return {Where::kPinned, 0, {p, p + 1}};
  return {Where::kPageable, 0, {p, p + 1}};
}

bool is_device_va(uintptr_t p) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  return find_reservation(m, p) != nullptr;
}

bool is_pinned_host(uintptr_t p, size_t n) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  const HostRange* h = find_host(m, p);
  return h && p + n <= h->base + h->size;
}

CUresult managed_alloc(int device, CUdeviceptr* dptr, size_t size, unsigned flags) {
  Memory& m = M();
  // cuda.h (cuMemAllocManaged): "If bytesize is 0, cuMemAllocManaged returns
  // CUDA_ERROR_INVALID_VALUE"; "flags must be one of CU_MEM_ATTACH_GLOBAL or
  // CU_MEM_ATTACH_HOST".
  if (!dptr || size == 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAllocManaged: null pointer or zero size");
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemAllocManaged: flags %#x must be CU_MEM_ATTACH_GLOBAL or "
                  "CU_MEM_ATTACH_HOST (cuda.h)",
                  flags);
  std::lock_guard lk(m.mu);
  const size_t g = m.cfg.granularity;
  const size_t bytes = round_up(size, kPage);
  if (m.fd < 0 || m.next_offset + bytes > kBackingSize)
    return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocManaged: backing file exhausted");
  // Granule-aligned, so that residency is per granularity-sized address block.
  uintptr_t base = reserve_va(bytes, g, 0);
  void* got = base ? mmap(reinterpret_cast<void*>(base), bytes, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_FIXED, m.fd, static_cast<off_t>(m.next_offset))
                   : MAP_FAILED;
  if (got == MAP_FAILED) {
    if (base) munmap(reinterpret_cast<void*>(base), bytes);
    return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocManaged: mmap failed");
  }
  Managed& a = m.managed[base];
  a.base = base;
  a.size = bytes;
  a.offset = m.next_offset;
  a.device = device;
  a.g.resize((bytes + g - 1) / g);
  m.next_offset += bytes;
  *dptr = base;
  return CUDA_SUCCESS;
}

bool is_managed_range(uintptr_t ptr, size_t count) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  Managed* a = find_managed(m, ptr);
  return a && count <= a->base + a->size - ptr;
}

Migration managed_prefetch(uintptr_t ptr, size_t count, const CUmemLocation& target) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  Migration mig;
  Managed* a = find_managed(m, ptr);
  if (!a || count == 0) return mig;  // freed since the call was validated
  const size_t g = m.cfg.granularity;
  // cuda.h: the range is "rounded down and rounded up respectively to be
  // aligned to CPU page size"; residency is per granule, so whole granules move.
  const uintptr_t hi = std::min<uintptr_t>(round_up(ptr + count, kPage), a->base + a->size);
  const size_t first = (ptr - a->base) / g, last = (hi - 1 - a->base) / g;
  CUmemLocation recorded = target;
  if (target.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
    recorded = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};  // the one simulated NUMA node
  const bool to_device = target.type == CU_MEM_LOCATION_TYPE_DEVICE;
  auto pinned = [&](const Managed* b, size_t i) { return b == a && i >= first && i <= last; };
  for (size_t i = first; i <= last; ++i) {
    Granule& gr = a->g[i];
    gr.last_prefetch = recorded;
    const uint64_t bytes = granule_bytes(m, *a, i);
    int w = resolve(m, *a, i);
    if (to_device) {
      if (w == target.id) {
        stamp(m, *a, i);
        continue;
      }
      if (w >= 0) {  // on another device: through the host (no peer copies modeled)
        leave_device(m, *a, i);
        mig.to_host += bytes;
        w = kOnHost;
      }
      // cuda.h: "If no physical memory has been allocated for this region,
      // then this memory region will be populated and mapped on the
      // destination device": no bytes to move.
      if (place_on_device(m, *a, i, target.id, pinned, &mig)) {
        if (w == kOnHost) mig.to_device += bytes;
      } else if (w == kUnpopulated) {
        gr.where = kOnHost;  // no room and nothing evictable: data stays on the host
      }
    } else if (w >= 0) {
      leave_device(m, *a, i);
      mig.to_host += bytes;
    } else {
      gr.where = kOnHost;
    }
  }
  return mig;
}

Migration managed_kernel_touch(int device, const std::vector<uintptr_t>& bases) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  Migration mig;
  std::vector<Managed*> allocs;
  for (uintptr_t b : bases)
    if (auto it = m.managed.find(b); it != m.managed.end()) allocs.push_back(&it->second);
  // What this kernel uses is not evicted to make room for itself.
  auto pinned = [&](const Managed* b, size_t) {
    return std::find(allocs.begin(), allocs.end(), b) != allocs.end();
  };
  for (Managed* a : allocs)
    for (size_t i = 0; i < a->g.size(); ++i)
      if (a->g[i].where == device) stamp(m, *a, i);
  for (Managed* a : allocs) {
    for (size_t i = 0; i < a->g.size(); ++i) {
      Granule& gr = a->g[i];
      if (gr.where == device) continue;
      const uint64_t bytes = granule_bytes(m, *a, i);
      int w = resolve(m, *a, i);
      // A host-preferred range this device is mapped to (ACCESSED_BY) is read
      // in place over the link (cuda.h, cuMemAdvise: SET_ACCESSED_BY "causes
      // the data to always be mapped in the specified processor's page
      // tables"; SET_PREFERRED_LOCATION: "If the data is already in its
      // preferred location and the faulting processor can establish a
      // mapping ..., then data migration will be avoided").
      if (host_location(gr.preferred) && (gr.accessed_by & (1u << device)) && w < 0) {
        gr.where = kOnHost;  // first touch populates at the preferred location
        mig.remote += bytes;
        continue;
      }
      if (w >= 0) {
        leave_device(m, *a, i);
        mig.to_host += bytes;
        w = kOnHost;
      }
      if (place_on_device(m, *a, i, device, pinned, &mig)) {
        if (w == kOnHost) mig.to_device += bytes;
      } else {
        // No room: the kernel reads the data where it is, it does not fail.
        gr.where = kOnHost;
        mig.remote += bytes;
      }
    }
  }
  return mig;
}

void managed_advise(uintptr_t ptr, size_t count, CUmem_advise advice, const CUmemLocation& loc) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  Managed* a = find_managed(m, ptr);
  if (!a) return;
  const size_t g = m.cfg.granularity;
  const uintptr_t hi = std::min<uintptr_t>(round_up(ptr + count, kPage), a->base + a->size);
  // Only the ACCESSED_BY advices use it, after their location was validated.
  const uint32_t bit = loc.type == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 && loc.id < 31
                           ? 1u << loc.id
                           : kAccessedByHost;
  CUmemLocation where = loc;
  if (loc.type == CU_MEM_LOCATION_TYPE_HOST) where.id = 0;  // cuda.h: id ignored
  if (loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
    where = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};
  for (size_t i = (ptr - a->base) / g; i <= (hi - 1 - a->base) / g; ++i) {
    Granule& gr = a->g[i];
    switch (advice) {
      case CU_MEM_ADVISE_SET_READ_MOSTLY:
        gr.read_mostly = true;
        break;
      case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
        gr.read_mostly = false;
        break;
      case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
        gr.preferred = where;
        break;
      case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
        gr.preferred = {CU_MEM_LOCATION_TYPE_INVALID, 0};
        break;
      case CU_MEM_ADVISE_SET_ACCESSED_BY:
        gr.accessed_by |= bit;
        break;
      case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
        gr.accessed_by &= ~bit;
        break;
    }
  }
}

CUresult managed_range_attribute(void* data, size_t size, CUmem_range_attribute attribute,
                                 uintptr_t ptr, size_t count) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  Managed* a = find_managed(m, ptr);
  if (!data || count == 0 || !a || count > a->base + a->size - ptr)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "cuMemRangeGetAttribute: null data or [%#lx, +%zu) is not managed memory",
                  static_cast<unsigned long>(ptr), count);
  const size_t g = m.cfg.granularity;
  const size_t first = (ptr - a->base) / g, last = (ptr + count - 1 - a->base) / g;
  auto same = [](const CUmemLocation& x, const CUmemLocation& y) {
    return x.type == y.type && x.id == y.id;
  };
  // The location every granule of the range agrees on, or INVALID.
  auto common = [&](CUmemLocation Granule::*field) {
    CUmemLocation l = a->g[first].*field;
    for (size_t i = first + 1; i <= last; ++i)
      if (!same(l, a->g[i].*field)) return CUmemLocation{CU_MEM_LOCATION_TYPE_INVALID, 0};
    return l;
  };
  // The legacy form: a device ordinal, CU_DEVICE_CPU for the host, or CU_DEVICE_INVALID.
  auto legacy = [](const CUmemLocation& l) -> int {
    if (l.type == CU_MEM_LOCATION_TYPE_DEVICE) return l.id;
    if (l.type == CU_MEM_LOCATION_TYPE_HOST || l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
      return CU_DEVICE_CPU;
    return CU_DEVICE_INVALID;
  };
  auto put_int = [&](int v) {
    if (size != 4)
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemRangeGetAttribute: dataSize must be 4");
    std::memcpy(data, &v, 4);
    return CUDA_SUCCESS;
  };
  auto put_type = [&](CUmemLocationType t) {
    if (size != sizeof t)
      return refuse(CUDA_ERROR_INVALID_VALUE,
                    "cuMemRangeGetAttribute: dataSize must be sizeof(CUmemLocationType)");
    std::memcpy(data, &t, sizeof t);
    return CUDA_SUCCESS;
  };
  switch (attribute) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY: {
      int all = 1;
      for (size_t i = first; i <= last; ++i) all &= a->g[i].read_mostly ? 1 : 0;
      return put_int(all);
    }
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION:
      return put_int(legacy(common(&Granule::preferred)));
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE:
      return put_type(common(&Granule::preferred).type);
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID:
      return put_int(common(&Granule::preferred).id);
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
      return put_int(legacy(common(&Granule::last_prefetch)));
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE:
      return put_type(common(&Granule::last_prefetch).type);
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID:
      return put_int(common(&Granule::last_prefetch).id);
    case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY: {
      // cuda.h: "a non-zero multiple of 4"; devices set over the whole range,
      // then CU_DEVICE_INVALID in the extra space.
      if (size == 0 || size % 4 != 0)
        return refuse(CUDA_ERROR_INVALID_VALUE,
                      "cuMemRangeGetAttribute: ACCESSED_BY needs a non-zero multiple of 4");
      uint32_t all = ~0u;
      for (size_t i = first; i <= last; ++i) all &= a->g[i].accessed_by;
      std::vector<int> out(size / 4, CU_DEVICE_INVALID);
      size_t n = 0;
      for (int d = 0; d < m.cfg.device_count && n < out.size(); ++d)
        if (all & (1u << d)) out[n++] = d;
      std::memcpy(data, out.data(), size);
      return CUDA_SUCCESS;
    }
    default:
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemRangeGetAttribute: unknown attribute %d",
                    static_cast<int>(attribute));
  }
}

uint64_t managed_device_bytes(uintptr_t ptr, size_t size) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  const size_t g = m.cfg.granularity;
  const uintptr_t hi = ptr + size;
  uint64_t total = 0;
  auto it = m.managed.upper_bound(ptr);
  if (it != m.managed.begin()) --it;
  for (; it != m.managed.end() && it->second.base < hi; ++it) {
    const Managed& a = it->second;
    for (size_t i = 0; i < a.g.size(); ++i) {
      if (a.g[i].where < 0) continue;
      const uintptr_t lo_g = a.base + i * g, hi_g = lo_g + granule_bytes(m, a, i);
      const uintptr_t lo = std::max(lo_g, ptr), h = std::min(hi_g, hi);
      if (lo < h) total += h - lo;
    }
  }
  return total;
}

bool managed_on_device(uintptr_t ptr, size_t n) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  Managed* a = find_managed(m, ptr);
  if (!a || n == 0) return false;
  const size_t g = m.cfg.granularity;
  const uintptr_t hi = std::min<uintptr_t>(ptr + n, a->base + a->size);
  for (size_t i = (ptr - a->base) / g; i <= (hi - 1 - a->base) / g; ++i)
    if (a->g[i].where >= 0) return true;
  return false;
}

Stats stats(int device) {
  Memory& m = M();
  std::lock_guard lk(m.mu);
  Stats s{};
  s.device_capacity = m.cfg.device_memory;
  if (device >= 0 && device < static_cast<int>(m.dev.size())) {
    s.device_used = m.dev[device].used + m.dev[device].external;
    s.device_peak = m.dev[device].peak;
  }
  s.host_capacity = m.cfg.host_memory;
  s.host_used = m.host_used;
  s.host_peak = m.host_peak;
  return s;
}

}  // namespace sim::mem
