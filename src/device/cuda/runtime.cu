// The CUDA backend's runtime side: devices, verified peer access, the caching allocator,
// streams, events, copies and the error plumbing every other .cu file uses.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "device/cuda/common.cuh"
#include "device/cuda/probe.h"

// ---- errors ----

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

// Faults that leave the CUDA context unusable; every later call returns them again.
static bool is_sticky_error(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContained:
    case cudaErrorTensorMemoryLeak: return true;
    default: return false;
    }
}

// The first failure of a replica wins; later ones would only describe its consequences.
void mgt_cuda_make_sticky(mgt_cuda_dev *d, const char *fmt, ...)
{
    std::lock_guard<std::mutex> g(d->sticky_lock);
    if (d->sticky.load())
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->sticky_text, sizeof d->sticky_text, fmt, ap);
    va_end(ap);
    d->sticky.store(1);
}

mgt_status mgt_cuda_fail_rt(mgt_cuda_dev *d, cudaError_t e, const char *call, const char *file,
                            int line, bool waiting)
{
    // A failed call also leaves the thread's last-error state set; drop it so that the
    // launch check of the next kernel does not report this failure a second time.
    (void)cudaGetLastError();
    mgt_status st = e == cudaErrorMemoryAllocation ? MGT_ERR_OOM : MGT_ERR_DEVICE;
    if (d == NULL)
        return mgt_error_set(st, "cuda: %s: %s [%s:%d]", call, cudaGetErrorString(e),
                             base_name(file), line);
    const char *hint = "";
    if ((waiting || is_sticky_error(e)) && !d->set->opt.sync)
        hint = " (a fault of work enqueued earlier; MGT_CUDA_SYNC=1 pins it to its launch)";
    if (waiting || is_sticky_error(e))
        mgt_cuda_make_sticky(d, "cuda device %d (gpu %d): %s: %s [%s:%d]%s", d->index, d->gpu, call,
                             cudaGetErrorString(e), base_name(file), line, hint);
    return mgt_error_set(st, "cuda device %d (gpu %d): %s: %s [%s:%d]%s", d->index, d->gpu, call,
                         cudaGetErrorString(e), base_name(file), line, hint);
}

mgt_status mgt_cuda_fail_blas(mgt_cuda_dev *d, cublasStatus_t e, const char *call, const char *file,
                              int line)
{
    (void)cudaGetLastError();
    mgt_status st = e == CUBLAS_STATUS_ALLOC_FAILED ? MGT_ERR_OOM : MGT_ERR_DEVICE;
    return mgt_error_set(st, "cuda device %d (gpu %d): %s: %s [%s:%d]", d->index, d->gpu, call,
                         cublasGetStatusString(e), base_name(file), line);
}

mgt_status mgt_cuda_fail_dnn(mgt_cuda_dev *d, cudnnStatus_t e, const char *call, const char *file,
                             int line)
{
    (void)cudaGetLastError();
    char detail[256];
    cudnnGetLastErrorString(detail, sizeof detail);
    mgt_status st = (e == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                     e == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
                        ? MGT_ERR_OOM
                        : MGT_ERR_DEVICE;
    return mgt_error_set(st, "cuda device %d (gpu %d): %s: %s%s%s [%s:%d]", d->index, d->gpu, call,
                         cudnnGetErrorString(e), detail[0] ? ": " : "", detail, base_name(file),
                         line);
}

static const char *flag_op_name(int code)
{
    switch (code) {
    case MGT_CUDA_FLAG_XENT_FWD_LABEL: return "softmax_xent_forward";
    case MGT_CUDA_FLAG_XENT_BWD_LABEL: return "softmax_xent_backward";
    case MGT_CUDA_FLAG_TOPK_LABEL: return "topk_correct";
    case MGT_CUDA_FLAG_RPB_INDEX: return "relpos_bias_forward";
    default: return "kernel";
    }
}

mgt_status mgt_cuda_dev_check(mgt_cuda_dev *d)
{
    if (!d->sticky.load()) {
        // The flag lives in mapped host memory: a plain read, no copy and no wait. The code
        // slot is written last by the kernel (after a system fence), so row and label are
        // valid once it is non-zero.
        volatile int *f = d->flag_host;
        int code = f[MGT_CUDA_FLAG_CODE];
        if (code == MGT_CUDA_FLAG_NONE)
            return MGT_OK;
        mgt_cuda_make_sticky(
            d, "cuda device %d (gpu %d): %s: %s %d out of range [0, %d) in row %d", d->index,
            d->gpu, flag_op_name(code), code == MGT_CUDA_FLAG_RPB_INDEX ? "index" : "label",
            f[MGT_CUDA_FLAG_LABEL], f[MGT_CUDA_FLAG_CLASSES], f[MGT_CUDA_FLAG_ROW]);
    }
    std::lock_guard<std::mutex> g(d->sticky_lock);
    return mgt_error_set(MGT_ERR_DEVICE, "%s", d->sticky_text);
}

mgt_status mgt_cuda_enter(mgt_cuda_stream *s)
{
    MGT_CUDA_TRY(s->dev, cudaSetDevice(s->dev->gpu));
    return mgt_cuda_dev_check(s->dev);
}

mgt_status mgt_cuda_after(mgt_cuda_stream *s, const char *what, const char *file, int line)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return mgt_cuda_fail_rt(s->dev, e, what, file, line, false);
    if (!s->dev->set->opt.sync)
        return MGT_OK;
    // Abortable and bounded as every wait; a fault it finds is pinned to this call.
    mgt_cuda_dev *d = s->dev;
    mgt_status st = d->hooks.wait != NULL ? d->hooks.wait(d->owner, s, what) : MGT_OK;
    if (st != MGT_OK)
        return mgt_error_wrap(st, "%s (MGT_CUDA_SYNC=1) [%s:%d]", what, base_name(file), line);
    return mgt_cuda_dev_check(d);
}

