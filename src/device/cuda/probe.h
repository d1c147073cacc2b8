/* Whether CUDA opens and the libraries' versions (probe.c): plain C, no mgtrain dependency,
   so that tools/gpu-check.sh can build its probe from these two files alone. */
#ifndef MGT_DEVICE_CUDA_PROBE_H
#define MGT_DEVICE_CUDA_PROBE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The number of GPUs the runtime sees, or 0 with why[] saying why none: cudaGetDeviceCount's
   own error text and name, the driver's and the runtime's versions, each GPU's compute mode. */
int mgt_cuda_probe_text(char *why, size_t cap);
/* "CUDA runtime 13.0, driver 13.0, cuDNN 9.19.0 (headers 9.19.0), cuBLAS 13.1.0" as loaded. */
void mgt_cuda_lib_versions(char *text, size_t cap);
/* "gpu 0: NVIDIA H100 80GB HBM3, sm_90, 132 multiprocessors, 79.1 GiB, ..., compute mode
   default" */
void mgt_cuda_describe_gpu(int i, char *text, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
