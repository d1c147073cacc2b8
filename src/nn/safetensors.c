/* Safetensors reader (validates a hostile file completely before anyone sees a tensor) and
   atomic writer, on top of cJSON. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "mgt/safetensors.h"

/* cJSON holds numbers as doubles, exact only up to 2^53: the reader refuses larger shape
   entries and offsets rather than round them, and the writer never writes them. */
#define ST_MAX_INT ((uint64_t)1 << 53)

/* Tensor names can be long and arbitrary; error texts show at most this many bytes. */
#define ST_NAME_SHOWN 120

static const struct {
    const char *name;
    size_t size;
} dtype_table[] = {
    [MGT_ST_F64] = {"F64", 8},   [MGT_ST_F32] = {"F32", 4}, [MGT_ST_F16] = {"F16", 2},
    [MGT_ST_BF16] = {"BF16", 2}, [MGT_ST_I64] = {"I64", 8}, [MGT_ST_I32] = {"I32", 4},
    [MGT_ST_I16] = {"I16", 2},   [MGT_ST_I8] = {"I8", 1},   [MGT_ST_U8] = {"U8", 1},
    [MGT_ST_BOOL] = {"BOOL", 1},
};
#define ST_NDTYPES ((int)(sizeof dtype_table / sizeof dtype_table[0]))

size_t mgt_st_dtype_size(mgt_st_dtype dtype)
{
    return (unsigned)dtype < (unsigned)ST_NDTYPES ? dtype_table[dtype].size : 0;
}

const char *mgt_st_dtype_name(mgt_st_dtype dtype)
{
    return (unsigned)dtype < (unsigned)ST_NDTYPES ? dtype_table[dtype].name : "?";
}

/* The data section is copied byte for byte, so a big-endian host would see every element
   byte-swapped; refusing is cheaper than swapping until someone needs one. */
static bool host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

/* The length of the well-formed UTF-8 sequence at s (Unicode table 3-7: no overlong forms,
   no surrogates, nothing past U+10FFFF), or 0 when there is none within avail bytes. */
static size_t utf8_seq_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c < 0x80) {
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k < n; k++)
        if (s[k] < 0x80 || s[k] > 0xBF)
            return 0;
    return n;
}

static bool utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t len = strlen(s);
    for (size_t i = 0; i < len;) {
        size_t n = utf8_seq_len(p + i, len - i);
        if (n == 0)
            return false;
        i += n;
    }
    return true;
}

/* A safetensors header nests three levels ({ { [); refusing more gives a clear reason and
   keeps cJSON's recursion shallow. */
#define ST_MAX_DEPTH 64
#define ST_MAX_DEPTH_TEXT "64"

/* What cJSON lets through and we must not: bytes that are not UTF-8, raw control characters
   (JSON allows none in strings and only whitespace outside them; cJSON accepts them in
   strings), and the \u0000 escape, which cJSON decodes into a NUL that silently cuts a name
   short so that two different names could compare equal; also nesting past ST_MAX_DEPTH.
   Returns NULL when the text is clean, else why not with *at set to the offending byte. */
static const char *header_text_problem(const unsigned char *s, size_t len, size_t *at)
{
    bool in_string = false;
    int depth = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        *at = i;
        if (c >= 0x80) {
            size_t n = utf8_seq_len(s + i, len - i);
            if (n == 0)
                return "is not valid UTF-8";
            i += n;
            continue;
        }
        if (c < 0x20 && (in_string || (c != ' ' && c != '\t' && c != '\n' && c != '\r')))
            return "holds a raw control character";
        if (in_string && c == '\\') {
            if (i + 1 < len && s[i + 1] < 0x20)
                return "holds a raw control character";
            if (i + 6 <= len && memcmp(s + i + 1, "u0000", 5) == 0)
                return "holds a \\u0000 escape (a NUL inside a string)";
            /* skip the escaped byte unless it starts a multi-byte sequence, which the UTF-8
               check must still see (cJSON refuses such an escape anyway) */
            i += (i + 1 < len && s[i + 1] < 0x80) ? 2 : 1;
            continue;
        }
        if (c == '"') {
            in_string = !in_string;
        } else if (!in_string && (c == '{' || c == '[')) {
            if (++depth > ST_MAX_DEPTH)
                return "nests deeper than " ST_MAX_DEPTH_TEXT " levels";
        } else if (!in_string && (c == '}' || c == ']') && depth > 0) {
            depth--;
        }
        i++;
    }
    return NULL;
}

/* ---- reader ---- */

typedef struct st_tensor {
    const char *name; /* in the file's cJSON tree */
    mgt_st_dtype dtype;
    int ndim;
    size_t dims_at; /* first dim in mgt_st_file.dims */
    uint64_t numel;
    uint64_t begin, end; /* within the data section */
} st_tensor;

typedef struct st_name_ix {
    const char *name;
    int ix;
} st_name_ix;

typedef struct st_span_ix {
    uint64_t begin, end;
    int ix;
} st_span_ix;

typedef struct st_meta {
    const char *key, *value; /* in the cJSON tree */
} st_meta;