// ---- options ----

static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

static mgt_cuda_options read_options(void)
{
    mgt_cuda_options o;
    o.no_p2p = env_on("MGT_NO_P2P");
    o.tf32 = env_on("MGT_TF32");
    o.deterministic = env_on("MGT_DETERMINISTIC");
    o.sync = env_on("MGT_CUDA_SYNC");
    o.recoverable = false;
    o.nfaults = 0;
    // 1 GiB lets cuDNN try its fast large-workspace algorithms without starving the model.
    o.find_ws_cap = (size_t)1 << 30;
    const char *mb = getenv("MGT_CUDNN_WORKSPACE_MB");
    if (mb != NULL && mb[0] != '\0') {
        char *end = NULL;
        unsigned long long v = strtoull(mb, &end, 10);
        if (end != mb && *end == '\0')
            o.find_ws_cap = (size_t)v << 20;
    }
    return o;
}

// ---- devices ----

mgt_status mgt_cuda_probe(int *count)
{
    char why[512];
    *count = mgt_cuda_probe_text(why, sizeof why);
    return *count > 0 ? MGT_OK : mgt_error_set(MGT_ERR_UNSUPPORTED, "%s", why);
}

void mgt_cuda_versions(char *text, size_t cap)
{
    char libs[256], nccl[32];
    mgt_cuda_lib_versions(libs, sizeof libs);
    mgt_cuda_nccl_version(nccl, sizeof nccl);
    snprintf(text, cap, "%s, NCCL %s", libs, nccl);
}

