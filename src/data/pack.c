/* Packed datasets: one file holding the splits of an ImageFolder tree (index, labels, class
 * names, each image re-encoded at a maximum side or as raw pixels), written atomically, every
 * record with its CRC-32.
 *
 * Format, version 1 (every integer little-endian; offsets from the file's start):
 *
 *   header, 64 bytes
 *     0  magic "MGTPACK\0"                     8  u32 version (1)
 *     12 u32 split count                       16 u64 split table offset
 *     24 u32 CRC-32 of the split table         28 u32 format (0 jpeg, 1 raw)
 *     32 u32 max side (0: none)                36 u32 JPEG quality of re-encoded images
 *     40..59 zero                              60 u32 CRC-32 of bytes 0..59
 *   records, each starting at a multiple of 64, zero padding between them
 *   per split: its entries (32 bytes each), then its strings
 *   split table: 64 bytes per split
 *     0  name, NUL-padded (16)                 16 u64 record count
 *     24 u32 class count                       28 u32 CRC-32 of the entries
 *     32 u64 entries offset                    40 u64 strings offset
 *     48 u64 strings size                      56 u32 CRC-32 of the strings   60 u32 zero
 *   entry, 32 bytes
 *     0  u64 record offset                     8  u32 record size
 *     12 u32 CRC-32 of the record              16 u32 label
 *     20 u16 width                             22 u16 height
 *     24 u8 kind (0 encoded image file, 1 raw pixels, 2 bad file: the reason as text)
 *     25 u8 channels (1 or 3; 0 for a bad file)     26 u16 zero
 *     28 u32 offset of the file's relative path in the strings
 *   strings: the class names in label order, then every record's path relative to the split
 *     folder ("class/name.jpg"), each NUL-terminated
 *
 * A raw record is height rows of width pixels of `channels` interleaved bytes. Everything is
 * a function of the folder's files, in ImageFolder's order, so packing twice gives the same
 * bytes; the file is written to a temp file, synced and renamed, so a failed pack leaves no
 * half-written one. The reader checks every offset, size, label and string against the file
 * before it is used, and each record's CRC when it is read; it reads with pread (a pack that
 * shrinks under a run is an error, not SIGBUS).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <turbojpeg.h>
#include <zlib.h>

#include "data/internal.h"

#define PACK_MAGIC "MGTPACK"
#define PACK_VERSION 1
#define HEADER_SIZE 64
#define SPLIT_SIZE 64
#define ENTRY_SIZE 32
#define RECORD_ALIGN 64

enum { KIND_ENCODED = 0, KIND_RAW = 1, KIND_BAD = 2 };

struct mgt_pack {
    int refs;
    char *path;
    int fd;
    size_t size; /* when it was opened */
    uint8_t header[HEADER_SIZE];
    uint8_t *table; /* the split table */
    uint32_t format, max_side;
};

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t crc(const void *p, size_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    const Bytef *b = p;
    /* zlib takes an unsigned int length */
    while (n > 0) {
        unsigned k = n > (1u << 30) ? 1u << 30 : (unsigned)n;
        c = crc32(c, b, k);
        b += k;
        n -= k;
    }
    return (uint32_t)c;
}

/* ---- reading ---- */

/* Read with pread, never mapped: a pack that shrinks while a run reads it (another job
   repacking it, truncate, a full disk's copy) must be an error naming the file, not SIGBUS on
   a page past its new end. The index of a split (its entries and strings) is copied into
   memory when it is opened, checked once; records are read into the caller's buffer. */

void mgt_pack_release(mgt_pack *p)
{
    if (!p || --p->refs > 0)
        return;
    if (p->fd >= 0)
        close(p->fd);
    free(p->table);
    free(p->path);
    free(p);
}

static bool in_file(const mgt_pack *p, uint64_t off, uint64_t len)
{
    return off <= p->size && len <= p->size - off;
}

static mgt_status bad_pack(const char *path, const char *what)
{
    return mgt_error_set(MGT_ERR_INVALID, "%s: not a valid mgtrain pack: %s", path, what);
}

