/* abi_probe: drives the C ABI of libspillway.so from a process of its own,
 * for tests/shim/test_abi.cpp.
 *
 *   abi_probe LIB CMD ARGS... [CMD ARGS...]...
 *
 * Loads LIB with dlopen (nothing else: no RPATH, so the shim finds
 * libcuda.so.1 only where the environment says), prints "loaded", then runs
 * the commands in order, printing one line on stdout for each. Pointers live
 * in slots named by one lowercase letter. Sizes are decimal bytes.
 *
 *   malloc S SIZE      spillway_malloc(SIZE, 0, NULL)  -> "malloc S PTR" or "malloc S null"
 *   free S SIZE        spillway_free(slot S, SIZE, 0, NULL) -> "free S PTR"
 *   free_on S SIZE D   spillway_free(slot S, SIZE, D, NULL) -> "free_on S PTR D"
 *   free_unknown SIZE  frees 0x1000, never returned -> "free_unknown 0x1000"
 *   free_inner S SIZE  frees slot S + 512 (inside a block) -> "free_inner S PTR"
 *   fill S SIZE SEED   writes a pattern with cuMemcpyHtoD -> "fill S ok" or "fill S err CODE"
 *   check S SIZE SEED  reads it back with cuMemcpyDtoH -> "check S ok",
 *                      "check S mismatch OFFSET" or "check S err CODE"
 *   sim_mem            the simulated driver's memory counters for device 0
 *                      (simcuda_get_memory_stats) -> "sim_mem DEVICE_USED DEVICE_PEAK HOST_USED"
 *   external BYTES     simcuda_set_external_usage(0, BYTES): device memory
 *                      taken by "another process" -> "external ok" or "external err CODE"
 *   step               spillway_mark_step() -> "step"
 *   stats              spillway_stats_json -> "stats JSON"
 *   ahead MS           polls the statistics for up to MS ms until host memory
 *                      was created ahead of evictions -> "ahead BYTES" (0: none)
 *   stats_len          spillway_stats_json(NULL, 0) -> "stats_len N"
 *   stats_trunc N      spillway_stats_json into an N-byte buffer followed by
 *                      16 guard bytes -> "stats_trunc RET GUARD_INTACT TERMINATED CONTENT"
 *                      (GUARD_INTACT 1: nothing written past N bytes;
 *                      TERMINATED 1: a NUL within the N bytes; CONTENT: the
 *                      string, when terminated)
 *
 * fill, check, sim_mem and external use libcuda.so.1 as the shim loaded it (RTLD_NOLOAD) on the
 * calling thread, whose context the shim made current at the first malloc.
 *
 * Exit status: 0 after the last command, 3 for a usage error, 4 if LIB or
 * one of its symbols cannot be had, 5 if fill/check find no driver. Exit
 * happens by returning from main, so atexit handlers run.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <simcuda.h>
#include <spillway.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef __typeof__(spillway_malloc)* malloc_fn;
typedef __typeof__(spillway_free)* free_fn;
typedef __typeof__(spillway_mark_step)* step_fn;
typedef __typeof__(spillway_stats_json)* stats_fn;
typedef __typeof__(cuMemcpyHtoD)* htod_fn;
typedef __typeof__(cuMemcpyDtoH)* dtoh_fn;
typedef __typeof__(simcuda_get_memory_stats)* memstats_fn;
typedef __typeof__(simcuda_set_external_usage)* external_fn;

static malloc_fn p_malloc;
static free_fn p_free;
static step_fn p_step;
static stats_fn p_stats;
static void* slots[26];

static int usage(const char* why) {
  fprintf(stderr, "abi_probe: %s\n", why);
  return 3;
}

static void* sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "abi_probe: no symbol %s\n", name);
    exit(4);
  }
  return p;
}

static int slot_index(const char* s) {
  if (!s || s[0] < 'a' || s[0] > 'z' || s[1] != '\0') return -1;
  return s[0] - 'a';
}

static int parse_size(const char* s, size_t* out) {
  char* end = NULL;
  if (!s || !*s) return 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end != '\0') return 0;
  *out = (size_t)v;
  return 1;
}

static unsigned char pattern(size_t i, unsigned seed) {
  uint32_t x = (uint32_t)i * 2654435761u + seed * 40503u;
  return (unsigned char)((x >> 13) ^ (x >> 24) ^ seed);
}

/* The shim's libcuda.so.1, already loaded by the first malloc. */
static void* driver(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) {
    fprintf(stderr, "abi_probe: libcuda.so.1 is not loaded\n");
    exit(5);
  }
  return h;
}