int mgt_cuda_device_count(void)
{
    int n = 0;
    // No driver, no GPU, a driver older than the runtime: all mean "no CUDA devices here".
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

static void dev_release_cache(mgt_cuda_dev *d)
{
    std::multimap<size_t, void *> blocks;
    {
        std::lock_guard<std::mutex> g(d->mem_lock);
        blocks.swap(d->free_blocks);
        d->cached_bytes = 0;
    }
    if (blocks.empty())
        return;
    cudaSetDevice(d->gpu);
    for (auto &b : blocks)
        cudaFree(b.second);
    (void)cudaGetLastError();
}

static void dev_destroy(mgt_cuda_dev *d, bool drained)
{
    if (d == NULL)
        return;
    // the 16-bit filter copies (dnn.cu): their blocks are live ones, freed below
    for (auto &e : d->wcache)
        if (e.second.w16 != NULL && d->hooks.unreserve != NULL)
            d->hooks.unreserve(d->owner, e.second.cap);
    d->wcache.clear();
    // Not drained: kernels may still run on these blocks; cudaFree would wait for them.
    if (drained && cudaSetDevice(d->gpu) == cudaSuccess) {
        for (auto &b : d->free_blocks)
            cudaFree(b.second);
        for (auto &b : d->pending) {
            cudaEventDestroy(b.done);
            cudaFree(b.ptr);
        }
        // Buffers the program never freed go with the set: nothing can use them after it.
        for (auto &b : d->live)
            cudaFree(b.first);
        if (d->flag_host != NULL)
            cudaFreeHost(d->flag_host);
        if (d->claim_dev != NULL)
            cudaFree(d->claim_dev);
        (void)cudaGetLastError();
    }
    mgt_cuda_survive_free(d, drained);
    delete d;
}

// Sets with a replica a stuck host call may come back into: kept, and reachable, for good.
static std::mutex kept_sets_lock;
static std::vector<mgt_cuda_set *> kept_sets;

void mgt_cuda_set_close(mgt_cuda_set *set, bool drained, const bool *keep)
{
    if (set == NULL)
        return;
    mgt_cuda_survive_unhang(set);
    bool kept = false;
    for (int i = 0; i < set->n; i++) {
        if (keep != NULL && keep[i]) {
            kept = true; // its allocator, streams and handles stay as the stuck call left them
            continue;
        }
        dev_destroy(set->devs[i], drained);
        set->devs[i] = NULL;
    }
    if (kept) { // a kept replica's calls reach the set (d->set): it stays too
        std::lock_guard<std::mutex> g(kept_sets_lock);
        try {
            kept_sets.push_back(set);
        } catch (...) { // no room to list it: left unreachable, still allocated
        }
        return;
    }
    delete[] set->devs;
    delete set;
}

static mgt_status dev_create(mgt_cuda_set *set, int index, int gpu, int replicas,
                             const mgt_cuda_hooks *hooks, void *owner, mgt_cuda_dev **out)
{
    mgt_cuda_dev *d = new (std::nothrow) mgt_cuda_dev();
    if (d == NULL)
        return mgt_error_set(MGT_ERR_OOM, "cuda: out of host memory opening gpu %d", gpu);
    d->set = set;
    d->index = index;
    d->gpu = gpu;
    d->replicas_on_gpu = replicas;
    if (hooks != NULL)
        d->hooks = *hooks;
    d->owner = owner;
    d->cached_bytes = 0;
    d->flag_host = NULL;
    d->flag_dev = NULL;
    d->claim_dev = NULL;
    d->released = false;
    d->hung = false;
    d->launches.store(0);
    d->sms = 1;
    d->sticky.store(0);
    d->sticky_text[0] = '\0';
    *out = d; // owned by the set from here on, also on failure below

    MGT_CUDA_TRY(d, cudaSetDevice(gpu));
    // Creates the primary context now, so a broken GPU fails at open and not mid-step.
    MGT_CUDA_TRY(d, cudaFree(0));
    cudaDeviceProp prop;
    MGT_CUDA_TRY(d, cudaGetDeviceProperties(&prop, gpu));
    d->total_mem = prop.totalGlobalMem / (size_t)replicas;
    d->sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    snprintf(d->model, sizeof d->model, "%.80s sm_%d%d", prop.name, prop.major, prop.minor);
    char share[48] = "";
    if (replicas > 1)
        snprintf(share, sizeof share, ", shared by %d replicas", replicas);
    snprintf(d->name, sizeof d->name, "%.48s (gpu %d, pci %04x:%02x:%02x.0, %.1f GiB%s)", prop.name,
             gpu, (unsigned)prop.pciDomainID, (unsigned)prop.pciBusID, (unsigned)prop.pciDeviceID,
             (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024), share);

    void *flag = NULL;
    MGT_CUDA_TRY(d, cudaHostAlloc(&flag, MGT_CUDA_FLAG_SLOTS * sizeof(int),
                                  cudaHostAllocMapped | cudaHostAllocPortable));
    d->flag_host = (int *)flag;
    memset(flag, 0, MGT_CUDA_FLAG_SLOTS * sizeof(int));
    void *flag_dev = NULL;
    MGT_CUDA_TRY(d, cudaHostGetDevicePointer(&flag_dev, flag, 0));
    d->flag_dev = (int *)flag_dev;
    void *claim = NULL;
    MGT_CUDA_TRY(d, cudaMalloc(&claim, sizeof(int)));
    d->claim_dev = (int *)claim;
    MGT_CUDA_TRY(d, cudaMemset(claim, 0, sizeof(int)));
    // The memset runs on the legacy stream, which our non-blocking streams do not wait for.
    MGT_CUDA_TRY(d, cudaDeviceSynchronize());
    return MGT_OK;
}

static bool enable_peer(int from, int to)
{
    if (cudaSetDevice(from) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
    // An earlier devset of this process may have enabled it already: that is success.
    (void)cudaGetLastError();
    return e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
}

static uint32_t peer_pattern(size_t i, int src, int dst)
{
    // Never zero, different per position and per direction: a copy that silently arrives
    // as zeros, or lands shifted, or comes from the wrong pair, all fail the comparison.
    uint32_t salt = 0x9e3779b9u * (uint32_t)(src * 64 + dst + 1);
    return ((uint32_t)(i * 2654435761u) ^ salt) | 1u;
}

// Copies a known pattern from src to dst over the direct path and checks every word; then
// times a few copies for the bandwidth figure. Any CUDA failure counts as "no access".
static bool verify_peer(int src, int dst, double *gbps)
{
    const size_t bytes = (size_t)16 << 20;
    const size_t words = bytes / sizeof(uint32_t);
    const int reps = 4;
    uint32_t *host = NULL;
    void *dsrc = NULL, *ddst = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    float ms = 0.0f;
    bool ok = false;
    *gbps = 0.0;

    if (cudaHostAlloc((void **)&host, 2 * bytes, cudaHostAllocPortable) != cudaSuccess)
        goto done;
    for (size_t i = 0; i < words; i++)
        host[i] = peer_pattern(i, src, dst);
    if (cudaSetDevice(src) != cudaSuccess || cudaMalloc(&dsrc, bytes) != cudaSuccess ||
        cudaMemcpy(dsrc, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        goto done;
    if (cudaSetDevice(dst) != cudaSuccess || cudaMalloc(&ddst, bytes) != cudaSuccess ||
        cudaMemset(ddst, 0, bytes) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&t0) != cudaSuccess || cudaEventCreate(&t1) != cudaSuccess)
        goto done;
    if (cudaMemcpyPeerAsync(ddst, dst, dsrc, src, bytes, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess ||
        cudaMemcpy(host + words, ddst, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        goto done;
    if (memcmp(host, host + words, bytes) != 0)
        goto done;
    ok = true;

    if (cudaEventRecord(t0, stream) != cudaSuccess)
        goto done;
    for (int r = 0; r < reps; r++)
        if (cudaMemcpyPeerAsync(ddst, dst, dsrc, src, bytes, stream) != cudaSuccess)
            goto done;
    if (cudaEventRecord(t1, stream) == cudaSuccess && cudaEventSynchronize(t1) == cudaSuccess &&
        cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess && ms > 0.0f)
        *gbps = (double)bytes * reps / ((double)ms * 1e6);

done:
    if (t0 != NULL)
        cudaEventDestroy(t0);
    if (t1 != NULL)
        cudaEventDestroy(t1);
    if (stream != NULL)
        cudaStreamDestroy(stream);
    if (ddst != NULL) {
        cudaSetDevice(dst);
        cudaFree(ddst);
    }
    if (dsrc != NULL) {
        cudaSetDevice(src);
        cudaFree(dsrc);
    }
    if (host != NULL)
        cudaFreeHost(host);
    (void)cudaGetLastError();
    return ok;
}

// Fills set->peer and set->peer_gbps for every pair of replicas.
static void open_peers(mgt_cuda_set *set, int count)
{
    const int n = set->n;
    // Verdicts per physical pair (a -> b), decided once however many replicas share a GPU.
    std::vector<unsigned char> phys((size_t)count * count, 0);
    std::vector<double> phys_gbps((size_t)count * count, 0.0);
    std::vector<unsigned char> used((size_t)count, 0);
    for (int i = 0; i < n; i++)
        used[(size_t)set->devs[i]->gpu] = 1;

    for (int a = 0; a < count && !set->opt.no_p2p; a++) {
        for (int b = a + 1; b < count; b++) {
            if (!used[(size_t)a] || !used[(size_t)b])
                continue;
            int ab = 0, ba = 0;
            if (cudaDeviceCanAccessPeer(&ab, a, b) != cudaSuccess ||
                cudaDeviceCanAccessPeer(&ba, b, a) != cudaSuccess) {
                (void)cudaGetLastError();
                continue;
            }
            // Both directions or neither: the reduction sends both ways over each pair.
            if (!ab || !ba || !enable_peer(a, b) || !enable_peer(b, a))
                continue;
            double g_ab = 0.0, g_ba = 0.0;
            if (!verify_peer(a, b, &g_ab) || !verify_peer(b, a, &g_ba))
                continue;
            phys[(size_t)a * count + b] = phys[(size_t)b * count + a] = 1;
            phys_gbps[(size_t)a * count + b] = g_ab;
            phys_gbps[(size_t)b * count + a] = g_ba;
        }
    }

    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            int gi = set->devs[i]->gpu, gj = set->devs[j]->gpu;
            unsigned char ok;
            double gbps = 0.0;
            if (i == j)
                ok = 1;
            else if (gi == gj)
                // Replicas on one GPU copy with a plain D2D; MGT_NO_P2P still forces the
                // staged path so that it can be exercised on a one-GPU machine.
                ok = set->opt.no_p2p ? 0 : 1;
            else {
                ok = phys[(size_t)gi * count + gj];
                gbps = phys_gbps[(size_t)gi * count + gj];
            }
            set->peer[(size_t)i * n + j] = ok;
            set->peer_gbps[(size_t)i * n + j] = gbps;
        }
    }
}

static mgt_status set_open(const int *ids, int n, const mgt_cuda_flags *flags,
                           const mgt_cuda_hooks *hooks, void *const *owners, mgt_cuda_set **out)
{
    int count = 0;
    mgt_status pst = mgt_cuda_probe(&count);
    if (pst != MGT_OK)
        return pst;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= count)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "gpu id %d (position %d of the list) is out of range: this "
                                 "machine has %d CUDA device%s (ids 0..%d)",
                                 ids[i], i, count, count == 1 ? "" : "s", count - 1);

    mgt_cuda_set *set = new mgt_cuda_set();
    set->n = n;
    set->opt = read_options();
    set->opt.no_p2p = set->opt.no_p2p || flags->no_p2p;
    set->opt.tf32 = set->opt.tf32 || flags->tf32;
    set->opt.deterministic = set->opt.deterministic || flags->deterministic;
    set->opt.recoverable = flags->recoverable;
    set->wait_value32 = NULL;
    mgt_status fst = mgt_cuda_faults_parse(&set->opt, n);
    if (fst != MGT_OK) {
        delete set;
        return fst;
    }
    set->devs = new mgt_cuda_dev *[(size_t)n]();
    set->peer.assign((size_t)n * n, 0);
    set->peer_gbps.assign((size_t)n * n, 0.0);
    for (int i = 0; i < n; i++) {
        int replicas = 0;
        for (int j = 0; j < n; j++)
            replicas += ids[j] == ids[i];
        mgt_status st = dev_create(set, i, ids[i], replicas, hooks,
                                   owners != NULL ? owners[i] : NULL, &set->devs[i]);
        if (st != MGT_OK) {
            mgt_cuda_set_close(set, true, NULL);
            return st;
        }
    }
    mgt_status sst = mgt_cuda_survive_open(set);
    if (sst != MGT_OK) {
        mgt_cuda_set_close(set, true, NULL);
        return sst;
    }
    open_peers(set, count);
    *out = set;
    return MGT_OK;
}

mgt_status mgt_cuda_set_open(const int *ids, int n, const mgt_cuda_flags *flags,
                             const mgt_cuda_hooks *hooks, void *const *owners, mgt_cuda_set **out)
{
    *out = NULL;
    try {
        return set_open(ids, n, flags, hooks, owners, out);
    } catch (...) {
        return mgt_error_set(MGT_ERR_OOM, "cuda: out of host memory opening %d device(s)", n);
    }
}

mgt_cuda_dev *mgt_cuda_set_dev(mgt_cuda_set *set, int i) { return set->devs[i]; }

int mgt_cuda_set_peer(const mgt_cuda_set *set, int i, int j)
{
    return set->peer[(size_t)i * set->n + j];
}

double mgt_cuda_set_peer_gbps(const mgt_cuda_set *set, int i, int j)
{
    return set->peer_gbps[(size_t)i * set->n + j];
}

void mgt_cuda_dev_describe(const mgt_cuda_dev *d, char *name, size_t cap, size_t *total_mem)
{
    snprintf(name, cap, "%s", d->name);
    *total_mem = d->total_mem;
}

// ---- memory ----

// Small blocks in 512-byte steps, large ones in 2 MiB steps (the driver's own granularity),
// so that a near size finds the block a previous step freed.
static size_t round_block(size_t bytes)
{
    const size_t small = 512, big = (size_t)2 << 20;
    if (bytes == 0)
        bytes = 1;
    if (bytes <= ((size_t)1 << 20))
        return (bytes + small - 1) / small * small;
    return (bytes + big - 1) / big * big;
}

// Moves the stream-freed blocks whose work has run to the free list. d->mem_lock held.
static void reap_pending(mgt_cuda_dev *d)
{
    for (size_t i = 0; i < d->pending.size();) {
        auto &b = d->pending[i];
        cudaError_t e = cudaEventQuery(b.done);
        if (e == cudaErrorNotReady) {
            (void)cudaGetLastError();
            i++;
            continue;
        }
        cudaEventDestroy(b.done);
        if (e == cudaSuccess) {
            d->free_blocks.emplace(b.size, b.ptr);
            d->cached_bytes += b.size;
        } // else the context is dead: the block is left to the process's end
        (void)cudaGetLastError();
        d->pending[i] = d->pending.back();
        d->pending.pop_back();
    }
}

static bool take_cached(mgt_cuda_dev *d, size_t want, void **out)
{
    std::lock_guard<std::mutex> g(d->mem_lock);
    reap_pending(d);
    auto it = d->free_blocks.lower_bound(want);
    // At most an eighth larger: a small request must not pin a huge block.
    if (it == d->free_blocks.end() || it->first > want + want / 8)
        return false;
    d->live[it->second] = it->first;
    d->cached_bytes -= it->first;
    *out = it->second;
    d->free_blocks.erase(it);
    return true;
}

static mgt_status alloc_block(mgt_cuda_dev *d, size_t bytes, void **out)
{
    const size_t want = round_block(bytes);
    if (take_cached(d, want, out))
        return MGT_OK;
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e == cudaErrorMemoryAllocation) {
        // Blocks cached by any replica on this GPU are memory the driver could hand out, and
        // so is what the stream-ordered pool kept of cuDNN's searches (dnn.cu).
        (void)cudaGetLastError();
        for (int i = 0; i < d->set->n; i++)
            if (d->set->devs[i]->gpu == d->gpu)
                dev_release_cache(d->set->devs[i]);
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, d->gpu) == cudaSuccess)
            cudaMemPoolTrimTo(pool, 0);
        (void)cudaGetLastError();
        cudaSetDevice(d->gpu);
        e = cudaMalloc(&p, want);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        return mgt_error_set(MGT_ERR_OOM,
                             "cuda device %d (gpu %d): cudaMalloc of %zu bytes: out of memory "
                             "(%zu MiB free of %zu MiB)",
                             d->index, d->gpu, want, free_b >> 20, total_b >> 20);
    }
    if (e != cudaSuccess)
        return mgt_cuda_fail_rt(d, e, "cudaMalloc", __FILE__, __LINE__, false);
    try {
        std::lock_guard<std::mutex> g(d->mem_lock);
        d->live[p] = want;
    } catch (...) {
        cudaFree(p);
        return mgt_error_set(MGT_ERR_OOM, "cuda device %d: out of host memory", d->index);
    }
    *out = p;
    return MGT_OK;
}

