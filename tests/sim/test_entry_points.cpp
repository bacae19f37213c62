// The simulator exports what spillway resolves, under the names and versions
// the real driver and CUPTI use, and nothing else.
//
// Build-time check: the tables below include the shim's own lists of entry
// points. For the driver, `&name` is taken after cuda.h's macros have turned a
// base name into its versioned symbol (cuMemcpyHtoDAsync -> cuMemcpyHtoDAsync_v2,
// cuMemFree -> cuMemFree_v2), and sim_tests links build/sim/libcuda.so.1: an
// entry the shim uses that the simulator does not export fails the LINK of
// this test binary. For CUPTI, `decltype(&name)` makes a misspelt name in the
// .def fail to COMPILE; the export itself is checked at run time with dlsym.
#include <cupti.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "sim_test_extra.h"

#ifndef SIM_CUDA_PATH
#error "SIM_CUDA_PATH must name build/sim/libcuda.so.1 (tests/sim/CMakeLists.txt)"
#endif
#ifndef SIM_CUPTI_PATH
#error "SIM_CUPTI_PATH must name build/sim/libcupti.so.13 (tests/sim/CMakeLists.txt)"
#endif

namespace {

struct DriverEntry {
  const char* base;  // what spillway passes to cuGetProcAddress
  void* fn;          // the versioned symbol cuda.h maps it to
};

#define DRIVER_ENTRY_POINT(name) {#name, reinterpret_cast<void*>(&name)},
const DriverEntry kDriverEntries[] = {
#include "driver_entry_points.def"
};
#undef DRIVER_ENTRY_POINT

// Each entry is a lambda so that a static_assert can check the name is a
// function cupti.h declares.
#define CUPTI_ENTRY_POINT(name)                                                       \
  [] {                                                                                \
    static_assert(std::is_function_v<std::remove_pointer_t<decltype(&name)>>, #name); \
    return #name;                                                                     \
  }(),
const char* const kCuptiEntries[] = {
#include "cupti_entry_points.def"
};
#undef CUPTI_ENTRY_POINT

constexpr int kCudaVersion = 13000;

}  // namespace

// cuda.h cuGetProcAddress: "if the specified CUDA version is greater than or
// equal to the CUDA version in which the driver symbol was introduced, this
// API will return the function pointer to the corresponding versioned
// function" and sets CU_GET_PROC_ADDRESS_SUCCESS.
TEST(SimEntryPoints, EveryShimDriverEntryResolvesToItsVersionedSymbol) {
  ASSERT_GT(std::size(kDriverEntries), 10u);
  for (const DriverEntry& e : kDriverEntries) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_CU(cuGetProcAddress_v2(e.base, &p, kCudaVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status))
        << e.base;
    EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, status) << e.base;
    EXPECT_EQ(e.fn, p) << e.base;
    // Legacy-stream lookup gives the same pointer (no per-thread variant).
    void* legacy = nullptr;
    EXPECT_CU(cuGetProcAddress_v2(e.base, &legacy, kCudaVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                                  nullptr))
        << e.base;
    EXPECT_EQ(e.fn, legacy) << e.base;
  }
}

