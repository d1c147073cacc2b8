/* What every subcommand that opens devices shares: --gpus, --device and --mock parsed, the
   device kind resolved, the device set opened, a device failure's exit status. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "mgt/thread.h"

int mgt_app_device_exit(mgt_status st)
{
    return st == MGT_ERR_INVALID ? MGT_APP_EXIT_USAGE : MGT_APP_EXIT_FAILED;
}

mgt_status mgt_app_parse_gpus(const char *s, int *ids, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= MGT_MAX_DEVICES || (*end && *end != ','))
            return mgt_error_set(MGT_ERR_INVALID,
                                 "--gpus '%s': expected device ids from 0 to %d separated by "
                                 "commas, e.g. 0,1,2,3",
                                 s, MGT_MAX_DEVICES - 1);
        if (*n == MGT_MAX_DEVICES)
            return mgt_error_set(MGT_ERR_INVALID, "--gpus '%s': more than %d devices", s,
                                 MGT_MAX_DEVICES);
        ids[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end && !*p)
            return mgt_error_set(MGT_ERR_INVALID, "--gpus '%s': ends with a comma", s);
    }
    if (*n == 0)
        return mgt_error_set(MGT_ERR_INVALID, "--gpus is empty");
    return MGT_OK;
}

mgt_status mgt_app_parse_device_kind(const char *s, mgt_device_kind *kind)
{
    if (strcmp(s, "auto") == 0)
        *kind = MGT_DEVICE_AUTO;
    else if (strcmp(s, "cuda") == 0)
        *kind = MGT_DEVICE_CUDA;
    else if (strcmp(s, "cpu") == 0 || strcmp(s, "mock") == 0)
        *kind = MGT_DEVICE_MOCK;
    else
        return mgt_error_set(MGT_ERR_INVALID, "--device '%s': expected auto, cuda or cpu", s);
    return MGT_OK;
}

bool mgt_app_device_switch(int c, mgt_devset_options *sw)
{
    switch (c) {
    case MGT_APP_OPT_NO_P2P: sw->no_p2p = true; return true;
    case MGT_APP_OPT_TF32: sw->tf32 = true; return true;
    case MGT_APP_OPT_DETERMINISTIC: sw->deterministic = true; return true;
    default: return false;
    }
}

bool mgt_app_cuda_required(void)
{
    const char *v = getenv("MGT_REQUIRE_CUDA");
    return v && *v && strcmp(v, "0") != 0;
}

mgt_status mgt_app_resolve_devices(mgt_app_devices *d)
{
    if (d->resolved)
        return MGT_OK;
    d->n = 0;
    int cuda = 0;
    mgt_status probe = mgt_device_kind_probe(MGT_DEVICE_CUDA, &cuda);
    /* Asked for CUDA (--device cuda, or MGT_REQUIRE_CUDA=1 as tools/gpu-check.sh sets it): no
       fallback, and the runtime's own reason. */
    if (probe != MGT_OK && d->kind == MGT_DEVICE_CUDA)
        return mgt_error_wrap(probe, "--device cuda");
    if (probe != MGT_OK && d->kind == MGT_DEVICE_AUTO && mgt_app_cuda_required())
        return mgt_error_wrap(probe, "MGT_REQUIRE_CUDA=1");
    if (d->kind == MGT_DEVICE_AUTO) {
        d->kind = cuda > 0 ? MGT_DEVICE_CUDA : MGT_DEVICE_MOCK;
        if (d->kind == MGT_DEVICE_MOCK)
            fprintf(stderr, "mgtrain: no CUDA device found; using CPU mock devices\n");
    }
    if (d->gpus && *d->gpus) {
        mgt_status st = mgt_app_parse_gpus(d->gpus, d->ids, &d->n);
        if (st != MGT_OK)
            return st;
    } else {
        d->n = d->kind == MGT_DEVICE_CUDA ? cuda : mgt_cpu_count();
        if (d->n > 8 && d->kind == MGT_DEVICE_MOCK)
            d->n = 8;
        for (int i = 0; i < d->n; i++)
            d->ids[i] = i;
    }
    if (d->kind == MGT_DEVICE_CUDA)
        for (int i = 0; i < d->n; i++)
            if (d->ids[i] >= cuda)
                return mgt_error_set(MGT_ERR_INVALID,
                                     "--gpus: device %d does not exist (this machine has %d "
                                     "CUDA device%s: 0 to %d)",
                                     d->ids[i], cuda, cuda == 1 ? "" : "s", cuda - 1);
    if (d->kind == MGT_DEVICE_MOCK) {
        /* parsed and checked here, against every id, so that the error names the flag or the
           variable the spec came from */
        const char *source = d->mock ? "--mock" : "MGT_MOCK";
        mgt_status st =
            mgt_mock_options_parse(&d->mock_opts, d->mock ? d->mock : getenv("MGT_MOCK"));
        if (st == MGT_OK)
            st = mgt_mock_options_check(&d->mock_opts, d->ids, d->n);
        if (st != MGT_OK)
            return mgt_error_wrap(st, "%s", source);
        d->nchw_picked = mgt_mock_options_pick_layout(&d->mock_opts);
    }
    d->resolved = true;
    return MGT_OK;
}

static bool among(const int *ids, int n, int id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

mgt_status mgt_app_open_devices(mgt_app_devices *d, int count, mgt_devset **out)
{
    *out = NULL;
    mgt_status st = mgt_app_resolve_devices(d);
    if (st != MGT_OK)
        return st;
    if (count <= 0 || count > d->n)
        count = d->n;
    mgt_devset_options o = d->sw;
    o.mock = NULL;
    if (d->kind == MGT_DEVICE_MOCK) {
        /* The spec was checked against the whole list; of a prefix, the pairs and the faults
           of devices left out do not apply. */
        mgt_mock_options mo = d->mock_opts;
        for (int a = 0; a < MGT_MAX_DEVICES; a++)
            for (int b = 0; b < MGT_MAX_DEVICES; b++)
                if (!among(d->ids, count, a) || !among(d->ids, count, b))
                    mo.peer[a][b] = 0;
        int kept = 0;
        for (int i = 0; i < mo.nfaults; i++)
            if (among(d->ids, count, mo.fault[i].device))
                mo.fault[kept++] = mo.fault[i];
        mo.nfaults = kept;
        o.mock = &mo;
        return mgt_devset_open(d->kind, d->ids, count, &o, out);
    }
    return mgt_devset_open(d->kind, d->ids, count, &o, out);
}