mgt_status mgt_cuda_alloc(mgt_cuda_dev *d, size_t bytes, void **out)
{
    mgt_status st = mgt_cuda_dev_check(d);
    if (st != MGT_OK)
        return st;
    return alloc_block(d, bytes, out);
}

void mgt_cuda_free(mgt_cuda_dev *d, void *ptr)
{
    if (ptr == NULL)
        return;
    // The block goes back out to the next request at once: the dispatch layer has waited
    // (through events on every stream of the set, not a device-wide synchronize) until no
    // queued work can use it.
    size_t size = 0;
    {
        std::lock_guard<std::mutex> g(d->mem_lock);
        auto it = d->live.find(ptr);
        if (it == d->live.end())
            return;
        size = it->second;
        d->live.erase(it);
        try {
            d->free_blocks.emplace(size, ptr);
            d->cached_bytes += size;
        } catch (...) {
            cudaFree(ptr);
        }
    }
    // a filter copy made from this block is stale: the block may come back as another buffer
    // (outside mem_lock: filter16 takes the cache's lock, then the allocator's)
    mgt_cuda_note_write(d, ptr, size);
}

void mgt_cuda_free_on_stream(mgt_cuda_stream *s, void *ptr)
{
    if (ptr == NULL)
        return;
    mgt_cuda_dev *d = s->dev;
    cudaEvent_t ev = NULL;
    bool ordered = cudaSetDevice(d->gpu) == cudaSuccess &&
                   cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess &&
                   cudaEventRecord(ev, s->stream) == cudaSuccess;
    (void)cudaGetLastError();
    std::lock_guard<std::mutex> g(d->mem_lock);
    auto it = d->live.find(ptr);
    if (it == d->live.end()) {
        if (ev != NULL)
            cudaEventDestroy(ev);
        return;
    }
    size_t size = it->second;
    d->live.erase(it);
    if (!ordered) { // a failed context: nothing can tell when its work ends; leave the block
        if (ev != NULL)
            cudaEventDestroy(ev);
        return;
    }
    try {
        d->pending.push_back({ev, ptr, size});
    } catch (...) {
        cudaEventDestroy(ev); // no room to remember it: leave the block
    }
}

