// What lets a CUDA set go on without a replica given up mid-step (--on-device-failure
// continue): waits across replicas that the host can let pass, peer copies that skip a
// given-up replica's memory, and the faults MGT_CUDA_FAULT injects to show them.
//
// A survivor's stream must never be left waiting on a lost GPU. cudaStreamWaitEvent cannot be
// cancelled, and nothing says a record queued behind a hung kernel (or in a context with a
// sticky error) will ever run. So in a recoverable set each event also has a mark, a word of
// mapped host memory: its stream writes the record's count there when it reaches the record
// (a one-thread kernel), and another replica's stream waits with cuStreamWaitValue32 until the
// word reaches the count it wants. Giving a replica up (mgt_cuda_dev_release) sets its "lost"
// word and moves every mark of it far ahead, so every such wait passes. What a survivor's
// stream runs next is usually a copy out of the lost replica's memory, which a copy engine
// would read whatever happened (and a read from a GPU that fell off the bus can leave the
// reader's context with a sticky error too): here it is a kernel on the reader's GPU that
// first reads both replicas' "lost" words and copies nothing when either is set.
#include <cstdlib>
#include <cstring>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "device/cuda/common.cuh"

// How far a release moves a mark past its last count: a wait compares cyclically
// ((int32_t)(mark - want) >= 0), so "far ahead" is half the range at most.
static const uint32_t RELEASE_AHEAD = 0x40000000u;

// The word a replica's kernels read to learn that it has been given up.
static const uint32_t *lost_word(const mgt_cuda_dev *d)
{
    return d->mark_dev[0] + MGT_CUDA_MARK_LOST;
}

// ---- injected faults ----

mgt_status mgt_cuda_faults_parse(mgt_cuda_options *o, int n)
{
    o->nfaults = 0;
    const char *text = getenv("MGT_CUDA_FAULT");
    if (text == NULL || text[0] == '\0')
        return MGT_OK;
    const char *p = text;
    while (*p != '\0') {
        if (o->nfaults == MGT_CUDA_MAX_FAULTS)
            return mgt_error_set(MGT_ERR_INVALID, "MGT_CUDA_FAULT=%s: more than %d faults", text,
                                 MGT_CUDA_MAX_FAULTS);
        mgt_cuda_fault f = {0, 0, 0};
        size_t klen = strcspn(p, "@,");
        if (klen == 4 && strncmp(p, "hang", 4) == 0)
            f.kind = MGT_CUDA_FAULT_HANG;
        else if (klen == 4 && strncmp(p, "gone", 4) == 0)
            f.kind = MGT_CUDA_FAULT_GONE;
        else
            return mgt_error_set(MGT_ERR_INVALID,
                                 "MGT_CUDA_FAULT=%s: unknown fault '%.*s' (hang or gone, as "
                                 "KIND@REPLICA:KERNEL, comma-separated)",
                                 text, (int)klen, p);
        p += klen;
        char *end = NULL;
        long r = -1, at = 0;
        if (*p == '@')
            r = strtol(p + 1, &end, 10);
        if (end != NULL && end != p + 1 && *end == ':') {
            const char *q = end + 1;
            at = strtol(q, &end, 10);
            if (end == q)
                at = 0;
        }
        if (r < 0 || at < 1 || end == NULL || (*end != '\0' && *end != ','))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "MGT_CUDA_FAULT=%s: each fault is KIND@REPLICA:KERNEL, the "
                                 "replica's position in the set and a kernel count from 1",
                                 text);
        if (r >= n)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "MGT_CUDA_FAULT=%s: replica %ld is not in a set of %d", text, r,
                                 n);
        f.replica = (int)r;
        f.at = at;
        o->faults[o->nfaults++] = f;
        p = *end == ',' ? end + 1 : end;
    }
    return MGT_OK;
}

// Spins until the host writes the word (the set closing): a hung GPU as mgtrain sees one.
__global__ void k_hang(const volatile uint32_t *release)
{
    while (*release == 0)
        __nanosleep(1u << 16);
}

