// The NCCL stand-in (build/sim/libnccl.so.2) on its own: collectives and
// point-to-point calls between ranks of one process on the simulated GPU,
// buffers read through whatever backs their addresses when the kernel runs,
// and a mapping changed under a running collective reported.
#include <gtest/gtest.h>
#include <nccl.h>
#include <simnccl.h>

#include <cstring>
#include <thread>
#include <vector>

#include "sim_test_util.h"

using namespace simtest;

namespace {

// Not a datatype, but within the enum's range of values (0..15), so the
// conversion is defined.
constexpr ncclDataType_t kBadType = static_cast<ncclDataType_t>(15);

#define ASSERT_NCCL(expr) ASSERT_EQ(ncclSuccess, (expr)) << #expr

template <class T>
void put(CUdeviceptr d, const std::vector<T>& h) {
  ASSERT_CU(cuMemcpyHtoD_v2(d, h.data(), h.size() * sizeof(T)));
}
template <class T>
std::vector<T> get(CUdeviceptr d, size_t n) {
  std::vector<T> h(n);
  EXPECT_CU(cuMemcpyDtoH_v2(h.data(), d, n * sizeof(T)));
  return h;
}

class SimNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    init_primary();
    simnccl_set_delay_us(0);
    const int devs[2] = {0, 0};
    ASSERT_NCCL(ncclCommInitAll(comms_, 2, devs));
    for (auto& s : streams_) ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    for (auto s : streams_) EXPECT_CU(cuStreamSynchronize(s));
    for (auto c : comms_) {
      ncclResult_t e = ncclInternalError;
      EXPECT_NCCL_OK(c, &e);
      EXPECT_EQ(ncclSuccess, ncclCommDestroy(c));
    }
    for (auto s : streams_) EXPECT_CU(cuStreamDestroy(s));
    for (CUdeviceptr p : allocs_) EXPECT_CU(cuMemFree_v2(p));
    char buf[256];
    EXPECT_EQ(CUDA_SUCCESS, simcuda_sticky_error(0, buf, sizeof buf)) << buf;
  }
  static void EXPECT_NCCL_OK(ncclComm_t c, ncclResult_t* e) {
    EXPECT_EQ(ncclSuccess, ncclCommGetAsyncError(c, e));
    EXPECT_EQ(ncclSuccess, *e) << ncclGetErrorString(*e);
  }
  CUdeviceptr alloc(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_CU(cuMemAlloc_v2(&p, bytes));
    allocs_.push_back(p);
    return p;
  }
  void sync() {
    for (auto s : streams_) ASSERT_CU(cuStreamSynchronize(s));
  }
  ncclComm_t comms_[2] = {};
  CUstream streams_[2] = {};
  std::vector<CUdeviceptr> allocs_;
};

TEST_F(SimNccl, CommQueriesAndVersion) {
  int v = 0, n = 0, r = -1, d = -1;
  ASSERT_NCCL(ncclGetVersion(&v));
  EXPECT_EQ(NCCL_VERSION_CODE, v);
  EXPECT_EQ(NCCL_VERSION(2, 26, 5), v);
  ASSERT_NCCL(ncclCommCount(comms_[1], &n));
  ASSERT_NCCL(ncclCommUserRank(comms_[1], &r));
  ASSERT_NCCL(ncclCommCuDevice(comms_[1], &d));
  EXPECT_EQ(2, n);
  EXPECT_EQ(1, r);
  EXPECT_EQ(0, d);
  EXPECT_STREQ("no error", ncclGetErrorString(ncclSuccess));
}

TEST_F(SimNccl, AllReduceOfTwoRanksInAGroup) {
  const size_t n = 1000;
  CUdeviceptr send[2] = {alloc(n * 4), alloc(n * 4)}, recv[2] = {alloc(n * 4), alloc(n * 4)};
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f * static_cast<float>(i) + 1;
  }
  put(send[0], a);
  put(send[1], b);
  ASSERT_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclAllReduce(reinterpret_cast<void*>(send[r]), reinterpret_cast<void*>(recv[r]), n,
                              ncclFloat, ncclSum, comms_[r], streams_[r]));
  ASSERT_NCCL(ncclGroupEnd());
  sync();
  for (int r = 0; r < 2; ++r) {
    std::vector<float> got = get<float>(recv[r], n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i] + b[i], got[i]) << "rank " << r << " at " << i;
  }
}