/* The pack's size now against the size it had when opened. */
static mgt_status check_size(const mgt_pack *p)
{
    struct stat sb;
    if (fstat(p->fd, &sb) != 0)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", p->path, strerror(errno));
    if ((uint64_t)sb.st_size != p->size)
        return mgt_error_set(MGT_ERR_IO,
                             "%s: the pack changed during the run: %llu bytes now, %llu when "
                             "it was opened (a pack must not be rewritten while it is read)",
                             p->path, (unsigned long long)sb.st_size, (unsigned long long)p->size);
    return MGT_OK;
}

/* len bytes at off into buf; a short read is the pack having shrunk since it was opened. */
static mgt_status read_at(const mgt_pack *p, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(p->fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return mgt_error_set(MGT_ERR_IO, "%s: read: %s", p->path, strerror(errno));
        if (n == 0) {
            mgt_status st = check_size(p);
            return st != MGT_OK ? st
                                : mgt_error_set(MGT_ERR_IO,
                                                "%s: the pack changed during the run: "
                                                "a read at byte %llu came back short",
                                                p->path, (unsigned long long)(off + got));
        }
        got += (size_t)n;
    }
    return MGT_OK;
}

/* A heap copy of len bytes at off (len > 0). */
static mgt_status read_copy(const mgt_pack *p, uint64_t off, size_t len, uint8_t **out)
{
    *out = malloc(len ? len : 1);
    if (!*out)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of memory", p->path);
    mgt_status st = read_at(p, *out, len, off);
    if (st != MGT_OK) {
        free(*out);
        *out = NULL;
    }
    return st;
}

static mgt_status pack_map(const char *path, mgt_pack **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mgt_error_set(MGT_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mgt_error_set(MGT_ERR_INVALID, "%s: not a regular file", path);
    }
    if (sb.st_size < HEADER_SIZE) {
        close(fd);
        return bad_pack(path, "shorter than its header");
    }
    /* training reads records in a random order: no readahead past what a record asks for */
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    mgt_pack *p = calloc(1, sizeof *p);
    if (!p || !(p->path = strdup(path))) {
        free(p);
        close(fd);
        return mgt_error_set(MGT_ERR_OOM, "%s: out of memory", path);
    }
    p->refs = 1;
    p->fd = fd;
    p->size = (size_t)sb.st_size;
    uint8_t *h = p->header;
    mgt_status st = read_at(p, h, HEADER_SIZE, 0);
    if (st != MGT_OK)
        ;
    else if (memcmp(h, PACK_MAGIC "\0", 8) != 0)
        st = bad_pack(path, "no MGTPACK magic at its start");
    else if (rd32(h + 60) != crc(h, 60))
        st = bad_pack(path, "header checksum mismatch");
    else if (rd32(h + 8) != PACK_VERSION)
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: pack format version %u; this mgtrain reads version %d", path,
                           rd32(h + 8), PACK_VERSION);
    else if (rd32(h + 28) != MGT_PACK_JPEG && rd32(h + 28) != MGT_PACK_RAW)
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: record format %u; this mgtrain reads 0 (JPEG) and 1 (raw pixels)",
                           path, rd32(h + 28));
    else if (rd32(h + 12) == 0 || rd32(h + 12) > 16 ||
             !in_file(p, rd64(h + 16), (uint64_t)rd32(h + 12) * SPLIT_SIZE))
        st = bad_pack(path, "split table outside the file");
    else if ((st = read_copy(p, rd64(h + 16), (size_t)rd32(h + 12) * SPLIT_SIZE, &p->table)) !=
             MGT_OK)
        ;
    else if (crc(p->table, (size_t)rd32(h + 12) * SPLIT_SIZE) != rd32(h + 24))
        st = bad_pack(path, "split table checksum mismatch");
    if (st != MGT_OK) {
        mgt_pack_release(p);
        return st;
    }
    p->format = rd32(h + 28);
    p->max_side = rd32(h + 32);
    *out = p;
    return MGT_OK;
}

/* The split table's row for `name`, or NULL. */
static const uint8_t *find_split(const mgt_pack *p, const char *name, int *count)
{
    int n = (int)rd32(p->header + 12);
    *count = n;
    for (int i = 0; i < n; i++) {
        const uint8_t *row = p->table + (size_t)i * SPLIT_SIZE;
        if (strncmp((const char *)row, name, 16) == 0)
            return row;
    }
    return NULL;
}

