#include "vmm.h"

#include <algorithm>

namespace spillway {

VaArena::~VaArena() {
  if (size_) CU_CALL(d_, cuMemAddressFree, base_, size_);
}

CUresult VaArena::reserve(size_t bytes, size_t floor) {
  auto round = [&](size_t n) { return (n + granule_ - 1) / granule_ * granule_; };
  bytes = round(std::max(bytes, floor));
  floor = round(floor);
  CUdeviceptr p = 0;
  CUresult r = d_.cuMemAddressReserve(&p, bytes, granule_, 0, 0);
  while (r == CUDA_ERROR_OUT_OF_MEMORY && bytes > floor) {
    bytes = std::max(round(bytes / 2), floor);
    r = d_.cuMemAddressReserve(&p, bytes, granule_, 0, 0);
  }
  if (r != CUDA_SUCCESS)
    return cu::checked(d_, "cuMemAddressReserve", r, &p, bytes, granule_, 0, 0);
  base_ = p;
  size_ = bytes;
  free_.give(base_, size_);
  return CUDA_SUCCESS;
}

void FreeRanges::insert(uintptr_t p, size_t n) {
  by_addr_[p] = n;
  by_size_.emplace(n, p);
}

void FreeRanges::erase(std::map<uintptr_t, size_t>::iterator it) {
  auto [lo, hi] = by_size_.equal_range(it->second);
  for (auto s = lo; s != hi; ++s) {
    if (s->second == it->first) {
      by_size_.erase(s);
      break;
    }
  }
  by_addr_.erase(it);
}

uintptr_t FreeRanges::take(size_t size) {
  auto s = by_size_.lower_bound(size);
  if (s == by_size_.end()) return 0;
  uintptr_t p = s->second;
  size_t n = s->first;
  erase(by_addr_.find(p));
  if (n > size) insert(p + size, n - size);
  free_bytes_ -= size;
  return p;
}

void FreeRanges::give(uintptr_t p, size_t n) {
  free_bytes_ += n;
  auto next = by_addr_.find(p + n);
  if (next != by_addr_.end()) {
    n += next->second;
    erase(next);
  }
  auto it = by_addr_.lower_bound(p);
  if (it != by_addr_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == p) {
      p = prev->first;
      n += prev->second;
      erase(prev);
    }
  }
  insert(p, n);
}

PhysPool::~PhysPool() {
  trim(SIZE_MAX);
}

CUresult PhysPool::take(size_t size, CUmemGenericAllocationHandle* out, uintptr_t* va) {
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    *out = it->second.back();
    it->second.pop_back();
    pooled_ -= size;
  } else {
    if (CUresult r = CU_CALL(d_, cuMemCreate, out, size, &prop_, 0); r != CUDA_SUCCESS) return r;
    held_ += size;
    ++creates_;
    uintptr_t at = 0;
    if (stage_on_create_) {
      if (CUresult r = stage(*out, size, &at); r != CUDA_SUCCESS) {
        drop(*out, size);
        return r;
      }
    }
    if (va) *va = at;
    return CUDA_SUCCESS;
  }
  if (va) {
    auto s = stage_of_.find(*out);
    *va = s == stage_of_.end() ? 0 : s->second;
  }
  return CUDA_SUCCESS;
}

CUresult PhysPool::stage(CUmemGenericAllocationHandle h, size_t size, uintptr_t* va) {
  if (auto s = stage_of_.find(h); s != stage_of_.end()) {
    *va = s->second;
    return CUDA_SUCCESS;
  }
  const uintptr_t at = stage_in_ ? stage_in_->take(size) : 0;
  if (!at) return CUDA_ERROR_OUT_OF_MEMORY;
  if (CUresult r = map_rw(d_, at, size, h, device_); r != CUDA_SUCCESS) {
    stage_in_->give(at, size);
    return r;
  }
  stage_of_[h] = at;
  *va = at;
  return CUDA_SUCCESS;
}

bool PhysPool::release(CUmemGenericAllocationHandle h, size_t size) {
  // A staging mapping that cannot be undone keeps its handle (and VA): the
  // handle is not released under a live mapping.
  if (auto s = stage_of_.find(h); s != stage_of_.end()) {
    if (CU_CALL(d_, cuMemUnmap, s->second, size) != CUDA_SUCCESS) return false;
    stage_in_->give(s->second, size);
    stage_of_.erase(s);
  }
  return drop(h, size);
}

bool PhysPool::drop(CUmemGenericAllocationHandle h, size_t size) {
  if (CU_CALL(d_, cuMemRelease, h) == CUDA_SUCCESS) {
    held_ -= size;
    return true;
  }
  // The driver still holds it: it stays counted, so that the budget sees
  // it, and is released at the next trim (docs/reliability.md).
  unreleased_.emplace_back(h, size);
  return false;
}

size_t PhysPool::trim(size_t want, size_t keep) {
  size_t freed = 0;
  // Handles whose release the driver refused before: tried again first.
  if (!unreleased_.empty()) {
    std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> retry;
    retry.swap(unreleased_);
    for (auto [h, size] : retry)
      if (drop(h, size)) freed += size;
  }
  for (auto it = free_.begin(); it != free_.end() && freed < want;) {
    auto& v = it->second;
    const size_t floor = it->first == keep ? 1 : 0;
    while (v.size() > floor && freed < want) {
      const CUmemGenericAllocationHandle h = v.back();
      v.pop_back();
      pooled_ -= it->first;
      // One that cannot go stays held (counted): see release().
      if (release(h, it->first)) freed += it->first;
    }
    it = v.empty() ? free_.erase(it) : std::next(it);
  }
  return freed;
}

CUresult map_rw(const cu::Driver& d, uintptr_t va, size_t size, CUmemGenericAllocationHandle h,
                int device) {
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = device;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  // Tried twice: a failure the driver does not repeat then costs a call,
  // not an allocation or a swap (docs/reliability.md, "Driver failures").
  CUresult r = CUDA_SUCCESS;
  for (int attempt = 0; attempt < 2; ++attempt) {
    r = CU_CALL(d, cuMemMap, va, size, 0, h, 0);
    if (r != CUDA_SUCCESS) continue;
    r = CU_CALL(d, cuMemSetAccess, va, size, &acc, 1);
    if (r == CUDA_SUCCESS) break;
    CU_CALL(d, cuMemUnmap, va, size);
  }
  return r;
}

}  // namespace spillway