struct mgt_st_file {
    unsigned char *buf; /* the whole file, owned */
    size_t len;
    const unsigned char *data; /* the data section: buf + 8 + header length */
    size_t data_len;
    cJSON *json; /* the parsed header; names and metadata point into it */
    st_tensor *tensors;
    int n;
    st_name_ix *by_name; /* sorted by name, for mgt_st_find */
    int64_t *dims;
    size_t ndims, dims_cap;
    st_meta *meta;
    int nmeta;
};

void mgt_st_close(mgt_st_file *f)
{
    if (f == NULL)
        return;
    cJSON_Delete(f->json);
    free(f->buf);
    free(f->tensors);
    free(f->by_name);
    free(f->dims);
    free(f->meta);
    free(f);
}

static int cmp_name_ix(const void *a, const void *b)
{
    return strcmp(((const st_name_ix *)a)->name, ((const st_name_ix *)b)->name);
}

static int cmp_span_ix(const void *a, const void *b)
{
    const st_span_ix *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_meta(const void *a, const void *b)
{
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

typedef enum st_uint_problem {
    ST_UINT_OK,
    ST_UINT_NOT_NUMBER,
    ST_UINT_NOT_INTEGER,
    ST_UINT_NEGATIVE,
    ST_UINT_TOO_BIG,
} st_uint_problem;

static const char *uint_problem_text(st_uint_problem p)
{
    switch (p) {
    case ST_UINT_OK: return "fine";
    case ST_UINT_NOT_NUMBER: return "not a number";
    case ST_UINT_NOT_INTEGER: return "not an integer";
    case ST_UINT_NEGATIVE: return "negative";
    case ST_UINT_TOO_BIG: return "larger than 2^53";
    }
    return "bad";
}

static st_uint_problem json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return ST_UINT_NOT_NUMBER;
    double d = v->valuedouble;
    if (d != d)
        return ST_UINT_NOT_INTEGER;
    if (d < 0)
        return ST_UINT_NEGATIVE;
    if (d > (double)ST_MAX_INT)
        return ST_UINT_TOO_BIG;
    uint64_t u = (uint64_t)d;
    if ((double)u != d)
        return ST_UINT_NOT_INTEGER;
    *out = u;
    return ST_UINT_OK;
}

/* The member of obj called key when there is exactly one; counts it in *count so that a
   duplicated field, which cJSON keeps and other readers might resolve differently, can be
   refused. */
static const cJSON *json_field(const cJSON *obj, const char *key, int *count)
{
    const cJSON *found = NULL, *it;
    *count = 0;
    cJSON_ArrayForEach(it, obj)
    {
        if (strcmp(it->string, key) == 0) {
            if (found == NULL)
                found = it;
            ++*count;
        }
    }
    return found;
}

static mgt_status push_dim(mgt_st_file *f, int64_t d, const char *what)
{
    if (f->ndims == f->dims_cap) {
        size_t cap = f->dims_cap ? 2 * f->dims_cap : 64;
        int64_t *p = realloc(f->dims, cap * sizeof *p);
        if (p == NULL)
            return mgt_error_set(MGT_ERR_OOM, "%s: no memory for the tensor shapes", what);
        f->dims = p;
        f->dims_cap = cap;
    }
    f->dims[f->ndims++] = d;
    return MGT_OK;
}

/* Checks one tensor entry of the header and fills t; the offsets are checked against the
   data section here, the tiling of all tensors later. */
static mgt_status parse_tensor(mgt_st_file *f, const cJSON *item, st_tensor *t, const char *what)
{
    const char *name = item->string;
    int count;
    mgt_status st;
    t->name = name;
    if (!cJSON_IsObject(item))
        return mgt_error_set(MGT_ERR_INVALID, "%s: tensor \"%.*s\": entry is not a JSON object",
                             what, ST_NAME_SHOWN, name);

    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    const cJSON *v[3];
    for (int k = 0; k < 3; k++) {
        v[k] = json_field(item, fields[k], &count);
        if (count == 0)
            return mgt_error_set(MGT_ERR_INVALID, "%s: tensor \"%.*s\": missing \"%s\"", what,
                                 ST_NAME_SHOWN, name, fields[k]);
        if (count > 1)
            return mgt_error_set(MGT_ERR_INVALID, "%s: tensor \"%.*s\": \"%s\" appears %d times",
                                 what, ST_NAME_SHOWN, name, fields[k], count);
    }

    if (!cJSON_IsString(v[0]))
        return mgt_error_set(MGT_ERR_INVALID, "%s: tensor \"%.*s\": dtype is not a string", what,
                             ST_NAME_SHOWN, name);
    int dt = 0;
    while (dt < ST_NDTYPES && strcmp(dtype_table[dt].name, v[0]->valuestring) != 0)
        dt++;
    if (dt == ST_NDTYPES)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: tensor \"%.*s\": unsupported dtype \"%.32s\" (mgtrain reads "
                             "F64, F32, F16, BF16, I64, I32, I16, I8, U8 and BOOL)",
                             what, ST_NAME_SHOWN, name, v[0]->valuestring);
    t->dtype = (mgt_st_dtype)dt;

    if (!cJSON_IsArray(v[1]))
        return mgt_error_set(MGT_ERR_INVALID, "%s: tensor \"%.*s\": shape is not a list", what,
                             ST_NAME_SHOWN, name);
    t->dims_at = f->ndims;
    t->ndim = 0;
    t->numel = 1;
    const cJSON *it;
    bool overflow = false;
    cJSON_ArrayForEach(it, v[1])
    {
        uint64_t d = 0;
        st_uint_problem p = json_uint(it, &d);
        if (p != ST_UINT_OK)
            return mgt_error_set(MGT_ERR_INVALID, "%s: tensor \"%.*s\": shape entry %d is %s", what,
                                 ST_NAME_SHOWN, name, t->ndim, uint_problem_text(p));
        /* like the reference reader, an overflow counts even if a later dim is 0 */
        if (!overflow && __builtin_mul_overflow(t->numel, d, &t->numel))
            overflow = true;
        if ((st = push_dim(f, (int64_t)d, what)) != MGT_OK)
            return st;
        t->ndim++;
    }
    uint64_t bytes;
    if (overflow || __builtin_mul_overflow(t->numel, (uint64_t)dtype_table[dt].size, &bytes))
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: tensor \"%.*s\": the shape's size overflows 64 bits", what,
                             ST_NAME_SHOWN, name);

    if (!cJSON_IsArray(v[2]) || cJSON_GetArraySize(v[2]) != 2)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: tensor \"%.*s\": data_offsets is not a list of two integers",
                             what, ST_NAME_SHOWN, name);
    uint64_t off[2];
    for (int k = 0; k < 2; k++) {
        st_uint_problem p = json_uint(cJSON_GetArrayItem(v[2], k), &off[k]);
        if (p != ST_UINT_OK)
            return mgt_error_set(MGT_ERR_INVALID, "%s: tensor \"%.*s\": data_offsets[%d] is %s",
                                 what, ST_NAME_SHOWN, name, k, uint_problem_text(p));
    }
    if (off[0] > off[1])
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: tensor \"%.*s\": data_offsets [%" PRIu64 ", %" PRIu64
                             "] are reversed",
                             what, ST_NAME_SHOWN, name, off[0], off[1]);
    if (off[1] > f->data_len)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: tensor \"%.*s\": data_offsets [%" PRIu64 ", %" PRIu64
                             "] reach beyond the data section (%zu bytes)",
                             what, ST_NAME_SHOWN, name, off[0], off[1], f->data_len);
    if (off[1] - off[0] != bytes)
        return mgt_error_set(MGT_ERR_INVALID,
                             "%s: tensor \"%.*s\": data_offsets span %" PRIu64 " bytes but %" PRIu64
                             " element(s) of %s need %" PRIu64,
                             what, ST_NAME_SHOWN, name, off[1] - off[0], t->numel,
                             dtype_table[dt].name, bytes);
    t->begin = off[0];
    t->end = off[1];
    return MGT_OK;
}

