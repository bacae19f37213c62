/* simnccl.h: the sim-only API of the NCCL stand-in (build/sim/libnccl.so.2).
 * Nothing here exists in the real NCCL. See docs/nccl.md.
 */
#ifndef SIMNCCL_H
#define SIMNCCL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Real (wall-clock) time each collective kernel spends between taking its
 * snapshot of its buffers' mappings and reaching its peers: makes device work
 * slow enough for a test to act while it runs. Default: SIMNCCL_DELAY_US, or 0. */
void simnccl_set_delay_us(uint64_t us);

/* Buffers whose mapping (physical backing or access) changed while a
 * collective that uses them ran. Each one also sets the communicator's async
 * error to ncclUnhandledCudaError and is reported on stderr. */
uint64_t simnccl_mapping_changes(void);

/* Collective and point-to-point operations whose data movement completed. */
uint64_t simnccl_ops_completed(void);

#ifdef __cplusplus
}
#endif
#endif /* SIMNCCL_H */