static mgt_status split_names(const mgt_pack *p, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (uint32_t i = 0; i < rd32(p->header + 12); i++) {
        char nm[17];
        memcpy(nm, p->table + (size_t)i * SPLIT_SIZE, 16);
        nm[16] = '\0';
        mgt_data_sanitize(nm);
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "%s%s", i ? ", " : "", nm);
    }
    return MGT_OK;
}

/* Checks one split's entries and strings against the file and fills ds from them (its own
   copies of both). */
static mgt_status load_split(mgt_pack *p, const uint8_t *row, const char *name, mgt_dataset *ds)
{
    const char *path = p->path;
    uint64_t n = rd64(row + 16);
    uint32_t nclasses = rd32(row + 24);
    uint64_t eoff = rd64(row + 32), soff = rd64(row + 40), ssize = rd64(row + 48);
    if (n == 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: split %s holds no records", path, name);
    if (n > (uint64_t)1 << 40 || !in_file(p, eoff, n * ENTRY_SIZE))
        return mgt_error_set(MGT_ERR_INVALID, "%s: split %s: entries outside the file", path, name);
    if (!in_file(p, soff, ssize) || ssize == 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: split %s: strings outside the file", path, name);
    uint8_t *entries, *strings;
    mgt_status st = read_copy(p, eoff, (size_t)n * ENTRY_SIZE, &entries);
    if (st != MGT_OK)
        return st;
    ds->entries = entries;
    if ((st = read_copy(p, soff, (size_t)ssize, &strings)) != MGT_OK)
        return st;
    ds->strings = (char *)strings;
    if (strings[ssize - 1] != '\0')
        return mgt_error_set(MGT_ERR_INVALID, "%s: split %s: strings outside the file", path, name);
    if (crc(entries, (size_t)n * ENTRY_SIZE) != rd32(row + 28))
        return mgt_error_set(MGT_ERR_INVALID, "%s: split %s: index checksum mismatch", path, name);
    if (crc(strings, (size_t)ssize) != rd32(row + 56))
        return mgt_error_set(MGT_ERR_INVALID, "%s: split %s: strings checksum mismatch", path,
                             name);
    if (nclasses == 0 || nclasses > (1u << 24))
        return mgt_error_set(MGT_ERR_INVALID, "%s: split %s: %u classes", path, name, nclasses);
    const char *s = ds->strings;
    ds->class_names = calloc(nclasses, sizeof *ds->class_names);
    ds->labels = malloc((size_t)n * sizeof *ds->labels);
    if (!ds->class_names || !ds->labels)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of memory", path);
    size_t at = 0;
    for (uint32_t c = 0; c < nclasses; c++) {
        if (at >= ssize)
            return mgt_error_set(MGT_ERR_INVALID, "%s: split %s: class names cut short", path,
                                 name);
        if (!(ds->class_names[c] = strdup(s + at)))
            return mgt_error_set(MGT_ERR_OOM, "%s: out of memory", path);
        ds->nclasses++;
        at += strlen(s + at) + 1;
    }
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *e = entries + i * ENTRY_SIZE;
        uint64_t roff = rd64(e);
        uint32_t rsize = rd32(e + 8), label = rd32(e + 16), noff = rd32(e + 28);
        unsigned kind = e[24], ch = e[25], w = rd16(e + 20), h = rd16(e + 22);
        const char *why = NULL;
        if (!in_file(p, roff, rsize) || rsize == 0)
            why = "its bytes lie outside the file";
        else if (label >= nclasses)
            why = "its label is not a class";
        else if (noff >= ssize)
            why = "its name lies outside the strings";
        else if (kind > KIND_BAD)
            why = "unknown record kind";
        else if (kind != KIND_BAD && ((ch != 1 && ch != 3) || w == 0 || h == 0))
            why = "no size or channel count";
        else if (kind == KIND_RAW && (uint64_t)w * h * ch != rsize)
            why = "raw pixels of the wrong size";
        if (why)
            return mgt_error_set(MGT_ERR_INVALID, "%s: split %s: record %llu: %s", path, name,
                                 (unsigned long long)i, why);
        ds->labels[i] = (int32_t)label;
    }
    ds->n = (size_t)n;
    return MGT_OK;
}

mgt_status mgt_pack_open(const char *path, const char *split, mgt_dataset **out)
{
    *out = NULL;
    mgt_pack *p;
    mgt_status st = pack_map(path, &p);
    if (st != MGT_OK)
        return st;
    st = mgt_pack_open_split(p, split, out);
    mgt_pack_release(p);
    return st;
}

mgt_status mgt_pack_open_split(mgt_pack *p, const char *split, mgt_dataset **out)
{
    *out = NULL;
    int count;
    const uint8_t *row = find_split(p, split, &count);
    if (!row) {
        char names[256];
        split_names(p, names, sizeof names);
        return mgt_error_set(MGT_ERR_INVALID, "%s: no split '%s' in the pack (it has: %s)", p->path,
                             split, names);
    }
    double t0 = mgt_time_now();
    mgt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return mgt_error_set(MGT_ERR_OOM, "%s: out of memory", p->path);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s[%s]", p->path, split);
    ds->dir = strdup(dir);
    ds->pack = p;
    p->refs++;
    mgt_status st = ds->dir ? load_split(p, row, split, ds)
                            : mgt_error_set(MGT_ERR_OOM, "%s: out of memory", p->path);
    if (st != MGT_OK) {
        mgt_dataset_free(ds);
        return st;
    }
    ds->scan_s = mgt_time_now() - t0;
    *out = ds;
    return MGT_OK;
}

mgt_status mgt_pack_map(const char *path, mgt_pack **out) { return pack_map(path, out); }

bool mgt_pack_has_split(const char *path, const char *split)
{
    mgt_pack *p;
    if (pack_map(path, &p) != MGT_OK) {
        mgt_error_clear();
        return false;
    }
    int count;
    bool has = find_split(p, split, &count) != NULL;
    mgt_pack_release(p);
    return has;
}

const char *mgt_pack_relpath(const mgt_dataset *ds, size_t i)
{
    return ds->strings + rd32(ds->entries + i * ENTRY_SIZE + 28);
}

void mgt_pack_entry_size(const mgt_dataset *ds, size_t i, int *w, int *h, int *c)
{
    const uint8_t *e = ds->entries + i * ENTRY_SIZE;
    *w = rd16(e + 20);
    *h = rd16(e + 22);
    *c = e[25];
}

mgt_status mgt_pack_check(const mgt_dataset *ds) { return check_size(ds->pack); }

mgt_status mgt_pack_fetch(const mgt_dataset *ds, size_t i, uint8_t **buf, size_t *cap,
                          mgt_record *out)
{
    const uint8_t *e = ds->entries + i * ENTRY_SIZE;
    size_t len = rd32(e + 8);
    if (len > *cap) {
        uint8_t *b = realloc(*buf, len);
        if (!b)
            return mgt_error_set(MGT_ERR_OOM, "%s: out of memory for a record of %zu bytes",
                                 ds->dir, len);
        *buf = b;
        *cap = len;
    }
    mgt_status st = read_at(ds->pack, *buf, len, rd64(e));
    if (st != MGT_OK)
        return mgt_error_wrap(st, "%s/%s (record %zu)", ds->dir, mgt_pack_relpath(ds, i), i);
    const uint8_t *bytes = *buf;
    uint32_t want = rd32(e + 12), got = crc(bytes, len);
    if (got != want)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s/%s: record %zu is corrupt (CRC-32 %08x, the index says %08x)",
                             ds->dir, mgt_pack_relpath(ds, i), i, got, want);
    if (e[24] == KIND_BAD) {
        int n = len > 400 ? 400 : (int)len;
        return mgt_error_set(MGT_ERR_INVALID, "%s/%s: %.*s (a bad file when it was packed)",
                             ds->dir, mgt_pack_relpath(ds, i), n, (const char *)bytes);
    }
    out->bytes = bytes;
    out->len = len;
    out->raw = e[24] == KIND_RAW;
    out->w = rd16(e + 20);
    out->h = rd16(e + 22);
    out->c = e[25];
    return MGT_OK;
}