static mgt_status parse_metadata(mgt_st_file *f, const cJSON *item, const char *what)
{
    if (!cJSON_IsObject(item))
        return mgt_error_set(MGT_ERR_INVALID, "%s: __metadata__ is not a JSON object", what);
    int n = cJSON_GetArraySize(item);
    f->meta = malloc((n ? (size_t)n : 1) * sizeof *f->meta);
    if (f->meta == NULL)
        return mgt_error_set(MGT_ERR_OOM, "%s: no memory for the metadata", what);
    const cJSON *it;
    cJSON_ArrayForEach(it, item)
    {
        if (!cJSON_IsString(it))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "%s: metadata \"%.*s\" is not a string (values must be)", what,
                                 ST_NAME_SHOWN, it->string);
        f->meta[f->nmeta++] = (st_meta){it->string, it->valuestring};
    }
    /* a sorted copy finds duplicate keys, which readers would resolve differently */
    st_meta *sorted = malloc((n ? (size_t)n : 1) * sizeof *sorted);
    if (sorted == NULL)
        return mgt_error_set(MGT_ERR_OOM, "%s: no memory for the metadata", what);
    memcpy(sorted, f->meta, (size_t)f->nmeta * sizeof *sorted);
    qsort(sorted, (size_t)f->nmeta, sizeof *sorted, cmp_meta);
    mgt_status st = MGT_OK;
    for (int i = 1; i < f->nmeta; i++) {
        if (strcmp(sorted[i - 1].key, sorted[i].key) == 0) {
            st = mgt_error_set(MGT_ERR_INVALID, "%s: metadata key \"%.*s\" appears twice", what,
                               ST_NAME_SHOWN, sorted[i].key);
            break;
        }
    }
    free(sorted);
    return st;
}

/* The tensors must tile the data section exactly, as the reference reader demands: sorted by
   offsets, each begins where the previous one ended and the last ends at the end of the
   file. A hole or trailing bytes would be data no tensor owns. */
