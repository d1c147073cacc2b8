/* One sample from its bytes to its tensor: fetch (a file, or a pack record with its CRC),
   the header, the transform's geometry, the DCT scale and the region the resampling reads,
   the decode of just that, then the resampling and the rest of the transform. Every thread
   that handles samples owns one mgt_sample_worker, whose buffers it reuses. */
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"

mgt_status mgt_sample_worker_init(mgt_sample_worker *w)
{
    memset(w, 0, sizeof *w);
    return mgt_decoder_create(&w->dec);
}

void mgt_sample_worker_free(mgt_sample_worker *w)
{
    if (!w)
        return;
    mgt_decoder_free(w->dec);
    free(w->file);
    free(w->conv);
    mgt_transform_scratch_free(&w->ts);
    memset(w, 0, sizeof *w);
}

uint64_t mgt_sample_worker_growths(const mgt_sample_worker *w)
{
    return w->growths + w->ts.growths + (w->dec ? mgt_decoder_stats_get(w->dec)->growths : 0);
}

/* A raw record in `channels` channels: the record itself when they agree, else converted
   (gray repeated, or PIL's L) into the worker's buffer. */
static mgt_status raw_view(mgt_sample_worker *w, const mgt_record *r, int channels,
                           mgt_image_view *v)
{
    *v = (mgt_image_view){.px = r->bytes,
                          .stride = (size_t)r->w * r->c,
                          .w = r->w,
                          .h = r->h,
                          .full_w = r->w,
                          .full_h = r->h,
                          .c = r->c,
                          .scale = 1};
    if (r->c == channels)
        return MGT_OK;
    size_t n = (size_t)r->w * r->h;
    if (n * channels > w->conv_cap) {
        uint8_t *p = realloc(w->conv, n * channels);
        if (!p)
            return mgt_error_set(MGT_ERR_OOM, "out of memory converting a raw record");
        w->conv = p;
        w->conv_cap = n * channels;
        w->growths++;
    }
    const uint8_t *s = r->bytes;
    for (size_t i = 0; i < n; i++) {
        if (channels == 3)
            w->conv[3 * i] = w->conv[3 * i + 1] = w->conv[3 * i + 2] = s[i];
        else
            w->conv[i] = (uint8_t)((s[3 * i] * 19595u + s[3 * i + 1] * 38470u +
                                    s[3 * i + 2] * 7471u + 0x8000u) >>
                                   16);
    }
    v->px = w->conv;
    v->stride = (size_t)r->w * channels;
    v->c = channels;
    return MGT_OK;
}

mgt_status mgt_sample_decode(mgt_sample_worker *w, const mgt_dataset *ds, size_t idx, int channels,
                             mgt_image_view *v)
{
    mgt_record r;
    mgt_status st = mgt_dataset_fetch(ds, idx, &w->file, &w->file_cap, &r, w->name, sizeof w->name);
    if (st != MGT_OK)
        return st;
    if (r.raw)
        return raw_view(w, &r, channels, v);
    return mgt_decoder_decode(w->dec, r.bytes, r.len, w->name, channels, NULL, NULL, v);
}

mgt_status mgt_sample_transform(mgt_sample_worker *w, const mgt_dataset *ds, size_t idx,
                                const mgt_transform *t, mgt_rng *rng, float *out)
{
    mgt_record r;
    mgt_status st = mgt_dataset_fetch(ds, idx, &w->file, &w->file_cap, &r, w->name, sizeof w->name);
    if (st != MGT_OK)
        return st;
    mgt_image_header hd = {0};
    if (r.raw) {
        hd.w = r.w;
        hd.h = r.h;
        hd.c = r.c;
    } else if ((st = mgt_decoder_header(w->dec, r.bytes, r.len, w->name, &hd)) != MGT_OK) {
        return st;
    }
    mgt_geom g;
    if ((st = mgt_transform_geometry(t, hd.w, hd.h, rng, &g)) != MGT_OK)
        return st;
    bool region = hd.jpeg && !t->exact_decode;
    int k = region ? mgt_geom_dct_scale(&g) : 1;
    if (k > 1) /* libjpeg's scaled size: ceil(side / k) */
        mgt_geom_scale(&g, k, (hd.w + k - 1) / k, (hd.h + k - 1) / k);
    mgt_resample rs;
    if ((st = mgt_resample_plan(&g, t->interp, t->channels, &w->ts, &rs)) != MGT_OK)
        return st;
    mgt_image_view v;
    if (r.raw) {
        st = raw_view(w, &r, t->channels, &v);
    } else if (region) {
        mgt_decode_region reg = {.scale = k};
        if (!rs.empty) {
            reg.x0 = rs.src[0];
            reg.y0 = rs.src[1];
            reg.x1 = rs.src[2];
            reg.y1 = rs.src[3];
        }
        st = mgt_decoder_decode(w->dec, r.bytes, r.len, w->name, t->channels, &hd, &reg, &v);
    } else {
        st = mgt_decoder_decode(w->dec, r.bytes, r.len, w->name, t->channels, &hd, NULL, &v);
    }
    if (st != MGT_OK)
        return st;
    return mgt_transform_finish(t, &rs, &v, rng, &w->ts, out);
}
