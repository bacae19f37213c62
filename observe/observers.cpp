#include "observers.h"

#include "cupti_api.h"  // the driver calls' parameter structs

namespace spillway {

void Observers::on_alloc(const Allocation& a) {
  Allocation e = a;
  for (size_t i = 0; i < n_; ++i) {
    list_[i]->annotate(e);
    list_[i]->on_alloc(e);
  }
}

void Observers::on_free(const Allocation& a) {
  for (size_t i = 0; i < n_; ++i) list_[i]->on_free(a);
}

void Observers::on_access(const Access& a, const Touch* touches, size_t n) {
  for (size_t i = 0; i < n_; ++i) list_[i]->on_access(a, touches, n);
}

void Observers::on_step(uint64_t step) {
  for (size_t i = 0; i < n_; ++i) list_[i]->on_step(step);
}

void Observers::on_transfer(const Transfer& t) {
  Transfer e = t;
  for (size_t i = 0; i < n_; ++i) {
    list_[i]->annotate(e);
    list_[i]->on_transfer(e);
  }
}

void Observers::on_memory(int device, uint64_t resident, uint64_t host, uint64_t budget) {
  for (size_t i = 0; i < n_; ++i) list_[i]->on_memory(device, resident, host, budget);
}

void Observers::on_oom_avoided(int device, size_t need, size_t freed) {
  for (size_t i = 0; i < n_; ++i) list_[i]->on_oom_avoided(device, need, freed);
}

void Observers::on_own_copy(const OwnCopy& c) {
  for (size_t i = 0; i < n_; ++i) list_[i]->on_own_copy(c);
}

void Observers::internal_call(void* self, CUpti_CallbackId cbid, const CUpti_CallbackData* cb) {
  OwnCopy c;
  c.correlation = cb->correlationId;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz: {
      // The two layouts are the same: dst, src, bytes, stream.
      const auto* p = static_cast<const cuMemcpyDtoDAsync_v2_params*>(cb->functionParams);
      c.src = p->srcDevice;
      c.bytes = p->ByteCount;
      c.stream = p->hStream;
      break;
    }
    default:
      return;  // spillway queues no other work of its own
  }
  static_cast<Observers*>(self)->on_own_copy(c);
}

}  // namespace spillway
