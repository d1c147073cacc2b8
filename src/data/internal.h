/* Helpers shared by the files of src/data/ and by nothing else. */
#ifndef MGT_DATA_INTERNAL_H
#define MGT_DATA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mgt/data.h"

/* A split: an ImageFolder scan, or a split of a pack. */
struct mgt_dataset {
    char *dir; /* the split folder, or "PACK[split]" */
    int nclasses;
    char **class_names; /* nclasses strings, each its own allocation */
    size_t n;
    int32_t *labels; /* n */
    /* a folder */
    size_t *path_off; /* n offsets into paths */
    char *paths;      /* "class/sub/name\0" ... */
    size_t paths_len;
    size_t links_skipped; /* symbolic links to folders already entered, not followed */
    /* a pack (pack != NULL) */
    mgt_pack *pack;   /* shared, reference-counted */
    uint8_t *entries; /* n entries of 32 bytes: the split's copy of its index */
    char *strings;
    double scan_s;
};

/* A sample's bytes: an image file (from a folder or a pack) or raw pixels (a pack). */
typedef struct mgt_record {
    const uint8_t *bytes;
    size_t len;
    bool raw;
    int w, h, c; /* raw: the pixels' layout */
} mgt_record;

/* Opens a pack file (the header and split table checked); release drops a reference. */
mgt_status mgt_pack_map(const char *path, mgt_pack **out);
void mgt_pack_release(mgt_pack *p);
/* A split of a mapped pack as a dataset (which holds its own reference). */
mgt_status mgt_pack_open_split(mgt_pack *p, const char *split, mgt_dataset **out);
const char *mgt_pack_relpath(const mgt_dataset *ds, size_t i);
void mgt_pack_entry_size(const mgt_dataset *ds, size_t i, int *w, int *h, int *c);
/* A pack record read into *buf (grown to fit), its CRC checked (MGT_ERR_INVALID naming the
   pack, record and file when it does not match, or with the reason when the file was bad at
   packing time); MGT_ERR_IO when it cannot be read, the pack having shrunk included. */
mgt_status mgt_pack_fetch(const mgt_dataset *ds, size_t i, uint8_t **buf, size_t *cap,
                          mgt_record *out);
/* MGT_ERR_IO naming the pack when its size is not the one it had when opened. */
mgt_status mgt_pack_check(const mgt_dataset *ds);

/* Sample i's bytes: a folder's file read into *buf (grown as needed), or a pointer into a
   pack. name gets "path" for messages. */
mgt_status mgt_dataset_fetch(const mgt_dataset *ds, size_t i, uint8_t **buf, size_t *cap,
                             mgt_record *out, char *name, size_t name_cap);

/* Reads a whole file into *buf (grown with realloc as needed; *cap its size), so that a
   thread reading many files allocates only when a file is bigger than any before.
   MGT_ERR_IO with "path: strerror" on failure. */
mgt_status mgt_data_read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len);

/* Runs fn(ctx, worker, i) for i in [0, n) on `workers` threads (the caller being one of
   them), handing out indices in chunks in increasing order. Stops early when fn returns
   non-zero or the abort flag is raised; returns the first non-zero value, or
   MGT_ERR_ABORTED. */
typedef int (*mgt_data_for_fn)(void *ctx, int worker, size_t i);
int mgt_data_parallel_for(size_t n, int workers, const mgt_abort *abort, mgt_data_for_fn fn,
                          void *ctx);

/* Growable containers for file lists (scan.c): names packed with their NULs, and offsets
   into them. data_strbuf_add appends n bytes of s and a NUL, *off the offset it starts at. */
typedef struct data_strbuf {
    char *p;
    size_t len, cap;
} data_strbuf;
typedef struct data_offvec {
    size_t *v;
    size_t n, cap;
} data_offvec;
mgt_status data_strbuf_add(data_strbuf *b, const char *s, size_t n, size_t *off);
mgt_status data_offvec_push(data_offvec *o, size_t x);

/* Whether a file name ends in one of ImageFolder's extensions (any case). */
bool mgt_data_has_image_ext(const char *name);

/* The printable form of a path for a one-line message: control characters as '?'. */
void mgt_data_sanitize(char *s);

/* The header of a file from its first 64 KiB (*buf, *cap: a reusable read buffer). */
mgt_status mgt_data_file_header(mgt_decoder *d, const char *path, uint8_t **buf, size_t *cap,
                                mgt_image_header *out);

/* ---- a transform in steps: geometry, the pixels it reads, resampling, the rest ---- */

/* Where a transform's output comes from, in the source image's pixel coordinates. The box
   [box0, box2) x [box1, box3) maps onto sw x sh pixels, of which the output is the ow x oh
   window at (wx, wy) (outside the scaled image: zero fill). The filter taps clamp to
   [lim0, lim2) x [lim1, lim3): the crop for RandomResizedCrop (torchvision crops, then
   resizes), the whole image for Resize. */