mgt_status mgt_cuda_host_alloc(mgt_cuda_dev *d, size_t bytes, void **out)
{
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    void *p = NULL;
    // Portable: the dispatch layer stages peer copies between two GPUs through one buffer.
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mgt_error_set(e == cudaErrorMemoryAllocation ? MGT_ERR_OOM : MGT_ERR_DEVICE,
                             "cuda device %d (gpu %d): cudaHostAlloc of %zu bytes: %s", d->index,
                             d->gpu, bytes, cudaGetErrorString(e));
    }
    *out = p;
    return MGT_OK;
}

void mgt_cuda_host_free(mgt_cuda_dev *d, void *ptr)
{
    if (ptr == NULL)
        return;
    cudaSetDevice(d->gpu);
    cudaFreeHost(ptr);
    (void)cudaGetLastError();
}

mgt_status mgt_cuda_replace_block(mgt_cuda_stream *s, void **buf, size_t *have, size_t want,
                                  const char *what)
{
    mgt_cuda_dev *d = s->dev;
    if (d->hooks.reserve != NULL) {
        mgt_status st = d->hooks.reserve(d->owner, want, what);
        if (st != MGT_OK)
            return st;
    }
    void *p = NULL;
    mgt_status st = alloc_block(d, want, &p);
    if (st != MGT_OK) {
        if (d->hooks.unreserve != NULL)
            d->hooks.unreserve(d->owner, want);
        return st;
    }
    if (*buf != NULL) {
        mgt_cuda_free_on_stream(s, *buf);
        if (d->hooks.unreserve != NULL)
            d->hooks.unreserve(d->owner, *have);
    }
    *buf = p;
    *have = want;
    return MGT_OK;
}