TEST_F(SimNccl, AllReduceInPlaceMaxAndAvgWithoutAGroup) {
  const size_t n = 64;
  CUdeviceptr buf[2] = {alloc(n * 4), alloc(n * 4)};
  std::vector<int32_t> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<int32_t>(i) - 10;
    b[i] = 20 - static_cast<int32_t>(i);
  }
  put(buf[0], a);
  put(buf[1], b);
  // From one thread, one rank after the other: the first kernel waits on
  // the device for the second.
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclAllReduce(reinterpret_cast<void*>(buf[r]), reinterpret_cast<void*>(buf[r]), n,
                              ncclInt32, ncclMax, comms_[r], streams_[r]));
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclAllReduce(reinterpret_cast<void*>(buf[r]), reinterpret_cast<void*>(buf[r]), n,
                              ncclInt32, ncclAvg, comms_[r], streams_[r]));
  sync();
  for (int r = 0; r < 2; ++r) {
    std::vector<int32_t> got = get<int32_t>(buf[r], n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(std::max(a[i], b[i]), got[i]) << i;
  }
}

TEST_F(SimNccl, AllGatherReduceScatterBroadcastReduce) {
  const size_t n = 16;
  CUdeviceptr in[2] = {alloc(2 * n * 8), alloc(2 * n * 8)};
  CUdeviceptr out[2] = {alloc(2 * n * 8), alloc(2 * n * 8)};
  std::vector<uint64_t> a(2 * n), b(2 * n);
  for (size_t i = 0; i < 2 * n; ++i) {
    a[i] = i + 1;
    b[i] = 100 * (i + 1);
  }
  put(in[0], a);
  put(in[1], b);
  auto vp = [](CUdeviceptr p) { return reinterpret_cast<void*>(p); };

  ASSERT_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclAllGather(vp(in[r]), vp(out[r]), n, ncclUint64, comms_[r], streams_[r]));
  ASSERT_NCCL(ncclGroupEnd());
  sync();
  for (int r = 0; r < 2; ++r) {
    std::vector<uint64_t> got = get<uint64_t>(out[r], 2 * n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(a[i], got[i]);
      ASSERT_EQ(b[i], got[n + i]);
    }
  }

  ASSERT_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(
        ncclReduceScatter(vp(in[r]), vp(out[r]), n, ncclUint64, ncclSum, comms_[r], streams_[r]));
  ASSERT_NCCL(ncclGroupEnd());
  sync();
  for (int r = 0; r < 2; ++r) {
    std::vector<uint64_t> got = get<uint64_t>(out[r], n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[r * n + i] + b[r * n + i], got[i]);
  }

  ASSERT_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclBroadcast(r == 1 ? vp(in[r]) : nullptr, vp(out[r]), n, ncclUint64, 1, comms_[r],
                              streams_[r]));
  ASSERT_NCCL(ncclGroupEnd());
  sync();
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(std::vector<uint64_t>(b.begin(), b.begin() + n), get<uint64_t>(out[r], n));

  const std::vector<uint64_t> zeros(n, 0);
  put(out[1], zeros);
  ASSERT_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclReduce(vp(in[r]), r == 0 ? vp(out[r]) : nullptr, n, ncclUint64, ncclProd, 0,
                           comms_[r], streams_[r]));
  ASSERT_NCCL(ncclGroupEnd());
  sync();
  std::vector<uint64_t> got = get<uint64_t>(out[0], n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i] * b[i], got[i]);
  EXPECT_EQ(zeros, get<uint64_t>(out[1], n));  // not the root: untouched
}