static void fill(int s, size_t size, unsigned seed) {
  htod_fn htod = (htod_fn)sym(driver(), "cuMemcpyHtoD_v2");
  unsigned char* buf = malloc(size);
  for (size_t i = 0; i < size; ++i) buf[i] = pattern(i, seed);
  CUresult r = htod((CUdeviceptr)(uintptr_t)slots[s], buf, size);
  free(buf);
  if (r == CUDA_SUCCESS)
    printf("fill %c ok\n", 'a' + s);
  else
    printf("fill %c err %d\n", 'a' + s, (int)r);
}

static void check(int s, size_t size, unsigned seed) {
  dtoh_fn dtoh = (dtoh_fn)sym(driver(), "cuMemcpyDtoH_v2");
  unsigned char* buf = malloc(size);
  memset(buf, 0, size);
  CUresult r = dtoh(buf, (CUdeviceptr)(uintptr_t)slots[s], size);
  if (r != CUDA_SUCCESS) {
    printf("check %c err %d\n", 'a' + s, (int)r);
  } else {
    size_t i = 0;
    while (i < size && buf[i] == pattern(i, seed)) ++i;
    if (i == size)
      printf("check %c ok\n", 'a' + s);
    else
      printf("check %c mismatch %zu\n", 'a' + s, i);
  }
  free(buf);
}

static void sim_mem(void) {
  memstats_fn get = (memstats_fn)sym(driver(), "simcuda_get_memory_stats");
  simcuda_memory_stats m;
  memset(&m, 0, sizeof m);
  get(0, &m);
  printf("sim_mem %llu %llu %llu\n", (unsigned long long)m.device_used,
         (unsigned long long)m.device_peak, (unsigned long long)m.host_used);
}

static void stats_trunc(size_t n) {
  const size_t guard = 16;
  char* buf = malloc(n + guard);
  memset(buf, '#', n + guard);
  size_t ret = p_stats(buf, n);
  int intact = 1;
  for (size_t i = n; i < n + guard; ++i) intact &= buf[i] == '#';
  int terminated = n > 0 && memchr(buf, '\0', n) != NULL;
  printf("stats_trunc %zu %d %d %s\n", ret, intact, terminated, terminated ? buf : "");
  free(buf);
}

/* The statistics JSON, malloc'ed (the caller frees it). */
static char* stats_text(void) {
  size_t n = p_stats(NULL, 0);
  char* buf = malloc(n + 1);
  p_stats(buf, n + 1);
  return buf;
}

/* Polls the statistics for up to `ms` milliseconds until the background
   thread has created host memory ahead of evictions (SPILLWAY_HOST_RESERVE),
   and returns how much (0: none in that time). */