// cuda.h (cuGetProcAddress): "The API will return CUDA_SUCCESS and set the
// returned pfn to NULL if ... the driver symbol is invalid", with
// CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: "The requested symbol was not found".
// (The shim treats a non-success result the same way, in case a driver
// answers CUDA_ERROR_NOT_FOUND instead.)
TEST(SimEntryPoints, UnknownSymbolIsNotFound) {
  void* p = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(CUDA_SUCCESS, cuGetProcAddress_v2("cuNoSuchFunction", &p, kCudaVersion,
                                              CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, status);
  EXPECT_EQ(nullptr, p);
  // A versioned name is not a base name.
  status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(CUDA_SUCCESS, cuGetProcAddress_v2("cuMemcpyHtoDAsync_v2", &p, kCudaVersion,
                                              CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, status);
}

// CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: "The requested symbol was found
// but is not supported by cudaVersion specified" (cuMemCreate is CUDA 10.2).
TEST(SimEntryPoints, VersionTooOldIsVersionNotSufficient) {
  void* p = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult r = cuGetProcAddress_v2("cuMemCreate", &p, 10000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  EXPECT_EQ(CUDA_SUCCESS, r);
  EXPECT_EQ(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, status);
  EXPECT_EQ(nullptr, p);
  // The version it appeared in is enough.
  EXPECT_CU(cuGetProcAddress_v2("cuMemCreate", &p, 10020, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, status);
  EXPECT_EQ(reinterpret_cast<void*>(&cuMemCreate), p);
}

// cuda.h cuGetProcAddress: "If the specified CUDA version is greater than the
// driver version, the API will return CUDA_ERROR_INVALID_VALUE."
TEST(SimEntryPoints, VersionNewerThanDriverIsInvalidValue) {
  int driver = 0;
  ASSERT_CU(cuDriverGetVersion(&driver));
  void* p = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress_v2("cuMemCreate", &p, driver + 1000,
                                                          CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
}

// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: "will enable the search for
// all driver symbols that match the requested driver symbol name including
// the per-thread versions. If a per-thread version is not found, the API will
// return the legacy version of the driver function."
TEST(SimEntryPoints, PerThreadDefaultStreamGivesPtszVariant) {
  void* ptsz = dlsym(RTLD_DEFAULT, "cuMemcpyHtoDAsync_v2_ptsz");
  ASSERT_NE(nullptr, ptsz) << dlerror();
  void* p = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ASSERT_CU(cuGetProcAddress_v2("cuMemcpyHtoDAsync", &p, kCudaVersion,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, status);
  EXPECT_EQ(ptsz, p);
  void* def = nullptr;
  ASSERT_CU(cuGetProcAddress_v2("cuMemcpyHtoDAsync", &def, kCudaVersion,
                                CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
  EXPECT_NE(def, p);
  EXPECT_EQ(reinterpret_cast<void*>(&cuMemcpyHtoDAsync_v2), def);
  // The synchronous variant is _ptds.
  void* ptds = dlsym(RTLD_DEFAULT, "cuMemcpyHtoD_v2_ptds");
  ASSERT_NE(nullptr, ptds);
  ASSERT_CU(cuGetProcAddress_v2("cuMemcpyHtoD", &p, kCudaVersion,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  EXPECT_EQ(ptds, p);
  // No per-thread variant: the legacy one.
  ASSERT_CU(cuGetProcAddress_v2("cuMemCreate", &p, kCudaVersion,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  EXPECT_EQ(reinterpret_cast<void*>(&cuMemCreate), p);
}

// Every CUPTI function spillway resolves is exported by the CUPTI stand-in.
TEST(SimEntryPoints, EveryShimCuptiEntryIsExported) {
  ASSERT_GT(std::size(kCuptiEntries), 5u);
  void* lib = dlopen(SIM_CUPTI_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(nullptr, lib) << "dlopen(" << SIM_CUPTI_PATH << "): " << dlerror();
  for (const char* name : kCuptiEntries) EXPECT_NE(nullptr, dlsym(lib, name)) << name;
  dlclose(lib);
}

namespace {

// The defined, non-local dynamic symbols of an ELF shared object.
std::vector<std::string> exported_symbols(const char* path, std::string* error) {
  std::vector<std::string> out;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = std::string("cannot open ") + path;
    return out;
  }
  struct stat st {};
  fstat(fd, &st);
  void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    *error = "mmap failed";
    return out;
  }
  const auto* base = static_cast<const unsigned char*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (std::string_view(reinterpret_cast<const char*>(eh->e_ident), 4) != ELFMAG ||
      eh->e_ident[EI_CLASS] != ELFCLASS64) {
    *error = "not a 64-bit ELF file";
  } else {
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; ++i) {
      if (sh[i].sh_type != SHT_DYNSYM) continue;
      const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
      const char* strtab = reinterpret_cast<const char*>(base + sh[sh[i].sh_link].sh_offset);
      const size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
      for (size_t j = 0; j < n; ++j) {
        if (syms[j].st_shndx == SHN_UNDEF || ELF64_ST_BIND(syms[j].st_info) == STB_LOCAL) continue;
        out.emplace_back(strtab + syms[j].st_name);
      }
    }
  }
  munmap(map, static_cast<size_t>(st.st_size));
  return out;
}

}  // namespace

// libcuda.so.1 exports the driver API (cu*) and the sim's own API (simcuda_*),
// nothing else: no C++ runtime or internal symbol a real driver would not
// have, which could interpose on the process.
TEST(SimEntryPoints, LibcudaExportsOnlyCuAndSimcudaSymbols) {
  std::string error;
  std::vector<std::string> syms = exported_symbols(SIM_CUDA_PATH, &error);
  ASSERT_TRUE(error.empty()) << error;
  bool has_init = false, has_sim = false;
  for (const std::string& s : syms) {
    // Driver API names are cu + an upper-case letter (cuInit, cuMemCreate).
    const bool ok = (s.size() > 2 && s.starts_with("cu") && s[2] >= 'A' && s[2] <= 'Z') ||
                    s.starts_with("simcuda_");
    EXPECT_TRUE(ok) << "unexpected export from " << SIM_CUDA_PATH << ": " << s;
    has_init = has_init || s == "cuInit";
    has_sim = has_sim || s == "simcuda_now_ns";
  }
  EXPECT_TRUE(has_init) << "the symbol table was not read";
  EXPECT_TRUE(has_sim);
}

// Every driver export is an entry point SIMCUDA_CALL_NS can name (the sim
// resolves those names through its cuGetProcAddress table): cuInit accepts
// a SIMCUDA_CALL_NS that lists them all by exported name.
TEST(SimEntryPoints, EveryDriverExportCanBeGivenACost) {
  std::string error;
  std::vector<std::string> syms = exported_symbols(SIM_CUDA_PATH, &error);
  ASSERT_TRUE(error.empty()) << error;
  std::string spec;
  size_t n = 0;
  for (const std::string& s : syms) {
    if (!s.starts_with("cu")) continue;
    spec += (spec.empty() ? "" : ",") + s + ":600";
    ++n;
  }
  ASSERT_GT(n, 100u) << "the symbol table was not read";
  simtest::run_isolated({{"SIMCUDA_CALL_NS", spec.c_str()}}, [] {
    testing::internal::CaptureStderr();
    const CUresult r = cuInit(0);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(CUDA_SUCCESS, r) << err;
    int count = 0;
    const uint64_t t0 = simcuda_now_ns();
    EXPECT_CU(cuDeviceGetCount(&count));
    EXPECT_EQ(600u, simcuda_now_ns() - t0);
  });
}
