/* tools/gpu-check.sh's first step on a GPU machine: says in seconds whether CUDA opens (the
   runtime's own reason when not), with the driver, runtime, cuDNN and cuBLAS versions and
   each GPU, before minutes of building. Exit 0 with at least one GPU, 1 without. Built from
   src/device/cuda/probe.c and this file alone (also a CMake target, to keep it compiling). */
#include <stdio.h>

#include "device/cuda/probe.h"

int main(void)
{
    char text[512];
    mgt_cuda_lib_versions(text, sizeof text);
    printf("cuda_probe: %s\n", text);
    int n = mgt_cuda_probe_text(text, sizeof text);
    if (n == 0) {
        printf("cuda_probe: FAIL: %s\n", text);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        mgt_cuda_describe_gpu(i, text, sizeof text);
        printf("cuda_probe: %s\n", text);
    }
    printf("cuda_probe: %d CUDA device%s\n", n, n == 1 ? "" : "s");
    return 0;
}