static unsigned long long wait_for_host_created_ahead(unsigned ms) {
  static const char kKey[] = "\"host_bytes_created_ahead\":";
  unsigned long long ahead = 0;
  for (unsigned waited = 0;; waited += 5) {
    char* buf = stats_text();
    const char* at = strstr(buf, kKey);
    ahead = at ? strtoull(at + sizeof kKey - 1, NULL, 10) : 0;
    free(buf);
    if (ahead > 0 || waited >= ms) return ahead;
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive an _Exit in the shim */
  if (argc < 2) return usage("usage: abi_probe LIB CMD ARGS...");
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "abi_probe: cannot load %s: %s\n", argv[1], dlerror());
    return 4;
  }
  p_malloc = (malloc_fn)sym(lib, "spillway_malloc");
  p_free = (free_fn)sym(lib, "spillway_free");
  p_step = (step_fn)sym(lib, "spillway_mark_step");
  p_stats = (stats_fn)sym(lib, "spillway_stats_json");
  printf("loaded\n");

  for (int i = 2; i < argc;) {
    const char* cmd = argv[i++];
    const char* a1 = i < argc ? argv[i] : NULL;
    const char* a2 = i + 1 < argc ? argv[i + 1] : NULL;
    const char* a3 = i + 2 < argc ? argv[i + 2] : NULL;
    size_t size = 0, seed = 0;
    int s = slot_index(a1);
    if (strcmp(cmd, "malloc") == 0) {
      if (s < 0 || !parse_size(a2, &size)) return usage("malloc SLOT SIZE");
      slots[s] = p_malloc(size, 0, NULL);
      if (slots[s])
        printf("malloc %c %p\n", 'a' + s, slots[s]);
      else
        printf("malloc %c null\n", 'a' + s);
      i += 2;
    } else if (strcmp(cmd, "free") == 0) {
      if (s < 0 || !parse_size(a2, &size)) return usage("free SLOT SIZE");
      p_free(slots[s], size, 0, NULL);
      printf("free %c %p\n", 'a' + s, slots[s]);
      i += 2;
    } else if (strcmp(cmd, "free_on") == 0) {
      size_t device = 0;
      if (s < 0 || !parse_size(a2, &size) || !parse_size(a3, &device))
        return usage("free_on SLOT SIZE DEVICE");
      p_free(slots[s], size, (int)device, NULL);
      printf("free_on %c %p %zu\n", 'a' + s, slots[s], device);
      i += 3;
    } else if (strcmp(cmd, "free_unknown") == 0) {
      if (!parse_size(a1, &size)) return usage("free_unknown SIZE");
      void* p = (void*)(uintptr_t)0x1000;
      p_free(p, size, 0, NULL);
      printf("free_unknown %p\n", p);
      i += 1;
    } else if (strcmp(cmd, "free_inner") == 0) {
      if (s < 0 || !parse_size(a2, &size)) return usage("free_inner SLOT SIZE");
      void* p = (char*)slots[s] + 512;
      p_free(p, size, 0, NULL);
      printf("free_inner %c %p\n", 'a' + s, p);
      i += 2;
    } else if (strcmp(cmd, "fill") == 0 || strcmp(cmd, "check") == 0) {
      if (s < 0 || !parse_size(a2, &size) || !parse_size(a3, &seed))
        return usage("fill|check SLOT SIZE SEED");
      if (cmd[0] == 'f')
        fill(s, size, (unsigned)seed);
      else
        check(s, size, (unsigned)seed);
      i += 3;
    } else if (strcmp(cmd, "sim_mem") == 0) {
      sim_mem();
    } else if (strcmp(cmd, "external") == 0) {
      if (!parse_size(a1, &size)) return usage("external BYTES");
      CUresult r = ((external_fn)sym(driver(), "simcuda_set_external_usage"))(0, size);
      if (r == CUDA_SUCCESS)
        printf("external ok\n");
      else
        printf("external err %d\n", (int)r);
      i += 1;
    } else if (strcmp(cmd, "step") == 0) {
      p_step();
      printf("step\n");
    } else if (strcmp(cmd, "stats") == 0) {
      char* buf = stats_text();
      printf("stats %s\n", buf);
      free(buf);
    } else if (strcmp(cmd, "ahead") == 0) {
      if (!parse_size(a1, &size)) return usage("ahead MS");
      printf("ahead %llu\n", wait_for_host_created_ahead((unsigned)size));
      i += 1;
    } else if (strcmp(cmd, "stats_len") == 0) {
      printf("stats_len %zu\n", p_stats(NULL, 0));
    } else if (strcmp(cmd, "stats_trunc") == 0) {
      if (!parse_size(a1, &size)) return usage("stats_trunc N");
      stats_trunc(size);
      i += 1;
    } else {
      fprintf(stderr, "abi_probe: unknown command %s\n", cmd);
      return 3;
    }
  }
  return 0;
}