/* ---- writing ---- */

typedef struct pack_out {
    FILE *f;
    uint64_t pos;
    int err; /* the first errno, sticky: checked once at the end */
} pack_out;

static void out_write(pack_out *o, const void *p, size_t n)
{
    if (o->err == 0 && n > 0 && fwrite(p, 1, n, o->f) != n)
        o->err = errno ? errno : EIO;
    o->pos += n;
}

static void out_pad(pack_out *o, uint64_t align)
{
    static const uint8_t zeros[RECORD_ALIGN];
    uint64_t r = o->pos % align;
    if (r)
        out_write(o, zeros, (size_t)(align - r));
}

/* One record made by a worker. */
typedef struct made {
    uint8_t *bytes;
    size_t len;
    uint8_t kind, c;
    uint16_t w, h;
    bool reencoded;
} made;

typedef struct pack_worker {
    mgt_decoder *dec;
    tjhandle tj;
    uint8_t *file;
    size_t file_cap;
    mgt_transform_scratch ts;
} pack_worker;

typedef struct pack_job {
    const mgt_pack_options *o;
    const mgt_dataset *ds;
    size_t first;
    made *out;
    pack_worker *workers;
} pack_job;

static mgt_status make_bad(made *m, const char *reason)
{
    m->kind = KIND_BAD;
    m->len = strlen(reason) + 1;
    m->bytes = (uint8_t *)strdup(reason);
    return m->bytes ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "pack: out of memory");
}