typedef struct mgt_geom {
    double box[4];
    int lim[4];
    int sw, sh;
    int wx, wy;
    int ow, oh;
    bool flip;
} mgt_geom;

/* The geometry of t on a w x h image; the random draws (crop, flip) come from rng first. */
mgt_status mgt_transform_geometry(const mgt_transform *t, int w, int h, mgt_rng *rng, mgt_geom *g);
/* The smallest DCT scale 1/k (k = 1, 2, 4, 8) at which the box still has at least sw x sh
   pixels; and g moved into the coordinates of the image at that scale (full_w x full_h). */
int mgt_geom_dct_scale(const mgt_geom *g);
void mgt_geom_scale(mgt_geom *g, int k, int full_w, int full_h);

typedef struct mgt_axis {
    int ksize;
    int *first, *count;
    float *wt;
} mgt_axis;

/* A planned resampling: its taps, in the scratch, and src = [c0, r0, c1, r1), the source
   pixels they read (what the decoder must deliver). */
typedef struct mgt_resample {
    mgt_geom g;
    mgt_interp interp;
    int c;
    bool empty, partial; /* no interior / some fill */
    int cx0, cy0, nx, ny;
    mgt_axis ax, ay;
    float *acc, *srow, *tmp;
    int src[4];
} mgt_resample;

/* Where a resampling writes: f (float CHW, value * a[c] + b[c], fill b[c]) or u8 (HWC,
   rounded, fill 0). */
typedef struct mgt_resample_out {
    float *f;
    float a[3], b[3];
    uint8_t *u8;
} mgt_resample_out;

mgt_status mgt_resample_plan(const mgt_geom *g, mgt_interp m, int channels,
                             mgt_transform_scratch *s, mgt_resample *rs);
mgt_status mgt_resample_run(const mgt_resample *rs, const mgt_image_view *v,
                            const mgt_resample_out *o);

/* Scratch buffer `which` (0: the resampling's, 1 and 2: 8-bit images) of at least `bytes`. */
void *mgt_scratch_get(mgt_transform_scratch *s, int which, size_t bytes);

/* ToTensor + Normalize as out = pixel * a[c] + b[c]. */
void mgt_transform_norm(const mgt_transform *t, float a[3], float b[3]);

/* Resampling into the output, then the policy, normalisation and erasing (the rest of the
   sample's draws come from rng); and plan + finish in one call. */
mgt_status mgt_transform_finish(const mgt_transform *t, const mgt_resample *rs,
                                const mgt_image_view *v, mgt_rng *rng, mgt_transform_scratch *s,
                                float *out);
mgt_status mgt_transform_render(const mgt_transform *t, const mgt_geom *g, const mgt_image_view *v,
                                mgt_rng *rng, mgt_transform_scratch *s, float *out);

/* The auto-augment policy of t on an 8-bit w x h image of c channels, in place. */
mgt_status mgt_augment_policy(const mgt_transform *t, uint8_t *px, int w, int h, int c,
                              mgt_rng *rng, mgt_transform_scratch *s);
/* RandomErasing(p) on a normalised CHW tensor (value 0, torchvision's default). */
void mgt_augment_erase(float p, float *chw, int w, int h, int c, mgt_rng *rng);

/* ---- one sample, start to end ---- */

/* What a thread that handles samples keeps between them. */
typedef struct mgt_sample_worker {
    mgt_decoder *dec;
    uint8_t *file; /* a folder's file */
    size_t file_cap;
    uint8_t *conv; /* a raw record in other channels */
    size_t conv_cap;
    mgt_transform_scratch ts;
    uint64_t growths;
    char name[8192]; /* the sample's path, for messages */
} mgt_sample_worker;

mgt_status mgt_sample_worker_init(mgt_sample_worker *w);
void mgt_sample_worker_free(mgt_sample_worker *w);
/* Times any of the worker's buffers grew (0 more in a steady state). */
uint64_t mgt_sample_worker_growths(const mgt_sample_worker *w);

/* Sample idx of ds through t into out (channels x size x size floats); the random draws come
   from rng. JPEGs are decoded at the smallest DCT scale that covers the crop at the output
   size, and only the region the resampling reads, unless t->exact_decode. */
mgt_status mgt_sample_transform(mgt_sample_worker *w, const mgt_dataset *ds, size_t idx,
                                const mgt_transform *t, mgt_rng *rng, float *out);
/* Sample idx decoded whole at full scale (a view valid until the worker's next call). */
mgt_status mgt_sample_decode(mgt_sample_worker *w, const mgt_dataset *ds, size_t idx, int channels,
                             mgt_image_view *v);

#endif