static mgt_status grow_buffer(mgt_cuda_stream *s, void **buf, size_t *have, size_t bytes)
{
    if (bytes <= *have)
        return MGT_OK;
    size_t want = (size_t)64 << 10;
    while (want < bytes)
        want *= 2;
    return mgt_cuda_replace_block(s, buf, have, want, "kernel scratch");
}

mgt_status mgt_cuda_scratch(mgt_cuda_stream *s, size_t bytes)
{
    return grow_buffer(s, &s->scratch, &s->scratch_bytes, bytes);
}

mgt_status mgt_cuda_lowp_buffer(mgt_cuda_stream *s, size_t bytes)
{
    return grow_buffer(s, &s->lowp, &s->lowp_bytes, bytes);
}

// ---- streams ----

static mgt_status stream_create(mgt_cuda_dev *d, mgt_cuda_stream **out)
{
    mgt_status st = mgt_cuda_dev_check(d);
    if (st != MGT_OK)
        return st;
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    mgt_cuda_stream *s = new mgt_cuda_stream();
    memset(s, 0, sizeof *s);
    s->dev = d;
    // Non-blocking: our streams never wait for the legacy default stream, which libraries
    // or the blocking cudaMemcpy of other code may use.
    cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        delete s;
        return mgt_cuda_fail_rt(d, e, "cudaStreamCreateWithFlags", __FILE__, __LINE__, false);
    }
    try {
        std::lock_guard<std::mutex> g(d->streams_lock);
        d->streams.push_back(s);
    } catch (...) {
        cudaStreamDestroy(s->stream);
        delete s;
        throw;
    }
    *out = s;
    return MGT_OK;
}