static mgt_status check_tiling(const mgt_st_file *f, const char *what)
{
    st_span_ix *spans = malloc((f->n ? (size_t)f->n : 1) * sizeof *spans);
    if (spans == NULL)
        return mgt_error_set(MGT_ERR_OOM, "%s: no memory to check the data offsets", what);
    for (int i = 0; i < f->n; i++)
        spans[i] = (st_span_ix){f->tensors[i].begin, f->tensors[i].end, i};
    qsort(spans, (size_t)f->n, sizeof *spans, cmp_span_ix);
    mgt_status st = MGT_OK;
    uint64_t cursor = 0;
    for (int i = 0; i < f->n && st == MGT_OK; i++) {
        const st_tensor *t = &f->tensors[spans[i].ix];
        if (t->begin < cursor) {
            st = mgt_error_set(
                MGT_ERR_INVALID, "%s: tensors \"%.*s\" and \"%.*s\" overlap in the data section",
                what, ST_NAME_SHOWN, f->tensors[spans[i - 1].ix].name, ST_NAME_SHOWN, t->name);
        } else if (t->begin > cursor) {
            st = mgt_error_set(MGT_ERR_INVALID,
                               "%s: data bytes [%" PRIu64 ", %" PRIu64
                               ") belong to no tensor (a hole before \"%.*s\")",
                               what, cursor, t->begin, ST_NAME_SHOWN, t->name);
        }
        cursor = t->end;
    }
    if (st == MGT_OK && cursor != f->data_len)
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: %" PRIu64 " trailing bytes after the last tensor's data", what,
                           (uint64_t)f->data_len - cursor);
    free(spans);
    return st;
}

/* What a file that is not safetensors is, where its first bytes say so (NULL otherwise): a
   weights file from PyTorch is the common mistake, and its first 8 bytes read as a header
   length would only give a meaningless "exceeds the limit". torch.save writes a zip archive
   whose first entry is ARCHIVE/data.pkl (since PyTorch 1.6), or before that a pickle that
   opens with protocol 2 and a 10-byte long, its magic number. */
static const char *foreign_format(const unsigned char *buf, size_t len)
{
    if (len >= 30 && memcmp(buf, "PK\x03\x04", 4) == 0) {
        size_t name_len = (size_t)buf[26] | (size_t)buf[27] << 8;
        const char *name = (const char *)buf + 30;
        if (30 + name_len <= len && name_len >= 8 &&
            memcmp(name + name_len - 8, "data.pkl", 8) == 0)
            return "a PyTorch torch.save file (zip archive), not safetensors";
        return "a zip archive (PyTorch's torch.save writes those), not safetensors";
    }
    if (len >= 4 && buf[0] == 0x80 && buf[1] == 0x02 && buf[2] == 0x8a && buf[3] == 0x0a)
        return "a PyTorch torch.save file (its legacy pickle format), not safetensors";
    if (len >= 2 && buf[0] == 0x80 && buf[1] >= 2 && buf[1] <= 5)
        return "a Python pickle (torch.save's legacy format?), not safetensors";
    return NULL;
}

