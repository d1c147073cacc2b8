/* The CUDA backend's entry point in a build without CUDA: there is no such backend. */
#include "device/backend.h"

const mgt_backend_i *mgt_backend_cuda(void) { return NULL; }