mgt_status mgt_cuda_stream_create(mgt_cuda_dev *d, mgt_cuda_stream **out)
{
    try {
        return stream_create(d, out);
    } catch (...) {
        return mgt_error_set(MGT_ERR_OOM, "cuda device %d: out of host memory", d->index);
    }
}

void mgt_cuda_stream_destroy(mgt_cuda_stream *s)
{
    if (s == NULL)
        return;
    mgt_cuda_dev *d = s->dev;
    {
        std::lock_guard<std::mutex> g(d->streams_lock);
        for (size_t i = 0; i < d->streams.size(); i++)
            if (d->streams[i] == s) {
                d->streams.erase(d->streams.begin() + (long)i);
                break;
            }
    }
    cudaSetDevice(d->gpu);
    if (s->cd != NULL)
        cudnnDestroyConvolutionDescriptor(s->cd);
    if (s->wd != NULL)
        cudnnDestroyFilterDescriptor(s->wd);
    if (s->bnd != NULL)
        cudnnDestroyTensorDescriptor(s->bnd);
    if (s->yd != NULL)
        cudnnDestroyTensorDescriptor(s->yd);
    if (s->xd != NULL)
        cudnnDestroyTensorDescriptor(s->xd);
    if (s->dnn != NULL)
        cudnnDestroy(s->dnn);
    if (s->blas != NULL)
        cublasDestroy(s->blas);
    // On the stream, before it goes: a stream left with a hung kernel keeps them.
    if (s->ws != NULL) {
        mgt_cuda_free_on_stream(s, s->ws);
        if (d->hooks.unreserve != NULL)
            d->hooks.unreserve(d->owner, s->ws_bytes);
    }
    if (s->scratch != NULL) {
        mgt_cuda_free_on_stream(s, s->scratch);
        if (d->hooks.unreserve != NULL)
            d->hooks.unreserve(d->owner, s->scratch_bytes);
    }
    if (s->lowp != NULL) {
        mgt_cuda_free_on_stream(s, s->lowp);
        if (d->hooks.unreserve != NULL)
            d->hooks.unreserve(d->owner, s->lowp_bytes);
    }
    cudaStreamDestroy(s->stream);
    (void)cudaGetLastError();
    delete s;
}

// cudaErrorNotReady is an answer, not a failure; some runtimes still leave it as the
// thread's last error, which the next launch check would then report.
static int not_ready(cudaError_t e)
{
    if (e != cudaErrorNotReady)
        return 0;
    (void)cudaGetLastError();
    return 1;
}

mgt_status mgt_cuda_stream_query(mgt_cuda_stream *s, int *done)
{
    *done = 0;
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    cudaError_t e = cudaStreamQuery(s->stream);
    if (not_ready(e))
        return MGT_OK;
    if (e != cudaSuccess)
        return mgt_cuda_fail_rt(s->dev, e, "cudaStreamQuery", __FILE__, __LINE__, true);
    *done = 1;
    // Work that ran may have raised the kernel flag (a bad label): report it now.
    return mgt_cuda_dev_check(s->dev);
}

mgt_status mgt_cuda_dev_query(mgt_cuda_dev *d, int *done)
{
    *done = 0;
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    mgt_status st = mgt_cuda_dev_check(d);
    if (st != MGT_OK)
        return st;
    cudaError_t e = cudaSuccess;
    {
        std::lock_guard<std::mutex> g(d->streams_lock);
        for (mgt_cuda_stream *s : d->streams) {
            e = cudaStreamQuery(s->stream);
            if (e != cudaSuccess)
                break;
        }
    }
    if (not_ready(e))
        return MGT_OK;
    if (e != cudaSuccess)
        return mgt_cuda_fail_rt(d, e, "cudaStreamQuery", __FILE__, __LINE__, true);
    *done = 1;
    return mgt_cuda_dev_check(d);
}

// ---- events ----

mgt_status mgt_cuda_event_create(mgt_cuda_dev *d, bool timing, mgt_cuda_event **out)
{
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    mgt_cuda_event *e = new (std::nothrow) mgt_cuda_event();
    if (e == NULL)
        return mgt_error_set(MGT_ERR_OOM, "cuda device %d: out of host memory", d->index);
    e->dev = d;
    e->mark = -1;
    // Events that only order streams take no timestamp: recording them is cheaper, and a
    // wait on them need not wait for the timestamp write.
    cudaError_t r =
        cudaEventCreateWithFlags(&e->event, timing ? cudaEventDefault : cudaEventDisableTiming);
    if (r != cudaSuccess) {
        delete e;
        return mgt_cuda_fail_rt(d, r, "cudaEventCreateWithFlags", __FILE__, __LINE__, false);
    }
    mgt_status st = mgt_cuda_mark_take(e);
    if (st != MGT_OK) {
        cudaEventDestroy(e->event);
        delete e;
        return st;
    }
    *out = e;
    return MGT_OK;
}