TEST_F(SimNccl, SendAndReceiveBothWaysInOneGroup) {
  const size_t n = 256;
  CUdeviceptr s[2] = {alloc(n), alloc(n)}, r[2] = {alloc(n), alloc(n)};
  put(s[0], std::vector<uint8_t>(n, 7));
  put(s[1], std::vector<uint8_t>(n, 9));
  ASSERT_NCCL(ncclGroupStart());
  for (int k = 0; k < 2; ++k) {
    // Each rank sends first, then receives: matched in any order.
    ASSERT_NCCL(
        ncclSend(reinterpret_cast<void*>(s[k]), n, ncclUint8, 1 - k, comms_[k], streams_[k]));
    ASSERT_NCCL(
        ncclRecv(reinterpret_cast<void*>(r[k]), n, ncclUint8, 1 - k, comms_[k], streams_[k]));
  }
  ASSERT_NCCL(ncclGroupEnd());
  sync();
  EXPECT_EQ(std::vector<uint8_t>(n, 9), get<uint8_t>(r[0], n));
  EXPECT_EQ(std::vector<uint8_t>(n, 7), get<uint8_t>(r[1], n));
}

TEST_F(SimNccl, HalfAndBfloat16Sums) {
  const size_t n = 4;
  // 1.5 + 2.25 = 3.75 in both types; 1024 + 1 = 1025 in half, 1024 in bf16.
  const std::vector<uint16_t> ha = {0x3e00, 0x6400, 0x0000, 0xbc00},
                              hb = {0x4080, 0x3c00, 0x0001, 0x3c00};
  CUdeviceptr h[2] = {alloc(n * 2), alloc(n * 2)};
  put(h[0], ha);
  put(h[1], hb);
  ASSERT_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclAllReduce(reinterpret_cast<void*>(h[r]), reinterpret_cast<void*>(h[r]), n,
                              ncclFloat16, ncclSum, comms_[r], streams_[r]));
  ASSERT_NCCL(ncclGroupEnd());
  sync();
  EXPECT_EQ((std::vector<uint16_t>{0x4380, 0x6401, 0x0001, 0x0000}), get<uint16_t>(h[0], n));

  const std::vector<uint16_t> ba = {0x3fc0, 0x4480, 0x3f80}, bb = {0x4010, 0x3f80, 0xbf80};
  CUdeviceptr b[2] = {alloc(6), alloc(6)};
  put(b[0], ba);
  put(b[1], bb);
  ASSERT_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclAllReduce(reinterpret_cast<void*>(b[r]), reinterpret_cast<void*>(b[r]), 3,
                              ncclBfloat16, ncclSum, comms_[r], streams_[r]));
  ASSERT_NCCL(ncclGroupEnd());
  sync();
  EXPECT_EQ((std::vector<uint16_t>{0x4070, 0x4480, 0x0000}), get<uint16_t>(b[1], 3));
}

TEST_F(SimNccl, MisuseIsRefused) {
  CUdeviceptr p = alloc(64);
  void* vp = reinterpret_cast<void*>(p);
  EXPECT_EQ(ncclInvalidArgument,
            ncclAllReduce(vp, vp, 4, kBadType, ncclSum, comms_[0], streams_[0]));
  EXPECT_EQ(ncclInvalidArgument,
            ncclAllReduce(vp, vp, 4, ncclFloat8e4m3, ncclSum, comms_[0], streams_[0]));
  EXPECT_EQ(ncclInvalidArgument, ncclAllReduce(vp, vp, 4, ncclFloat, static_cast<ncclRedOp_t>(7),
                                               comms_[0], streams_[0]));
  EXPECT_EQ(ncclInvalidArgument, ncclBroadcast(vp, vp, 4, ncclFloat, 2, comms_[0], streams_[0]));
  EXPECT_EQ(ncclInvalidArgument,
            ncclAllReduce(nullptr, vp, 4, ncclFloat, ncclSum, comms_[0], streams_[0]));
  EXPECT_EQ(ncclInvalidArgument,
            ncclAllReduce(vp, vp, 4, ncclFloat, ncclSum, nullptr, streams_[0]));
  EXPECT_EQ(ncclInvalidUsage, ncclGroupEnd());
  // Two ranks on one stream would wait for each other for ever.
  ASSERT_NCCL(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    ASSERT_NCCL(ncclAllReduce(vp, vp, 4, ncclFloat, ncclSum, comms_[r], streams_[0]));
  EXPECT_EQ(ncclInvalidUsage, ncclGroupEnd());
  // A failed call fails its group; nothing is queued.
  ASSERT_NCCL(ncclGroupStart());
  EXPECT_EQ(ncclInvalidArgument,
            ncclAllReduce(vp, vp, 4, ncclFloat, ncclSum, nullptr, streams_[0]));
  EXPECT_EQ(ncclInvalidArgument, ncclGroupEnd());
}

TEST(SimNcclInit, InitRankFromTwoThreads) {
  init_primary();
  ncclUniqueId id;
  ASSERT_NCCL(ncclGetUniqueId(&id));
  ncclComm_t comms[2] = {};
  ncclResult_t res[2] = {ncclInternalError, ncclInternalError};
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      init_primary();
      res[r] = ncclCommInitRank(&comms[r], 2, id, r);
    });
  for (auto& t : ts) t.join();
  ASSERT_NCCL(res[0]);
  ASSERT_NCCL(res[1]);
  int rank = -1;
  ASSERT_NCCL(ncclCommUserRank(comms[1], &rank));
  EXPECT_EQ(1, rank);
  for (auto c : comms) EXPECT_EQ(ncclSuccess, ncclCommDestroy(c));
}