/* Validates the file in buf, which it takes over (freed on failure). */
static mgt_status parse_owned(unsigned char *buf, size_t len, const char *what, mgt_st_file **out)
{
    mgt_status st = MGT_OK;
    char *text = NULL;
    mgt_st_file *f = NULL;
    *out = NULL;

    if (!host_is_little_endian()) {
        st = mgt_error_set(MGT_ERR_UNSUPPORTED,
                           "%s: safetensors data is little-endian and this host is not", what);
        goto done;
    }
    if (len < 8) {
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: file is %zu bytes, too short for the 8-byte header length", what,
                           len);
        goto done;
    }
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--)
        hlen = hlen << 8 | buf[k];
    const char *foreign = foreign_format(buf, len);
    if (hlen > MGT_ST_MAX_HEADER_BYTES && foreign) {
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: %s: convert it with `python3 scripts/pth_to_safetensors.py %s "
                           "OUT.safetensors` (needs PyTorch) and give OUT.safetensors",
                           what, foreign, what);
        goto done;
    }
    if (hlen > MGT_ST_MAX_HEADER_BYTES) {
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: header length %" PRIu64 " exceeds the limit of %u bytes", what,
                           hlen, MGT_ST_MAX_HEADER_BYTES);
        goto done;
    }
    if (hlen > len - 8) {
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: header length %" PRIu64
                           " reaches beyond the end of the file (%zu bytes after the length)",
                           what, hlen, len - 8);
        goto done;
    }
    const unsigned char *header = buf + 8;
    size_t at = 0;
    const char *why;
    if (hlen == 0 || header[0] != '{') {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: header does not start with '{'", what);
        goto done;
    }
    if ((why = header_text_problem(header, hlen, &at)) != NULL) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: header %s at byte %zu", what, why, at);
        goto done;
    }

    f = calloc(1, sizeof *f);
    /* a NUL-terminated copy: cJSON then cannot read past the header whatever it does */
    text = malloc(hlen + 1);
    if (f == NULL || text == NULL) {
        st = mgt_error_set(MGT_ERR_OOM, "%s: no memory for a %" PRIu64 "-byte header", what, hlen);
        goto done;
    }
    memcpy(text, header, hlen);
    text[hlen] = '\0';
    f->buf = buf;
    buf = NULL;
    f->len = len;
    f->data = f->buf + 8 + hlen;
    f->data_len = len - 8 - hlen;

    const char *end = NULL;
    f->json = cJSON_ParseWithLengthOpts(text, hlen, &end, 0);
    if (f->json == NULL) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: header is malformed JSON near byte %td", what,
                           end ? end - text : (ptrdiff_t)0);
        goto done;
    }
    for (const char *p = end; p < text + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = mgt_error_set(MGT_ERR_INVALID,
                               "%s: header has bytes after its JSON object at byte %td", what,
                               p - text);
            goto done;
        }
    }
    if (!cJSON_IsObject(f->json)) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: header is not a JSON object", what);
        goto done;
    }

    int entries = cJSON_GetArraySize(f->json);
    f->tensors = malloc((entries ? (size_t)entries : 1) * sizeof *f->tensors);
    f->by_name = malloc((entries ? (size_t)entries : 1) * sizeof *f->by_name);
    if (f->tensors == NULL || f->by_name == NULL) {
        st = mgt_error_set(MGT_ERR_OOM, "%s: no memory for %d tensors", what, entries);
        goto done;
    }
    bool have_meta = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, f->json)
    {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (have_meta) {
                st = mgt_error_set(MGT_ERR_INVALID, "%s: __metadata__ appears twice", what);
                goto done;
            }
            have_meta = true;
            if ((st = parse_metadata(f, it, what)) != MGT_OK)
                goto done;
            continue;
        }
        if ((st = parse_tensor(f, it, &f->tensors[f->n], what)) != MGT_OK)
            goto done;
        f->by_name[f->n] = (st_name_ix){it->string, f->n};
        f->n++;
    }
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name_ix);
    for (int i = 1; i < f->n; i++) {
        if (strcmp(f->by_name[i - 1].name, f->by_name[i].name) == 0) {
            st = mgt_error_set(MGT_ERR_INVALID, "%s: tensor \"%.*s\" appears twice", what,
                               ST_NAME_SHOWN, f->by_name[i].name);
            goto done;
        }
    }
    st = check_tiling(f, what);

done:
    free(text);
    free(buf);
    if (st != MGT_OK) {
        mgt_st_close(f);
        f = NULL;
    }
    *out = f;
    return st;
}

mgt_status mgt_st_parse(const void *buf, size_t len, const char *name_for_errors, mgt_st_file **out)
{
    const char *what = name_for_errors ? name_for_errors : "<memory>";
    *out = NULL;
    if (buf == NULL && len > 0)
        return mgt_error_set(MGT_ERR_INVALID, "%s: no buffer for %zu bytes", what, len);
    unsigned char *copy = malloc(len ? len : 1);
    if (copy == NULL)
        return mgt_error_set(MGT_ERR_OOM, "%s: no memory to copy %zu bytes", what, len);
    if (len > 0)
        memcpy(copy, buf, len);
    return parse_owned(copy, len, what, out);
}

