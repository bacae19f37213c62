/* spillway.h: the C ABI of libspillway.so, the only symbols it exports.
 *
 * PyTorch calls the first two through its pluggable-allocator interface:
 *   torch.cuda.memory.CUDAPluggableAllocator(
 *       "/path/to/libspillway.so", "spillway_malloc", "spillway_free")
 * Nothing happens until the first call: loading the library into a process
 * that never calls it changes nothing. Configuration comes from SPILLWAY_*
 * environment variables (docs/config.md), read at the first call; a bad value
 * stops the process with a message naming the variable.
 */
#ifndef SPILLWAY_H
#define SPILLWAY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* cudaStream_t and CUstream are both `struct CUstream_st*` */

/* Allocates `size` bytes of device memory on `device` for use on `stream`.
 * Returns NULL when the memory cannot be had even after evicting everything
 * evictable (PyTorch then raises its usual out-of-memory error, and spillway
 * logs what was resident). */
void* spillway_malloc(size_t size, int device, struct CUstream_st* stream);

/* Frees a pointer returned by spillway_malloc; `size` must be the size it was
 * allocated with. A pointer spillway does not know, a double free or a size
 * mismatch is logged and ignored: nothing is freed, nothing crashes. */
void spillway_free(void* ptr, size_t size, int device, struct CUstream_st* stream);

/* spillway's version, semantic ("0.1.0"): a static string. Starts nothing. */
const char* spillway_version(void);

/* Marks the end of a training step (optional; counted in the statistics). */
void spillway_mark_step(void);

/* Writes the current counters as a JSON object into buf (at most len bytes,
 * NUL-terminated when len > 0) and returns the length the full JSON needs,
 * not counting the NUL. spillway_stats_json(NULL, 0) asks for the length. */
size_t spillway_stats_json(char* buf, size_t len);

/* Starts the recent peaks (recent_peak_live_bytes, recent_peak_resident_bytes
 * in the statistics) again from the current levels, as
 * torch.cuda.reset_peak_memory_stats does for PyTorch's peaks. The process's
 * peaks (peak_live_bytes, peak_resident_bytes: the exit summary's) stay. */
void spillway_reset_peak_stats(void);

/* Keeps the blocks under [ptr, ptr + size) resident on the device until
 * spillway_unpin is called with the same range: a block that is on the host is
 * brought back first. Pins nest; freeing a block drops its pins. Returns 0,
 * or -1 if spillway is not serving allocations (nothing to pin). */
int spillway_pin(const void* ptr, size_t size);
int spillway_unpin(const void* ptr, size_t size);

/* Starts bringing back the evicted blocks under [ptr, ptr + size) without
 * waiting: each is copied while its address still maps its host copy, and
 * moves to the device copy when it is next used (waiting for that copy alone
 * if it has not landed) or once the copy is done. A hint: blocks that do not
 * fit in the budget without evicting another stay on the host until used.
 * Returns 0, or -1 if spillway is not serving allocations. */
int spillway_prefetch(const void* ptr, size_t size);

/* Checks the SPILLWAY_* environment as the first spillway_malloc would, without
 * starting anything: returns 0 if it is valid, else 1 with the one-line message
 * the first call would print before exiting (docs/config.md) written into msg
 * (at most len bytes, NUL-terminated when len > 0). The Python bootstrap calls
 * it when torch is imported, to raise that message as an exception. */
int spillway_check_config(char* msg, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* SPILLWAY_H */