mgt_status mgt_cuda_inject(mgt_cuda_stream *s)
{
    mgt_cuda_dev *d = s->dev;
    const mgt_cuda_options &o = d->set->opt;
    if (o.nfaults == 0)
        return MGT_OK;
    long k = d->launches.fetch_add(1) + 1;
    for (int i = 0; i < o.nfaults; i++) {
        const mgt_cuda_fault &f = o.faults[i];
        if (f.replica != d->index || f.at != k)
            continue;
        if (f.kind == MGT_CUDA_FAULT_GONE) {
            mgt_cuda_make_sticky(
                d,
                "cuda device %d (gpu %d): injected fault (MGT_CUDA_FAULT gone@%d:%ld): "
                "the device is gone, every call on it fails",
                d->index, d->gpu, d->index, k);
            return mgt_cuda_dev_check(d);
        }
        mgt_status st = mgt_cuda_enter(s);
        if (st != MGT_OK)
            return st;
        {
            std::lock_guard<std::mutex> g(d->marks_lock); // its words were made at open
            d->hung = true;
        }
        k_hang<<<1, 1, 0, s->stream>>>(d->mark_dev[0] + MGT_CUDA_MARK_UNHANG);
        return MGT_CUDA_AFTER(s, "k_hang (MGT_CUDA_FAULT)");
    }
    return MGT_OK;
}

void mgt_cuda_survive_unhang(mgt_cuda_set *set)
{
    for (int i = 0; set->devs != NULL && i < set->n; i++) {
        mgt_cuda_dev *d = set->devs[i];
        if (d == NULL)
            continue;
        std::lock_guard<std::mutex> g(d->marks_lock);
        if (d->hung)
            ((volatile uint32_t *)d->mark_host[0])[MGT_CUDA_MARK_UNHANG] = 1;
    }
}

// ---- marks ----

// One more chunk of marks for d (under d->marks_lock).
static mgt_status add_chunk(mgt_cuda_dev *d)
{
    MGT_CUDA_TRY(d, cudaSetDevice(d->gpu));
    void *host = NULL, *dev = NULL;
    MGT_CUDA_TRY(d, cudaHostAlloc(&host, MGT_CUDA_MARK_CHUNK * sizeof(uint32_t),
                                  cudaHostAllocMapped | cudaHostAllocPortable));
    memset(host, 0, MGT_CUDA_MARK_CHUNK * sizeof(uint32_t));
    cudaError_t e = cudaHostGetDevicePointer(&dev, host, 0);
    if (e != cudaSuccess) {
        cudaFreeHost(host);
        return mgt_cuda_fail_rt(d, e, "cudaHostGetDevicePointer", __FILE__, __LINE__, false);
    }
    size_t first = d->mark_seq.size();
    try {
        d->mark_host.push_back((uint32_t *)host);
        d->mark_dev.push_back((uint32_t *)dev);
        d->mark_seq.resize(first + MGT_CUDA_MARK_CHUNK, 0);
        for (int w = MGT_CUDA_MARK_CHUNK - 1; w >= 0; w--)
            if (first > 0 || w > MGT_CUDA_MARK_UNHANG) // chunk 0's first words are not marks
                d->free_marks.push_back((int)(first + (size_t)w));
    } catch (...) {
        return mgt_error_set(MGT_ERR_OOM, "cuda device %d: out of host memory for event marks",
                             d->index);
    }
    return MGT_OK;
}

