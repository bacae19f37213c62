// Stands for a real libcuda.so.1: it has driver entry points but not the
// simulator's simcuda_cupti_attach, so the simulated CUPTI must refuse it.
#include <cuda.h>

extern "C" __attribute__((visibility("default"))) CUresult cuInit(unsigned int flags) {
  return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