void mgt_cuda_event_destroy(mgt_cuda_event *e)
{
    if (e == NULL)
        return;
    cudaSetDevice(e->dev->gpu);
    cudaEventDestroy(e->event);
    (void)cudaGetLastError();
    mgt_cuda_mark_put(e);
    delete e;
}

mgt_status mgt_cuda_event_record(mgt_cuda_event *e, mgt_cuda_stream *s)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    MGT_CUDA_TRY(s->dev, cudaEventRecord(e->event, s->stream));
    if (e->mark >= 0) {
        st = mgt_cuda_mark_record(e, s);
        if (st != MGT_OK)
            return st;
    }
    return MGT_CUDA_AFTER(s, "cudaEventRecord");
}

mgt_status mgt_cuda_stream_wait_event(mgt_cuda_stream *s, mgt_cuda_event *e)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    // Another replica's record, in a recoverable set: through its mark, which the host can
    // let pass should that replica be given up.
    if (e->mark >= 0 && e->dev != s->dev)
        return mgt_cuda_mark_wait(s, e);
    // The event may belong to another GPU: CUDA orders across devices here.
    MGT_CUDA_TRY(s->dev, cudaStreamWaitEvent(s->stream, e->event, 0));
    return MGT_CUDA_AFTER(s, "cudaStreamWaitEvent");
}

mgt_status mgt_cuda_event_query(mgt_cuda_event *e, int *done)
{
    *done = 0;
    mgt_cuda_dev *d = e->dev;
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    mgt_status st = mgt_cuda_dev_check(d);
    if (st != MGT_OK) {
        // Failed, but *done still answers: a flagged replica's kernels go on running, while
        // a context ended by a fault runs nothing more.
        cudaError_t r = cudaEventQuery(e->event);
        *done = r != cudaErrorNotReady;
        (void)cudaGetLastError();
        return st;
    }
    cudaError_t r = cudaEventQuery(e->event);
    if (not_ready(r))
        return MGT_OK;
    if (r != cudaSuccess)
        return mgt_cuda_fail_rt(d, r, "cudaEventQuery", __FILE__, __LINE__, true);
    *done = 1;
    return mgt_cuda_dev_check(d);
}

mgt_status mgt_cuda_event_elapsed(mgt_cuda_event *start, mgt_cuda_event *end, float *ms)
{
    mgt_cuda_dev *d = end->dev;
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    cudaError_t r = cudaEventElapsedTime(ms, start->event, end->event);
    if (r == cudaErrorNotReady || r == cudaErrorInvalidResourceHandle) {
        // A caller's mistake (an event not recorded or not yet run), not a device fault.
        (void)cudaGetLastError();
        return mgt_error_set(MGT_ERR_INVALID,
                             "cuda device %d: event_elapsed_ms needs two completed records (%s)",
                             d->index, cudaGetErrorString(r));
    }
    if (r != cudaSuccess)
        return mgt_cuda_fail_rt(d, r, "cudaEventElapsedTime", __FILE__, __LINE__, false);
    return MGT_OK;
}

// ---- copies ----

mgt_status mgt_cuda_memset(mgt_cuda_stream *s, void *dst, int value, size_t bytes)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    MGT_CUDA_TRY(s->dev, cudaMemsetAsync(dst, value, bytes, s->stream));
    return MGT_CUDA_AFTER(s, "cudaMemsetAsync");
}

mgt_status mgt_cuda_copy(mgt_cuda_stream *s, int kind, void *dst, const void *src, size_t bytes)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    cudaMemcpyKind k = kind == MGT_CUDA_COPY_H2D   ? cudaMemcpyHostToDevice
                       : kind == MGT_CUDA_COPY_D2H ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyDeviceToDevice;
    MGT_CUDA_TRY(s->dev, cudaMemcpyAsync(dst, src, bytes, k, s->stream));
    return MGT_CUDA_AFTER(s, "cudaMemcpyAsync");
}

mgt_status mgt_cuda_copy_peer(mgt_cuda_stream *s, void *dst, mgt_cuda_dev *src_dev, const void *src,
                              size_t bytes)
{
    mgt_status st = mgt_cuda_enter(s);
    if (st != MGT_OK)
        return st;
    st = mgt_cuda_dev_check(src_dev);
    if (st != MGT_OK)
        return st;
    if (s->dev->set->opt.recoverable)
        return mgt_cuda_guarded_copy(s, dst, src_dev, src, bytes);
    if (src_dev->gpu == s->dev->gpu) {
        MGT_CUDA_TRY(s->dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->stream));
        return MGT_CUDA_AFTER(s, "cudaMemcpyAsync (replicas on one gpu)");
    }
    MGT_CUDA_TRY(s->dev,
                 cudaMemcpyPeerAsync(dst, s->dev->gpu, src, src_dev->gpu, bytes, s->stream));
    return MGT_CUDA_AFTER(s, "cudaMemcpyPeerAsync");
}