mgt_status mgt_cuda_survive_open(mgt_cuda_set *set)
{
    // a replica with an injected hang needs its words in any set
    for (int i = 0; i < set->n; i++) {
        bool hang = false;
        for (int k = 0; k < set->opt.nfaults; k++)
            hang |=
                set->opt.faults[k].kind == MGT_CUDA_FAULT_HANG && set->opt.faults[k].replica == i;
        mgt_cuda_dev *d = set->devs[i];
        std::lock_guard<std::mutex> g(d->marks_lock);
        if (hang || set->opt.recoverable) {
            mgt_status st = add_chunk(d);
            if (st != MGT_OK)
                return st;
        }
    }
    if (!set->opt.recoverable)
        return MGT_OK;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000,
                                                     cudaEnableDefault, &found);
    if (e != cudaSuccess || fn == NULL || found != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "--on-device-failure continue on CUDA needs the driver's stream "
                             "memory operations (cuStreamWaitValue32): %s",
                             e != cudaSuccess ? cudaGetErrorString(e)
                                              : "the driver does not have it");
    }
    set->wait_value32 = fn;
    return MGT_OK;
}

void mgt_cuda_survive_free(mgt_cuda_dev *d, bool drained)
{
    if (!drained)
        return; // a queued wait or guarded copy may still read them
    for (uint32_t *h : d->mark_host)
        cudaFreeHost(h);
    (void)cudaGetLastError();
    d->mark_host.clear();
    d->mark_dev.clear();
}

mgt_status mgt_cuda_mark_take(mgt_cuda_event *e)
{
    mgt_cuda_dev *d = e->dev;
    e->mark = -1;
    if (!d->set->opt.recoverable)
        return MGT_OK;
    std::lock_guard<std::mutex> g(d->marks_lock);
    if (d->free_marks.empty()) {
        mgt_status st = add_chunk(d);
        if (st != MGT_OK)
            return st;
    }
    // A word keeps its count across events: a new event's first record counts on from the
    // last one's, so a wait queued for an older event on the word is never passed early.
    e->mark = d->free_marks.back();
    d->free_marks.pop_back();
    return MGT_OK;
}

void mgt_cuda_mark_put(mgt_cuda_event *e)
{
    if (e->mark < 0)
        return;
    mgt_cuda_dev *d = e->dev;
    std::lock_guard<std::mutex> g(d->marks_lock);
    try {
        d->free_marks.push_back(e->mark);
    } catch (...) { // no room to list it: the word is left unused
    }
    e->mark = -1;
}

static uint32_t *mark_dev_ptr(const mgt_cuda_dev *d, int mark)
{
    return d->mark_dev[(size_t)mark / MGT_CUDA_MARK_CHUNK] + (size_t)mark % MGT_CUDA_MARK_CHUNK;
}

// Writes the record's count once the stream reaches it, unless the replica has been given up
// by then (a hung stream that comes back must not move a released mark back).
__global__ void k_mark(volatile uint32_t *mark, uint32_t count, const volatile uint32_t *lost)
{
    if (*lost != 0)
        return;
    __threadfence_system(); // what the stream ran before is seen before the mark
    *mark = count;
}

mgt_status mgt_cuda_mark_record(mgt_cuda_event *e, mgt_cuda_stream *s)
{
    mgt_cuda_dev *d = e->dev;
    {
        // under the lock: a release moves the mark past every count enqueued before it
        std::lock_guard<std::mutex> g(d->marks_lock);
        if (d->released)
            return mgt_error_set(MGT_ERR_DEVICE, "cuda device %d (gpu %d): given up: no record",
                                 d->index, d->gpu);
        uint32_t count = ++d->mark_seq[(size_t)e->mark];
        k_mark<<<1, 1, 0, s->stream>>>(mark_dev_ptr(d, e->mark), count, lost_word(d));
    }
    return MGT_CUDA_AFTER(s, "k_mark (event record)"); // may wait (MGT_CUDA_SYNC): unlocked
}