/* The size an image is stored at: the longer side at most max_side. */
static void fit(int w, int h, int max_side, int *ow, int *oh)
{
    *ow = w;
    *oh = h;
    if (max_side <= 0 || (w <= max_side && h <= max_side))
        return;
    if (w >= h) {
        *ow = max_side;
        *oh = (int)((double)h * max_side / w + 0.5);
    } else {
        *oh = max_side;
        *ow = (int)((double)w * max_side / h + 0.5);
    }
    if (*ow < 1)
        *ow = 1;
    if (*oh < 1)
        *oh = 1;
}

static int pack_one(void *arg, int wi, size_t k)
{
    pack_job *j = arg;
    pack_worker *w = &j->workers[wi];
    const mgt_pack_options *o = j->o;
    size_t i = j->first + k;
    made *m = &j->out[k];
    char path[8192];
    size_t len = 0;
    mgt_status st = mgt_dataset_path(j->ds, i, path, sizeof path);
    if (st == MGT_OK)
        st = mgt_data_read_file(path, &w->file, &w->file_cap, &len);
    mgt_image_header hd;
    if (st == MGT_OK)
        st = mgt_decoder_header(w->dec, w->file, len, path, &hd);
    mgt_image_view v;
    /* every file is decoded, also one kept as it is: a bad file is found now */
    if (st == MGT_OK)
        st = mgt_decoder_decode(w->dec, w->file, len, path, hd.c, &hd, NULL, &v);
    if (st == MGT_ERR_OOM)
        return (int)st;
    if (st != MGT_OK) {
        /* the reason without the folder's path: the pack names the file itself */
        const char *why = mgt_error_last();
        size_t pl = strlen(path);
        if (strncmp(why, path, pl) == 0 && strncmp(why + pl, ": ", 2) == 0)
            why += pl + 2;
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", why);
        mgt_data_sanitize(reason);
        return (int)make_bad(m, reason);
    }
    int ow, oh;
    fit(v.w, v.h, o->max_side, &ow, &oh);
    if (ow > 65535 || oh > 65535)
        return (int)make_bad(m, "image too large for a pack (a side over 65535)");
    m->w = (uint16_t)ow;
    m->h = (uint16_t)oh;
    m->c = (uint8_t)hd.c;
    if (o->format == MGT_PACK_JPEG && hd.jpeg && !hd.cmyk && ow == v.w && oh == v.h) {
        /* a JPEG that fits is kept as it is: no second loss */
        m->kind = KIND_ENCODED;
        m->len = len;
        m->bytes = malloc(len);
        if (!m->bytes)
            return (int)mgt_error_set(MGT_ERR_OOM, "pack: out of memory");
        memcpy(m->bytes, w->file, len);
        return 0;
    }
    /* the pixels to store: the decoded image, resized as torchvision's Resize would (PIL's
       antialiased bilinear, rounded to 8 bits) */
    size_t npx = (size_t)ow * oh * hd.c;
    uint8_t *px = malloc(npx);
    if (!px)
        return (int)mgt_error_set(MGT_ERR_OOM, "pack: out of memory");
    if (ow == v.w && oh == v.h) {
        for (int y = 0; y < oh; y++)
            memcpy(px + (size_t)y * ow * hd.c, v.px + (size_t)y * v.stride, (size_t)ow * hd.c);
    } else {
        mgt_geom g = {.box = {0, 0, v.w, v.h},
                      .lim = {0, 0, v.w, v.h},
                      .sw = ow,
                      .sh = oh,
                      .ow = ow,
                      .oh = oh};
        mgt_resample rs;
        st = mgt_resample_plan(&g, MGT_INTERP_BILINEAR, hd.c, &w->ts, &rs);
        mgt_resample_out ro = {.u8 = px};
        if (st == MGT_OK)
            st = mgt_resample_run(&rs, &v, &ro);
        if (st != MGT_OK) {
            free(px);
            return (int)st;
        }
        m->reencoded = true;
    }
    if (o->format == MGT_PACK_RAW) {
        m->kind = KIND_RAW;
        m->bytes = px;
        m->len = npx;
        return 0;
    }
    unsigned char *jbuf = NULL;
    unsigned long jlen = 0;
    int rc = tjCompress2(w->tj, px, ow, 0, oh, hd.c == 1 ? TJPF_GRAY : TJPF_RGB, &jbuf, &jlen,
                         hd.c == 1 ? TJSAMP_GRAY : TJSAMP_420, o->quality, TJFLAG_ACCURATEDCT);
    free(px);
    if (rc != 0) {
        tjFree(jbuf);
        return (int)mgt_error_set(MGT_ERR_INVALID, "%s: JPEG encoding: %s", path,
                                  tjGetErrorStr2(w->tj));
    }
    m->kind = KIND_ENCODED;
    m->reencoded = true;
    m->len = jlen;
    m->bytes = malloc(jlen);
    if (m->bytes)
        memcpy(m->bytes, jbuf, jlen);
    tjFree(jbuf);
    return m->bytes ? 0 : (int)mgt_error_set(MGT_ERR_OOM, "pack: out of memory");
}

