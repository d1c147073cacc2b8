/* Whether CUDA opens here and why not, and the libraries' versions: plain C over the CUDA
   runtime, cuDNN and cuBLAS, part of the CUDA backend and also compiled alone into
   tools/gpu-check.sh's probe, which must answer before minutes of building. */
#include <stdio.h>
#include <string.h>

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "device/cuda/probe.h"

static const char *compute_mode_name(int mode)
{
    switch (mode) {
    case cudaComputeModeDefault: return "default";
    case cudaComputeModeProhibited: return "prohibited (no process may use it)";
    case cudaComputeModeExclusiveProcess: return "exclusive-process";
    default: return "unknown";
    }
}

static void version_text(char *out, size_t cap, int v, const char *none)
{
    if (v > 0)
        snprintf(out, cap, "%d.%d", v / 1000, v % 1000 / 10);
    else
        snprintf(out, cap, "%s", none);
}

int mgt_cuda_probe_text(char *why, size_t cap)
{
    int drv = 0, rt = 0, n = 0;
    (void)cudaDriverGetVersion(&drv);
    (void)cudaRuntimeGetVersion(&rt);
    cudaError_t e = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    if (e == cudaSuccess && n > 0)
        return n;
    char d[32], r[32];
    version_text(d, sizeof d, drv, "none loaded");
    version_text(r, sizeof r, rt, "unknown");
    if (e == cudaSuccess) {
        snprintf(why, cap, "no CUDA device: the driver reports none (CUDA driver %s, runtime %s)",
                 d, r);
        return 0;
    }
    /* A GPU in a compute mode that admits no process makes cudaGetDeviceCount fail too; the
       attribute is readable without a context. */
    char modes[256] = "";
    size_t len = 0;
    for (int i = 0; i < 16 && len < sizeof modes; i++) {
        int m = 0;
        if (cudaDeviceGetAttribute(&m, cudaDevAttrComputeMode, i) != cudaSuccess)
            break;
        len += (size_t)snprintf(modes + len, sizeof modes - len, "; gpu %d compute mode %s", i,
                                compute_mode_name(m));
    }
    (void)cudaGetLastError();
    snprintf(why, cap, "no CUDA device: cudaGetDeviceCount: %s (%s; CUDA driver %s, runtime %s%s)",
             cudaGetErrorString(e), cudaGetErrorName(e), d, r, modes);
    return 0;
}

void mgt_cuda_lib_versions(char *text, size_t cap)
{
    int drv = 0, rt = 0, blas[3] = {0, 0, 0};
    (void)cudaDriverGetVersion(&drv);
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaGetLastError();
    cublasGetProperty(MAJOR_VERSION, &blas[0]);
    cublasGetProperty(MINOR_VERSION, &blas[1]);
    cublasGetProperty(PATCH_LEVEL, &blas[2]);
    size_t dnn = cudnnGetVersion(); /* cuDNN 9: major * 10000 + minor * 100 + patch */
    char d[32], r[32];
    version_text(d, sizeof d, drv, "none");
    version_text(r, sizeof r, rt, "unknown");
    snprintf(text, cap,
             "CUDA runtime %s, driver %s, cuDNN %zu.%zu.%zu (headers %d.%d.%d), cuBLAS %d.%d.%d", r,
             d, dnn / 10000, dnn % 10000 / 100, dnn % 100, CUDNN_MAJOR, CUDNN_MINOR,
             CUDNN_PATCHLEVEL, blas[0], blas[1], blas[2]);
}

void mgt_cuda_describe_gpu(int i, char *text, size_t cap)
{
    struct cudaDeviceProp p;
    int mode = -1;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
        snprintf(text, cap, "gpu %d: %s", i, cudaGetErrorString(cudaGetLastError()));
        return;
    }
    (void)cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, i);
    (void)cudaGetLastError();
    snprintf(text, cap,
             "gpu %d: %s, sm_%d%d, %d multiprocessors, %.1f GiB, L2 %d MiB, pci %04x:%02x:%02x.0, "
             "compute mode %s",
             i, p.name, p.major, p.minor, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1024.0 * 1024 * 1024), p.l2CacheSize >> 20,
             (unsigned)p.pciDomainID, (unsigned)p.pciBusID, (unsigned)p.pciDeviceID,
             compute_mode_name(mode));
}