// ---- The buffers as the kernel finds them.

class SimNcclVmm : public ::testing::Test {
 protected:
  void SetUp() override {
    init_primary();
    ASSERT_NCCL(ncclCommInitAll(&comm_, 1, nullptr));  // one rank: a loopback
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    simnccl_set_delay_us(0);
    EXPECT_CU(cuStreamSynchronize(stream_));
    EXPECT_EQ(ncclSuccess, ncclCommDestroy(comm_));
    EXPECT_CU(cuStreamDestroy(stream_));
  }
  ncclComm_t comm_ = nullptr;
  CUstream stream_ = nullptr;
};

TEST_F(SimNcclVmm, ReadsAndWritesHostBackedBuffersThroughTheirAddresses) {
  const size_t g = granularity();
  VmmBlock src, dst;
  ASSERT_CU(map_block(&src, g, host_prop()));
  ASSERT_CU(map_block(&dst, g, host_prop()));
  std::vector<uint32_t> h(g / 4);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint32_t>(i * 2654435761u);
  put(src.ptr, h);
  ASSERT_NCCL(ncclAllReduce(reinterpret_cast<void*>(src.ptr), reinterpret_cast<void*>(dst.ptr),
                            h.size(), ncclUint32, ncclSum, comm_, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(h, get<uint32_t>(dst.ptr, h.size()));
  ncclResult_t e = ncclInternalError;
  ASSERT_NCCL(ncclCommGetAsyncError(comm_, &e));
  EXPECT_EQ(ncclSuccess, e);
  unmap_block(src);
  unmap_block(dst);
}

TEST_F(SimNcclVmm, AMappingChangedUnderARunningCollectiveIsReported) {
#ifdef SIMTEST_TSAN
  GTEST_SKIP()
      << "remaps memory a running kernel reads, unsynchronized on purpose: a race by design";
#endif
  const size_t g = granularity();
  VmmBlock buf;
  ASSERT_CU(map_block(&buf, g, device_prop()));
  std::vector<uint32_t> h(g / 4, 5);
  put(buf.ptr, h);
  const uint64_t before = simnccl_mapping_changes();
  simnccl_set_delay_us(300000);
  ASSERT_NCCL(ncclAllReduce(reinterpret_cast<void*>(buf.ptr), reinterpret_cast<void*>(buf.ptr),
                            h.size(), ncclUint32, ncclSum, comm_, stream_));
  // What an eviction does, while the kernel runs: the same bytes, now in
  // host memory, at the same address. Nothing the driver can see uses the
  // range (the kernel's pointers are in its work descriptor).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CUmemGenericAllocationHandle host = 0;
  const CUmemAllocationProp hp = host_prop();
  ASSERT_CU(cuMemCreate(&host, g, &hp, 0));
  ASSERT_CU(cuMemUnmap(buf.ptr, g));
  ASSERT_CU(cuMemMap(buf.ptr, g, 0, host, 0));
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_CU(cuMemSetAccess(buf.ptr, g, &acc, 1));
  ASSERT_CU(cuMemRelease(buf.handle));
  buf.handle = host;
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(before + 1, simnccl_mapping_changes());
  ncclResult_t e = ncclSuccess;
  ASSERT_NCCL(ncclCommGetAsyncError(comm_, &e));
  EXPECT_EQ(ncclUnhandledCudaError, e);
  unmap_block(buf);
}

}  // namespace