/* One split's records, appended to o in index order; its entries and strings are returned
   for writing after every split's records. */
typedef struct split_meta {
    const char *name;
    const mgt_dataset *ds;
    uint8_t *entries;
    uint8_t *strings;
    size_t strings_size;
} split_meta;

static mgt_status pack_split(const mgt_pack_options *o, pack_worker *workers, split_meta *sm,
                             pack_out *out, mgt_pack_stats *stats)
{
    const mgt_dataset *ds = sm->ds;
    size_t n = mgt_dataset_size(ds);
    /* strings: class names, then relative paths */
    size_t ssize = 0;
    for (int c = 0; c < mgt_dataset_class_count(ds); c++)
        ssize += strlen(mgt_dataset_class_name(ds, c)) + 1;
    for (size_t i = 0; i < n; i++)
        ssize += strlen(mgt_dataset_relpath(ds, i)) + 1;
    if (ssize > UINT32_MAX)
        return mgt_error_set(MGT_ERR_INVALID, "%s: too many file names for a pack",
                             mgt_dataset_dir(ds));
    sm->strings = malloc(ssize);
    sm->entries = calloc(n, ENTRY_SIZE);
    if (!sm->strings || !sm->entries)
        return mgt_error_set(MGT_ERR_OOM, "pack: out of memory");
    sm->strings_size = ssize;
    size_t at = 0;
    for (int c = 0; c < mgt_dataset_class_count(ds); c++) {
        size_t l = strlen(mgt_dataset_class_name(ds, c)) + 1;
        memcpy(sm->strings + at, mgt_dataset_class_name(ds, c), l);
        at += l;
    }
    const size_t window = 256;
    made *win = calloc(window, sizeof *win);
    if (!win)
        return mgt_error_set(MGT_ERR_OOM, "pack: out of memory");
    mgt_status st = MGT_OK;
    double t0 = mgt_time_now(), last = t0;
    for (size_t first = 0; first < n && st == MGT_OK; first += window) {
        size_t k = n - first < window ? n - first : window;
        memset(win, 0, k * sizeof *win);
        pack_job job = {.o = o, .ds = ds, .first = first, .out = win, .workers = workers};
        st = (mgt_status)mgt_data_parallel_for(k, o->workers, o->abort, pack_one, &job);
        for (size_t q = 0; q < k; q++) {
            made *m = &win[q];
            size_t i = first + q;
            if (st == MGT_OK) {
                out_pad(out, RECORD_ALIGN);
                uint8_t *e = sm->entries + i * ENTRY_SIZE;
                wr64(e, out->pos);
                wr32(e + 8, (uint32_t)m->len);
                wr32(e + 12, crc(m->bytes, m->len));
                wr32(e + 16, (uint32_t)mgt_dataset_label(ds, i));
                wr16(e + 20, m->w);
                wr16(e + 22, m->h);
                e[24] = m->kind;
                e[25] = m->c;
                wr32(e + 28, (uint32_t)at);
                size_t l = strlen(mgt_dataset_relpath(ds, i)) + 1;
                memcpy(sm->strings + at, mgt_dataset_relpath(ds, i), l);
                at += l;
                out_write(out, m->bytes, m->len);
                if (m->kind == KIND_BAD && o->bad) {
                    char text[1400];
                    snprintf(text, sizeof text, "%s/%s: %s", mgt_dataset_dir(ds),
                             mgt_dataset_relpath(ds, i), (const char *)m->bytes);
                    o->bad(o->bad_ctx, text);
                }
                stats->records++;
                stats->bad += m->kind == KIND_BAD;
                stats->reencoded += m->reencoded;
                stats->bytes_in_records += m->len;
            }
            free(m->bytes);
        }
        double now = mgt_time_now();
        if (o->progress && (now - last > 0.25 || first + k == n)) {
            last = now;
            fprintf(o->progress, "\rpacking %s: %zu of %zu (%.0f images/s)", mgt_dataset_dir(ds),
                    first + k, n, (double)(first + k) / (now - t0 > 0 ? now - t0 : 1e-9));
            if (first + k == n)
                fputc('\n', o->progress);
            fflush(o->progress);
        }
    }
    free(win);
    return st;
}

