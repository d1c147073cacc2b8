// Collectives across processes on CUDA: one NCCL communicator per replica, spanning the
// nodes of a multi-node run (the replica of the same local index on every node), made from
// an id that node 0 creates and the world broadcasts. Built when CMake finds NCCL
// (MGT_HAVE_NCCL: the toolkit's, the system's, NCCL_ROOT's or a Python wheel's; configure says
// which); otherwise the backend table leaves these out.
#include <stdio.h>
#include <string.h>

#include "device/cuda/common.cuh"

#ifdef MGT_HAVE_NCCL
#include <nccl.h>

struct mgt_cuda_xcomm {
    mgt_cuda_dev *dev;
    ncclComm_t comm;
    int rank, nranks;
};

static mgt_status nccl_fail(mgt_cuda_dev *d, ncclResult_t r, const char *call)
{
    return mgt_error_set(MGT_ERR_DEVICE, "%s: %s: %s", d ? d->name : "nccl", call,
                         ncclGetErrorString(r));
}

extern "C" mgt_status mgt_cuda_xcomm_id(void *id, size_t cap, size_t *len)
{
    if (cap < sizeof(ncclUniqueId))
        return mgt_error_set(MGT_ERR_INVALID, "nccl: an id needs %zu bytes", sizeof(ncclUniqueId));
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return nccl_fail(NULL, r, "ncclGetUniqueId");
    memcpy(id, &u, sizeof u);
    *len = sizeof u;
    return MGT_OK;
}

extern "C" mgt_status mgt_cuda_xcomm_create(mgt_cuda_dev *d, const void *id, size_t len, int nranks,
                                            int rank, mgt_cuda_xcomm **out)
{
    *out = NULL;
    if (len != sizeof(ncclUniqueId))
        return mgt_error_set(MGT_ERR_INVALID, "nccl: an id of %zu bytes, not %zu", len,
                             sizeof(ncclUniqueId));
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    mgt_cuda_xcomm *x = new mgt_cuda_xcomm();
    x->dev = d;
    x->rank = rank;
    x->nranks = nranks;
    // blocks until every rank of this replica's communicator has called it
    ncclResult_t r = ncclCommInitRank(&x->comm, nranks, u, rank);
    if (r != ncclSuccess) {
        delete x;
        return nccl_fail(d, r, "ncclCommInitRank");
    }
    *out = x;
    return MGT_OK;
}

extern "C" mgt_status mgt_cuda_xcomm_allgather(mgt_cuda_xcomm *x, mgt_cuda_stream *s,
                                               const float *send, float *recv, size_t n)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    ncclResult_t r = ncclAllGather(send, recv, n, ncclFloat, x->comm, s->stream);
    if (r != ncclSuccess)
        return nccl_fail(s->dev, r, "ncclAllGather");
    return MGT_CUDA_AFTER(s, "ncclAllGather");
}

extern "C" mgt_status mgt_cuda_xcomm_alltoall(mgt_cuda_xcomm *x, mgt_cuda_stream *s,
                                              const float *send, const size_t *counts,
                                              const size_t *displs, float *recv, size_t each,
                                              size_t stride)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    // this rank's own piece is a device copy; the others go as one group of point-to-point
    // transfers, which NCCL runs side by side
    if (each > 0)
        MGT_CUDA_TRY(s->dev,
                     cudaMemcpyAsync(recv + (size_t)x->rank * stride, send + displs[x->rank],
                                     each * sizeof(float), cudaMemcpyDeviceToDevice, s->stream));
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < x->nranks && r == ncclSuccess; p++) {
        if (p == x->rank)
            continue;
        if (counts[p] > 0)
            r = ncclSend(send + displs[p], counts[p], ncclFloat, p, x->comm, s->stream);
        if (r == ncclSuccess && each > 0)
            r = ncclRecv(recv + (size_t)p * stride, each, ncclFloat, p, x->comm, s->stream);
    }
    // a group once started is ended, whatever failed inside it
    ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess)
        return nccl_fail(s->dev, r, "ncclSend/ncclRecv");
    if (e != ncclSuccess)
        return nccl_fail(s->dev, e, "ncclGroupEnd");
    return MGT_CUDA_AFTER(s, "the all-to-all's ncclSend/ncclRecv group");
}

extern "C" void mgt_cuda_xcomm_free(mgt_cuda_xcomm *x)
{
    if (!x)
        return;
    cudaSetDevice(x->dev->gpu);
    // ncclCommAbort, not ncclCommDestroy: after a failure the peers may be gone, and a
    // destroy would wait for them
    ncclCommAbort(x->comm);
    delete x;
}

extern "C" bool mgt_cuda_have_nccl(void) { return true; }

extern "C" void mgt_cuda_nccl_version(char *text, size_t cap)
{
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) {
        snprintf(text, cap, "built, version unreadable");
        return;
    }
    // NCCL 2.9 and later: major * 10000 + minor * 100 + patch
    snprintf(text, cap, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
}

#else

extern "C" bool mgt_cuda_have_nccl(void) { return false; }

extern "C" void mgt_cuda_nccl_version(char *text, size_t cap) { snprintf(text, cap, "not built"); }

#endif
