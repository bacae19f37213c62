// A program linked against libspillway.so before libnccl.so.2, as a job
// looks with libspillway.so preloaded (or linked without libnccl.so.2 at
// all, "nonccl"). Prints what test_nccl_preload.cpp checks.
//   nccl_probe nonccl   : calls ncclAllReduce with no NCCL loaded
//   nccl_probe evicted  : a 1-rank ncclAllReduce on a block spillway evicted
#include <cuda.h>
#include <nccl.h>
#include <spillway.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[maybe_unused]] long long counter(const char* key) {
  char buf[8192];
  spillway_stats_json(buf, sizeof buf);
  const std::string json(buf), k = std::string("\"") + key + "\":";
  const size_t at = json.find(k);
  return at == std::string::npos ? -1 : std::stoll(json.substr(at + k.size()));
}

#ifndef PROBE_WITHOUT_NCCL
int evicted() {
  CUcontext ctx;
  CUdevice dev;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx))
    return 10;
  const size_t bytes = 4u << 20, n = bytes / 4;
  void* a = spillway_malloc(bytes, 0, nullptr);
  if (!a) return 11;
  std::vector<uint32_t> h(n), got(n);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<uint32_t>(i * 7 + 1);
  if (cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(a), h.data(), bytes)) return 12;
  // The budget holds two blocks: three more push `a` (the oldest) out.
  void* more[3];
  for (auto& p : more)
    if (!(p = spillway_malloc(bytes, 0, nullptr))) return 13;
  std::printf("evicted=%lld\n", counter("blocks_evicted"));
  ncclComm_t comm;
  if (ncclCommInitAll(&comm, 1, nullptr) != ncclSuccess) return 14;
  const long long before = counter("blocks_restored");
  ncclResult_t r = ncclAllReduce(a, a, n, ncclUint32, ncclSum, comm, nullptr);
  std::printf("result=%d\n", static_cast<int>(r));
  std::printf("restored_by_call=%lld\n", counter("blocks_restored") - before);
  if (cuStreamSynchronize(nullptr)) return 15;
  if (cuMemcpyDtoH_v2(got.data(), reinterpret_cast<CUdeviceptr>(a), bytes)) return 16;
  std::printf("bytes_ok=%d\n", got == h ? 1 : 0);
  ncclCommDestroy(comm);
  for (auto p : more) spillway_free(p, bytes, 0, nullptr);
  spillway_free(a, bytes, 0, nullptr);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "nonccl") == 0) {
    int x = 0;
    std::printf("result=%d\n",
                static_cast<int>(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, nullptr, nullptr)));
    std::printf("group=%d\n", static_cast<int>(ncclGroupStart()));
    return 0;
  }
#ifndef PROBE_WITHOUT_NCCL
  if (argc == 2 && std::strcmp(argv[1], "evicted") == 0) return evicted();
#endif
  std::fprintf(stderr, "usage: nccl_probe nonccl|evicted\n");
  return 2;
}