mgt_status mgt_st_open(const char *path, mgt_st_file **out)
{
    mgt_status st = MGT_OK;
    unsigned char *buf = NULL;
    *out = NULL;
    if (path == NULL)
        return mgt_error_set(MGT_ERR_INVALID, "safetensors: no path given");
    /* O_NONBLOCK so that a FIFO handed in by mistake is refused below instead of hanging */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return mgt_error_set(MGT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = mgt_error_set(MGT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: not a regular file", path);
        goto done;
    }
    if ((uint64_t)sb.st_size >= SIZE_MAX) {
        st = mgt_error_set(MGT_ERR_OOM, "%s: too large to read (%jd bytes)", path,
                           (intmax_t)sb.st_size);
        goto done;
    }
    size_t len = (size_t)sb.st_size, got = 0;
    /* read, not mmap: a file truncated under a mapping would kill us with SIGBUS */
    buf = malloc(len ? len : 1);
    if (buf == NULL) {
        st = mgt_error_set(MGT_ERR_OOM, "%s: no memory to read %zu bytes", path, len);
        goto done;
    }
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = mgt_error_set(MGT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
            goto done;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got != len) {
        st = mgt_error_set(MGT_ERR_IO, "%s: the file shrank while it was read (%zu of %zu bytes)",
                           path, got, len);
        goto done;
    }
    close(fd);
    fd = -1;
    st = parse_owned(buf, len, path, out);
    buf = NULL;

done:
    if (fd >= 0)
        close(fd);
    free(buf);
    return st;
}

int mgt_st_count(const mgt_st_file *f) { return f->n; }

int mgt_st_find(const mgt_st_file *f, const char *name)
{
    st_name_ix key = {name, -1};
    const st_name_ix *hit = bsearch(&key, f->by_name, (size_t)f->n, sizeof key, cmp_name_ix);
    return hit ? hit->ix : -1;
}

static const st_tensor *tensor_at(const mgt_st_file *f, int i)
{
    MGT_ASSERT(i >= 0 && i < f->n);
    return &f->tensors[i];
}

const char *mgt_st_tensor_name(const mgt_st_file *f, int i) { return tensor_at(f, i)->name; }

mgt_st_dtype mgt_st_tensor_dtype(const mgt_st_file *f, int i) { return tensor_at(f, i)->dtype; }

int mgt_st_tensor_ndim(const mgt_st_file *f, int i) { return tensor_at(f, i)->ndim; }

const int64_t *mgt_st_tensor_shape(const mgt_st_file *f, int i)
{
    const st_tensor *t = tensor_at(f, i);
    return t->ndim ? f->dims + t->dims_at : NULL;
}

uint64_t mgt_st_tensor_numel(const mgt_st_file *f, int i) { return tensor_at(f, i)->numel; }

size_t mgt_st_tensor_bytes(const mgt_st_file *f, int i)
{
    const st_tensor *t = tensor_at(f, i);
    return (size_t)(t->end - t->begin);
}

const void *mgt_st_tensor_data(const mgt_st_file *f, int i)
{
    return f->data + tensor_at(f, i)->begin;
}

const char *mgt_st_metadata_get(const mgt_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}

int mgt_st_metadata_count(const mgt_st_file *f) { return f->nmeta; }

const char *mgt_st_metadata_key(const mgt_st_file *f, int i)
{
    MGT_ASSERT(i >= 0 && i < f->nmeta);
    return f->meta[i].key;
}

const char *mgt_st_metadata_value(const mgt_st_file *f, int i)
{
    MGT_ASSERT(i >= 0 && i < f->nmeta);
    return f->meta[i].value;
}

/* ---- writer ---- */

typedef struct st_wtensor {
    char *name;
    mgt_st_dtype dtype;
    int ndim;
    int64_t *shape;
    const void *data; /* borrowed */
    uint64_t bytes;
} st_wtensor;

typedef struct st_wmeta {
    char *key, *value;
} st_wmeta;

struct mgt_st_writer {
    st_wtensor *t;
    size_t n, cap;
    st_wmeta *meta;
    size_t nmeta, meta_cap;
};

const char *mgt_st_writer_nonfinite(const mgt_st_writer *w, size_t *count)
{
    const char *first = NULL;
    size_t bad = 0;
    for (size_t i = 0; i < w->n; i++) {
        const st_wtensor *t = &w->t[i];
        size_t before = bad;
        if (t->dtype == MGT_ST_F32)
            for (uint64_t k = 0; k < t->bytes / sizeof(float); k++)
                bad += !isfinite(((const float *)t->data)[k]);
        else if (t->dtype == MGT_ST_F64)
            for (uint64_t k = 0; k < t->bytes / sizeof(double); k++)
                bad += !isfinite(((const double *)t->data)[k]);
        else if (t->dtype == MGT_ST_F16 || t->dtype == MGT_ST_BF16) {
            /* a half's exponent all ones: an infinity or a NaN */
            const uint16_t e = t->dtype == MGT_ST_F16 ? 0x7c00 : 0x7f80;
            for (uint64_t k = 0; k < t->bytes / sizeof(uint16_t); k++) {
                uint16_t h;
                memcpy(&h, (const unsigned char *)t->data + k * sizeof h, sizeof h);
                bad += (h & e) == e;
            }
        }
        if (bad > before && !first)
            first = t->name;
    }
    if (count)
        *count = bad;
    return first;
}

mgt_status mgt_st_writer_create(mgt_st_writer **out)
{
    *out = NULL;
    if (!host_is_little_endian())
        return mgt_error_set(MGT_ERR_UNSUPPORTED,
                             "safetensors writer: data must be little-endian and this host is not");
    *out = calloc(1, sizeof **out);
    if (*out == NULL)
        return mgt_error_set(MGT_ERR_OOM, "safetensors writer: no memory");
    return MGT_OK;
}

void mgt_st_writer_free(mgt_st_writer *w)
{
    if (w == NULL)
        return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].shape);
    }
    for (size_t i = 0; i < w->nmeta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->t);
    free(w->meta);
    free(w);
}