static int fsync_dir_of(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int e = fsync(fd) != 0 && errno != EINVAL ? errno : 0;
    close(fd);
    return e;
}

mgt_status mgt_pack_write(const mgt_pack_options *o, const mgt_dataset *const *splits,
                          const char *const *names, int nsplits, const char *out_path,
                          mgt_pack_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    if (nsplits < 1 || nsplits > 16)
        return mgt_error_set(MGT_ERR_INVALID, "pack: %d splits", nsplits);
    if (o->format != MGT_PACK_JPEG && o->format != MGT_PACK_RAW)
        return mgt_error_set(MGT_ERR_INVALID, "pack: unknown format %d", (int)o->format);
    if (o->quality < 1 || o->quality > 100)
        return mgt_error_set(MGT_ERR_INVALID, "pack: JPEG quality %d is not in 1..100", o->quality);
    for (int s = 0; s < nsplits; s++)
        if (strlen(names[s]) >= 16)
            return mgt_error_set(MGT_ERR_INVALID, "pack: split name '%s' is over 15 characters",
                                 names[s]);
    mgt_pack_options opt = *o;
    if (opt.workers <= 0)
        opt.workers = mgt_cpu_count();
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out_path, (long)getpid()) >= sizeof tmp)
        return mgt_error_set(MGT_ERR_INVALID, "%s: path too long", out_path);
    pack_out out = {.f = fopen(tmp, "wb")};
    if (!out.f)
        return mgt_error_set(MGT_ERR_IO, "%s: %s", tmp, strerror(errno));
    setvbuf(out.f, NULL, _IOFBF, 1 << 20);
    pack_worker *workers = calloc((size_t)opt.workers, sizeof *workers);
    split_meta sm[16] = {{0}};
    mgt_status st = workers ? MGT_OK : mgt_error_set(MGT_ERR_OOM, "pack: out of memory");
    for (int i = 0; st == MGT_OK && i < opt.workers; i++) {
        st = mgt_decoder_create(&workers[i].dec);
        if (st == MGT_OK && !(workers[i].tj = tjInitCompress()))
            st = mgt_error_set(MGT_ERR_OOM, "pack: TurboJPEG: %s", tjGetErrorStr2(NULL));
    }
    uint8_t header[HEADER_SIZE] = {0};
    out_write(&out, header, sizeof header); /* filled in at the end */
    for (int s = 0; st == MGT_OK && s < nsplits; s++) {
        sm[s].name = names[s];
        sm[s].ds = splits[s];
        st = pack_split(&opt, workers, &sm[s], &out, stats);
    }
    uint8_t table[16 * SPLIT_SIZE] = {0};
    for (int s = 0; st == MGT_OK && s < nsplits; s++) {
        size_t n = mgt_dataset_size(sm[s].ds);
        out_pad(&out, 8);
        uint64_t eoff = out.pos;
        out_write(&out, sm[s].entries, n * ENTRY_SIZE);
        uint64_t soff = out.pos;
        out_write(&out, sm[s].strings, sm[s].strings_size);
        uint8_t *row = table + (size_t)s * SPLIT_SIZE;
        memcpy(row, sm[s].name, strlen(sm[s].name));
        wr64(row + 16, n);
        wr32(row + 24, (uint32_t)mgt_dataset_class_count(sm[s].ds));
        wr32(row + 28, crc(sm[s].entries, n * ENTRY_SIZE));
        wr64(row + 32, eoff);
        wr64(row + 40, soff);
        wr64(row + 48, sm[s].strings_size);
        wr32(row + 56, crc(sm[s].strings, sm[s].strings_size));
    }
    if (st == MGT_OK) {
        out_pad(&out, 8);
        uint64_t toff = out.pos;
        out_write(&out, table, (size_t)nsplits * SPLIT_SIZE);
        memcpy(header, PACK_MAGIC "\0", 8);
        wr32(header + 8, PACK_VERSION);
        wr32(header + 12, (uint32_t)nsplits);
        wr64(header + 16, toff);
        wr32(header + 24, crc(table, (size_t)nsplits * SPLIT_SIZE));
        wr32(header + 28, (uint32_t)opt.format);
        wr32(header + 32, (uint32_t)(opt.max_side > 0 ? opt.max_side : 0));
        wr32(header + 36, (uint32_t)opt.quality);
        wr32(header + 60, crc(header, 60));
        stats->file_bytes = out.pos;
        if (out.err == 0 && fseek(out.f, 0, SEEK_SET) != 0)
            out.err = errno;
        if (out.err == 0 && fwrite(header, 1, sizeof header, out.f) != sizeof header)
            out.err = errno ? errno : EIO;
        if (out.err == 0 && fflush(out.f) != 0)
            out.err = errno;
        if (out.err == 0 && fsync(fileno(out.f)) != 0)
            out.err = errno;
    }
    if (fclose(out.f) != 0 && out.err == 0)
        out.err = errno;
    if (st == MGT_OK && out.err != 0)
        st = mgt_error_set(MGT_ERR_IO, "%s: %s", tmp, strerror(out.err));
    if (st == MGT_OK && rename(tmp, out_path) != 0)
        st = mgt_error_set(MGT_ERR_IO, "%s: %s", out_path, strerror(errno));
    if (st == MGT_OK) {
        int e = fsync_dir_of(out_path);
        if (e)
            st = mgt_error_set(MGT_ERR_IO, "%s: syncing its folder: %s", out_path, strerror(e));
    } else {
        unlink(tmp);
    }
    for (int s = 0; s < nsplits; s++) {
        free(sm[s].entries);
        free(sm[s].strings);
    }
    for (int i = 0; workers && i < opt.workers; i++) {
        mgt_decoder_free(workers[i].dec);
        if (workers[i].tj)
            tjDestroy(workers[i].tj);
        free(workers[i].file);
        mgt_transform_scratch_free(&workers[i].ts);
    }
    free(workers);
    return st;
}
