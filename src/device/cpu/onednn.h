/* oneDNN on the CPU fast path: single-threaded sgemm and blocked-layout convolutions run over chunks of a batch on the device's pool. */
#ifndef MGT_DEVICE_CPU_ONEDNN_H
#define MGT_DEVICE_CPU_ONEDNN_H

#include <stddef.h>

#include "device/op.h"

typedef struct cpu_pool cpu_pool;

/* A device's oneDNN state: engine, one stream per pool thread, and the plans made so far. */
typedef struct onednn onednn;
/* How one convolution op of one shape runs (made once, kept by its onednn). */
typedef struct onednn_plan onednn_plan;

mgt_status onednn_create(int threads, onednn **out);
/* NULL is a no-op. */
void onednn_free(onednn *o);

/* Row-major C = alpha op(A) op(B) + beta C on the calling thread only (oneDNN's own threads
   are off for every thread that calls in here: the pool splits the work). */
void onednn_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc);

/* The plan for a conv op (forward, backward data or backward filter, fp32 or its bf16 _lp
   form: bf16 inputs, fp32 output), made on first use.
   MGT_ERR_UNSUPPORTED (no error text) where oneDNN has no kernel for it (grouped shapes, or
   a primitive oneDNN refuses): the caller runs its own path. *scratch_floats is what
   onednn_conv_run needs. Called by the device's one kernel thread at a time. */
mgt_status onednn_conv_plan(onednn *o, const mgt_op *op, onednn_plan **plan,
                            size_t *scratch_floats);
/* Runs op with its plan on the pool, scratch holding the plan's scratch_floats (64-byte
   aligned). The split is a function of the shape and the pool's thread count only, so runs
   are bit-identical. MGT_ERR_DEVICE where oneDNN fails at run time. */
mgt_status onednn_conv_run(onednn *o, onednn_plan *plan, cpu_pool *pool, const mgt_op *op,
                           float *scratch);

#endif