mgt_status mgt_st_writer_add(mgt_st_writer *w, const char *name, mgt_st_dtype dtype, int ndim,
                             const int64_t *shape, const void *data)
{
    if (w == NULL || name == NULL)
        return mgt_error_set(MGT_ERR_INVALID, "safetensors writer: no writer or no name");
    if (!utf8_valid(name) || strcmp(name, "__metadata__") == 0)
        return mgt_error_set(MGT_ERR_INVALID,
                             "safetensors writer: \"%.*s\" cannot name a tensor (not UTF-8, "
                             "or reserved)",
                             ST_NAME_SHOWN, name);
    if ((unsigned)dtype >= (unsigned)ST_NDTYPES)
        return mgt_error_set(MGT_ERR_INVALID, "safetensors writer: tensor \"%.*s\": bad dtype %d",
                             ST_NAME_SHOWN, name, (int)dtype);
    if (ndim < 0 || (ndim > 0 && shape == NULL))
        return mgt_error_set(MGT_ERR_INVALID,
                             "safetensors writer: tensor \"%.*s\": bad ndim %d or no shape",
                             ST_NAME_SHOWN, name, ndim);
    uint64_t numel = 1, bytes;
    bool overflow = false;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0 || (uint64_t)shape[k] > ST_MAX_INT)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "safetensors writer: tensor \"%.*s\": dim %d is %" PRId64
                                 " (must be 0..2^53)",
                                 ST_NAME_SHOWN, name, k, shape[k]);
        overflow |= __builtin_mul_overflow(numel, (uint64_t)shape[k], &numel);
    }
    if (overflow || __builtin_mul_overflow(numel, (uint64_t)dtype_table[dtype].size, &bytes) ||
        bytes > ST_MAX_INT || bytes > SIZE_MAX)
        return mgt_error_set(MGT_ERR_INVALID,
                             "safetensors writer: tensor \"%.*s\": the shape is too large",
                             ST_NAME_SHOWN, name);
    if (data == NULL && bytes > 0)
        return mgt_error_set(MGT_ERR_INVALID, "safetensors writer: tensor \"%.*s\": no data",
                             ST_NAME_SHOWN, name);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return mgt_error_set(MGT_ERR_INVALID,
                                 "safetensors writer: tensor \"%.*s\" was added twice",
                                 ST_NAME_SHOWN, name);

    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        st_wtensor *p = realloc(w->t, cap * sizeof *p);
        if (p == NULL)
            return mgt_error_set(MGT_ERR_OOM, "safetensors writer: no memory");
        w->t = p;
        w->cap = cap;
    }
    st_wtensor t = {
        .name = strdup(name), .dtype = dtype, .ndim = ndim, .data = data, .bytes = bytes};
    t.shape = malloc((ndim ? (size_t)ndim : 1) * sizeof *t.shape);
    if (t.name == NULL || t.shape == NULL) {
        free(t.name);
        free(t.shape);
        return mgt_error_set(MGT_ERR_OOM, "safetensors writer: no memory");
    }
    if (ndim > 0)
        memcpy(t.shape, shape, (size_t)ndim * sizeof *t.shape);
    w->t[w->n++] = t;
    return MGT_OK;
}

mgt_status mgt_st_writer_set_metadata(mgt_st_writer *w, const char *key, const char *value)
{
    if (w == NULL || key == NULL || value == NULL)
        return mgt_error_set(MGT_ERR_INVALID, "safetensors writer: no writer, key or value");
    if (!utf8_valid(key) || !utf8_valid(value))
        return mgt_error_set(MGT_ERR_INVALID,
                             "safetensors writer: metadata \"%.*s\": key or value is not UTF-8",
                             ST_NAME_SHOWN, key);
    char *v = strdup(value);
    if (v == NULL)
        return mgt_error_set(MGT_ERR_OOM, "safetensors writer: no memory");
    for (size_t i = 0; i < w->nmeta; i++) {
        if (strcmp(w->meta[i].key, key) == 0) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return MGT_OK;
        }
    }
    if (w->nmeta == w->meta_cap) {
        size_t cap = w->meta_cap ? 2 * w->meta_cap : 8;
        st_wmeta *p = realloc(w->meta, cap * sizeof *p);
        if (p == NULL) {
            free(v);
            return mgt_error_set(MGT_ERR_OOM, "safetensors writer: no memory");
        }
        w->meta = p;
        w->meta_cap = cap;
    }
    char *k = strdup(key);
    if (k == NULL) {
        free(v);
        return mgt_error_set(MGT_ERR_OOM, "safetensors writer: no memory");
    }
    w->meta[w->nmeta++] = (st_wmeta){k, v};
    return MGT_OK;
}

/* Integers go in as raw text: cJSON would print numbers past 2^31 with "%g" and could
   write 1e+15, which readers that want an integer refuse. */
static bool add_uint(cJSON *array, uint64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%" PRIu64, v);
    cJSON *item = cJSON_CreateRaw(text);
    if (item != NULL && cJSON_AddItemToArray(array, item))
        return true;
    cJSON_Delete(item);
    return false;
}

/* The header JSON, tensors in the order added, __metadata__ first as the reference writer
   puts it. NULL when memory runs out. */