mgt_status mgt_cuda_mark_wait(mgt_cuda_stream *s, mgt_cuda_event *e)
{
    mgt_cuda_dev *src = e->dev;
    uint32_t want = 0;
    CUdeviceptr at = 0;
    {
        std::lock_guard<std::mutex> g(src->marks_lock);
        if (src->released) // given up: its records will not come, and nothing waits for them
            return MGT_OK;
        want = src->mark_seq[(size_t)e->mark];
        at = (CUdeviceptr)(uintptr_t)mark_dev_ptr(src, e->mark);
    }
    if (want == 0) // never recorded: nothing to wait for, as with cudaStreamWaitEvent
        return MGT_OK;
    PFN_cuStreamWaitValue32_v11070 wait = (PFN_cuStreamWaitValue32_v11070)s->dev->set->wait_value32;
    CUresult r = wait((CUstream)s->stream, at, want, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
        (void)cudaGetLastError();
        return mgt_error_set(MGT_ERR_DEVICE,
                             "cuda device %d (gpu %d): cuStreamWaitValue32 on cuda device %d's "
                             "event: driver error %d",
                             s->dev->index, s->dev->gpu, src->index, (int)r);
    }
    return MGT_CUDA_AFTER(s, "cuStreamWaitValue32 (another replica's event)");
}

void mgt_cuda_dev_release(mgt_cuda_dev *d)
{
    if (d == NULL || !d->set->opt.recoverable)
        return;
    std::lock_guard<std::mutex> g(d->marks_lock);
    if (d->released || d->mark_host.empty())
        return;
    d->released = true;
    // "lost" first: a guarded copy that a released wait lets run reads it set
    ((volatile uint32_t *)d->mark_host[0])[MGT_CUDA_MARK_LOST] = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (size_t w = 0; w < d->mark_seq.size(); w++) {
        if (w == MGT_CUDA_MARK_LOST || w == MGT_CUDA_MARK_UNHANG)
            continue;
        volatile uint32_t *h = d->mark_host[w / MGT_CUDA_MARK_CHUNK] + w % MGT_CUDA_MARK_CHUNK;
        *h = d->mark_seq[w] + RELEASE_AHEAD;
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

// ---- guarded copies ----

// Copies n items of T from src to dst unless either "lost" word is set when the block starts.
template <class T>
__global__ void k_guarded_copy(T *dst, const T *src, size_t n, const volatile uint32_t *lost_src,
                               const volatile uint32_t *lost_dst)
{
    __shared__ int skip;
    if (threadIdx.x == 0)
        skip = (*lost_src | *lost_dst) != 0;
    __syncthreads();
    if (skip)
        return;
    for (size_t i = thread_index(); i < n; i += thread_stride())
        dst[i] = src[i];
}

mgt_status mgt_cuda_guarded_copy(mgt_cuda_stream *s, void *dst, mgt_cuda_dev *src_dev,
                                 const void *src, size_t bytes)
{
    mgt_cuda_dev *d = s->dev;
    const uint32_t *lost_src = lost_word(src_dev), *lost_dst = lost_word(d);
    const uintptr_t all = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)bytes;
    // As wide as the addresses and the size allow: 16 bytes a load keeps a peer read near the
    // copy engines' rate; a gradient bucket's offsets are 4-byte aligned at least.
    const size_t width = all % 16 == 0 ? 16 : all % 4 == 0 ? 4 : 1;
    const size_t n = bytes / width;
    size_t blocks = (n + 255) / 256;
    const size_t cap = (size_t)d->sms * 4;
    if (blocks > cap)
        blocks = cap;
    if (width == 16)
        k_guarded_copy<<<(unsigned)blocks, 256, 0, s->stream>>>((uint4 *)dst, (const uint4 *)src, n,
                                                                lost_src, lost_dst);
    else if (width == 4)
        k_guarded_copy<<<(unsigned)blocks, 256, 0, s->stream>>>(
            (uint32_t *)dst, (const uint32_t *)src, n, lost_src, lost_dst);
    else
        k_guarded_copy<<<(unsigned)blocks, 256, 0, s->stream>>>(
            (unsigned char *)dst, (const unsigned char *)src, n, lost_src, lost_dst);
    return MGT_CUDA_AFTER(s, "k_guarded_copy (peer copy, recoverable set)");
}