static char *build_header(const mgt_st_writer *w)
{
    char *text = NULL;
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && w->nmeta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (size_t i = 0; ok && i < w->nmeta; i++)
            ok = cJSON_AddStringToObject(m, w->meta[i].key, w->meta[i].value) != NULL;
    }
    uint64_t offset = 0;
    for (size_t i = 0; ok && i < w->n; i++) {
        const st_wtensor *t = &w->t[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = NULL, *offsets = NULL;
        ok = e != NULL && cJSON_AddStringToObject(e, "dtype", dtype_table[t->dtype].name) &&
             (shape = cJSON_AddArrayToObject(e, "shape")) != NULL;
        for (int k = 0; ok && k < t->ndim; k++)
            ok = add_uint(shape, (uint64_t)t->shape[k]);
        ok = ok && (offsets = cJSON_AddArrayToObject(e, "data_offsets")) != NULL &&
             add_uint(offsets, offset) && add_uint(offsets, offset + t->bytes);
        offset += t->bytes;
    }
    if (ok)
        text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* rio's sticky error flag: writes after the first failure do nothing, and the caller checks
   once, at the end, keeping the errno of the first failure. */
typedef struct st_out {
    FILE *fp;
    int err;
} st_out;

static void out_write(st_out *o, const void *p, size_t n)
{
    if (o->err != 0 || n == 0)
        return;
    errno = 0;
    if (fwrite(p, 1, n, o->fp) != n)
        o->err = errno ? errno : EIO;
}

/* Makes the rename durable. A filesystem that cannot sync a folder says EINVAL; that is no
   reason to call a written checkpoint failed. */
static int fsync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash == NULL   ? strdup(".")
                : slash == path ? strdup("/")
                                : strndup(path, (size_t)(slash - path));
    if (dir == NULL)
        return ENOMEM;
    int err = 0, fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        err = errno;
    else if (fsync(fd) != 0 && errno != EINVAL)
        err = errno;
    if (fd >= 0)
        close(fd);
    free(dir);
    return err;
}

mgt_status mgt_st_writer_save(const mgt_st_writer *w, const char *path)
{
    static atomic_uint tmp_counter;
    mgt_status st = MGT_OK;
    char *header = NULL, *tmp = NULL;
    bool tmp_exists = false;
    if (w == NULL || path == NULL || path[0] == '\0')
        return mgt_error_set(MGT_ERR_INVALID, "safetensors writer: no writer or no path");

    uint64_t total = 0;
    /* each size is at most 2^53, so stopping once past 2^53 keeps the sum from wrapping */
    for (size_t i = 0; i < w->n && total <= ST_MAX_INT; i++)
        total += w->t[i].bytes;
    if (total > ST_MAX_INT) {
        st = mgt_error_set(MGT_ERR_INVALID, "%s: more than 2^53 bytes of tensor data", path);
        goto done;
    }
    header = build_header(w);
    size_t tmp_size = strlen(path) + 48;
    tmp = malloc(tmp_size);
    if (header == NULL || tmp == NULL) {
        st = mgt_error_set(MGT_ERR_OOM, "%s: no memory for the header", path);
        goto done;
    }
    size_t text_len = strlen(header);
    size_t pad = (8 - text_len % 8) % 8;
    uint64_t hlen = text_len + pad;
    if (hlen > MGT_ST_MAX_HEADER_BYTES) {
        st = mgt_error_set(MGT_ERR_INVALID,
                           "%s: the header would be %" PRIu64
                           " bytes, over the %u-byte limit readers enforce",
                           path, hlen, MGT_ST_MAX_HEADER_BYTES);
        goto done;
    }

    /* beside the target so that rename stays within one filesystem; O_EXCL with our pid and a
       counter keeps concurrent savers apart, and mode 0666 lets the umask decide as for any
       new file */
    int fd = -1;
    for (int attempt = 0; fd < 0 && attempt < 100; attempt++) {
        snprintf(tmp, tmp_size, "%s.tmp.%ld.%u", path, (long)getpid(),
                 atomic_fetch_add(&tmp_counter, 1u));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        st = mgt_error_set(MGT_ERR_IO, "%s: cannot create a temp file beside it: %s", path,
                           strerror(errno));
        goto done;
    }
    tmp_exists = true;
    st_out o = {fdopen(fd, "wb"), 0};
    if (o.fp == NULL) {
        st = mgt_error_set(MGT_ERR_IO, "%s: cannot open a stream on %s: %s", path, tmp,
                           strerror(errno));
        close(fd);
        goto done;
    }

    unsigned char len_bytes[8];
    for (int k = 0; k < 8; k++)
        len_bytes[k] = (unsigned char)(hlen >> (8 * k));
    static const char spaces[] = "        ";
    out_write(&o, len_bytes, sizeof len_bytes);
    out_write(&o, header, text_len);
    out_write(&o, spaces, pad);
    for (size_t i = 0; i < w->n; i++)
        out_write(&o, w->t[i].data, (size_t)w->t[i].bytes);
    if (o.err == 0 && fflush(o.fp) != 0)
        o.err = errno;
    if (o.err == 0 && fsync(fileno(o.fp)) != 0)
        o.err = errno;
    if (fclose(o.fp) != 0 && o.err == 0)
        o.err = errno;
    if (o.err != 0) {
        st = mgt_error_set(MGT_ERR_IO, "%s: writing %s failed: %s", path, tmp, strerror(o.err));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = mgt_error_set(MGT_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp,
                           strerror(errno));
        goto done;
    }
    tmp_exists = false;
    int err = fsync_parent(path);
    if (err != 0)
        st = mgt_error_set(MGT_ERR_IO, "%s: written, but its folder could not be synced: %s", path,
                           strerror(err));

done:
    if (tmp_exists)
        unlink(tmp);
    free(tmp);
    cJSON_free(header);
    return st;
}
