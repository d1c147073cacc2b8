/* Parses the mock-device options string (MGT_MOCK, --mock) into mgt_mock_options, one table
   entry per item, and checks a parsed spec against the devices a set opens. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "device/op.h"
#include "device/refusal.h"
#include "mgt/device.h"

/* The text names the item and the reason only: the caller puts where the spec came from
   (--mock, MGT_MOCK) in front, once. */
static mgt_status bad(const char *item, const char *why)
{
    return mgt_error_set(MGT_ERR_INVALID, "'%s': %s", item, why);
}

/* A whole non-negative decimal number, nothing after it. */
static bool parse_long(const char *s, long *out)
{
    if (!isdigit((unsigned char)*s))
        return false;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

/* 512M, 8G, 4096K or a plain byte count. */
static bool parse_size(const char *s, size_t *out)
{
    if (!isdigit((unsigned char)*s))
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return false;
    unsigned long long mul = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mul = 1ull << 10; break;
        case 'M': mul = 1ull << 20; break;
        case 'G': mul = 1ull << 30; break;
        default: return false;
        }
        end++;
        if (toupper((unsigned char)*end) == 'B' || toupper((unsigned char)*end) == 'I')
            end++;
        if (*end)
            return false;
    }
    if (v == 0 || v > (~0ull) / mul)
        return false;
    *out = (size_t)(v * mul);
    return true;
}

static mgt_status parse_peers(mgt_mock_options *o, const char *item, const char *val)
{
    memset(o->peer, 0, sizeof o->peer);
    if (strcmp(val, "all") == 0) {
        o->peer_mode = MGT_PEER_ALL;
        return MGT_OK;
    }
    if (strcmp(val, "none") == 0) {
        o->peer_mode = MGT_PEER_NONE;
        return MGT_OK;
    }
    o->peer_mode = MGT_PEER_LIST;
    const char *p = val;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p || *end != '-')
            return bad(item, "expected all, none or pairs like 0-1,2-3");
        p = end + 1;
        long b = strtol(p, &end, 10);
        if (end == p || (*end && *end != ','))
            return bad(item, "expected all, none or pairs like 0-1,2-3");
        if (a < 0 || b < 0 || a >= MGT_MAX_DEVICES || b >= MGT_MAX_DEVICES || a == b)
            return bad(item, "a pair names two different devices below 64");
        o->peer[a][b] = o->peer[b][a] = 1;
        p = *end ? end + 1 : end;
    }
    return MGT_OK;
}

static const char *const fault_kinds[] = {
    [MGT_FAULT_ALLOC] = "alloc", [MGT_FAULT_KERNEL] = "kernel", [MGT_FAULT_HANG] = "hang",
    [MGT_FAULT_LOWP] = "lowp",   [MGT_FAULT_PEER] = "peer",     [MGT_FAULT_GONE] = "gone",
    [MGT_FAULT_STUCK] = "stuck"};

/* alloc@D:N, kernel@D:N[:OP], hang@D:N[:OP], peer@D:N, gone@D:N, stuck@D:N[:OP] or
   lowp@D:N:REASONS; each
   item adds a fault, one per device */
static mgt_status parse_fault(mgt_mock_options *all, const char *item, const char *val)
{
    if (all->nfaults == MGT_MOCK_MAX_FAULTS)
        return bad(item, "at most 4 fault= items");
    mgt_mock_fault *o = &all->fault[all->nfaults];
    *o = (mgt_mock_fault){0};
    const char *at = strchr(val, '@');
    const char *colon = at ? strchr(at, ':') : NULL;
    if (!at || !colon)
        return bad(item, "expected KIND@DEVICE:N (alloc, kernel, hang, peer, gone, stuck or lowp)");
    size_t kl = (size_t)(at - val);
    for (int k = MGT_FAULT_ALLOC; k <= MGT_FAULT_STUCK; k++)
        if (strlen(fault_kinds[k]) == kl && strncmp(val, fault_kinds[k], kl) == 0)
            o->kind = (mgt_fault_kind)k;
    if (o->kind == MGT_FAULT_NONE)
        return bad(item, "the fault kind is alloc, kernel, hang, peer, gone, stuck or lowp");
    char dev[16];
    size_t dl = (size_t)(colon - at - 1);
    if (dl == 0 || dl >= sizeof dev)
        return bad(item, "expected a device index after '@'");
    memcpy(dev, at + 1, dl);
    dev[dl] = '\0';
    long d, n;
    if (!parse_long(dev, &d) || d >= MGT_MAX_DEVICES)
        return bad(item, "the device is an index below 64");
    char num[24];
    const char *op = strchr(colon + 1, ':');
    size_t nl = op ? (size_t)(op - colon - 1) : strlen(colon + 1);
    if (nl == 0 || nl >= sizeof num)
        return bad(item, "N counts from 1");
    memcpy(num, colon + 1, nl);
    num[nl] = '\0';
    if (!parse_long(num, &n) || n < 1)
        return bad(item, "N counts from 1");
    if (o->kind == MGT_FAULT_LOWP) {
        if (!op || !op[1])
            return bad(item, "lowp@DEVICE:N:REASON[,REASON...] names the refusals, each one of "
                             "no_kernel, bad_param, no_memory, broken, fault");
        for (const char *r = op + 1; *r;) {
            const char *end = strchr(r, ',');
            size_t len = end ? (size_t)(end - r) : strlen(r);
            mgt_lp_refusal why = mgt_lp_refusal_from_name(r, len);
            if (why == MGT_LP_REFUSAL_COUNT)
                return bad(item, "a refusal is one of no_kernel, bad_param, no_memory, broken, "
                                 "fault");
            if (o->nrefusals == MGT_MOCK_MAX_REFUSALS)
                return bad(item, "at most 8 refusals");
            o->refusals[o->nrefusals++] = (int)why;
            r = end ? end + 1 : r + len;
        }
        op = NULL;
    }
    if (op) {
        if ((o->kind != MGT_FAULT_KERNEL && o->kind != MGT_FAULT_HANG &&
             o->kind != MGT_FAULT_STUCK) ||
            !op[1] || strlen(op + 1) >= sizeof o->op)
            return bad(item, "an op name follows N only for kernel, hang and stuck faults, e.g. "
                             "kernel@0:1:axpy");
        if (mgt_op_kind_from_name(op + 1) == MGT_OP_COUNT) {
            char names[1024] = "";
            size_t len = 0;
            for (int k = 0; k < MGT_OP_COUNT && len < sizeof names; k++)
                len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", k ? ", " : "",
                                        mgt_op_name((mgt_op_kind)k));
            return mgt_error_set(MGT_ERR_INVALID, "'%s': no op is named '%s' (ops: %s)", item,
                                 op + 1, names);
        }
        snprintf(o->op, sizeof o->op, "%s", op + 1);
    }
    for (int i = 0; i < all->nfaults; i++)
        if (all->fault[i].device == d)
            return bad(item, "one fault per device: this device has one already");
    o->device = (int)d;
    o->nth = n;
    all->nfaults++;
    return MGT_OK;
}

/* "25GB/s,10us": bandwidth then latency */
static mgt_status parse_link(mgt_mock_options *o, const char *item, const char *val)
{
    char *end;
    errno = 0;
    double bw = strtod(val, &end);
    if (errno || end == val || !(bw > 0))
        return bad(item, "expected BANDWIDTH,LATENCY such as 25GB/s,10us");
    double mul = 1;
    if (strncasecmp(end, "GB/s", 4) == 0)
        mul = 1e9, end += 4;
    else if (strncasecmp(end, "MB/s", 4) == 0)
        mul = 1e6, end += 4;
    else if (strncasecmp(end, "KB/s", 4) == 0)
        mul = 1e3, end += 4;
    else if (strncasecmp(end, "B/s", 3) == 0)
        end += 3;
    else
        return bad(item, "the bandwidth's unit is B/s, KB/s, MB/s or GB/s");
    if (*end != ',')
        return bad(item, "expected a latency after the bandwidth, e.g. 25GB/s,10us");
    const char *l = end + 1;
    double lat = strtod(l, &end);
    if (end == l || lat < 0)
        return bad(item, "expected a latency such as 10us or 0.5ms");
    double lmul;
    if (strcmp(end, "us") == 0)
        lmul = 1e-6;
    else if (strcmp(end, "ms") == 0)
        lmul = 1e-3;
    else if (strcmp(end, "s") == 0)
        lmul = 1;
    else
        return bad(item, "the latency's unit is us, ms or s");
    o->link_bytes_per_s = bw * mul;
    o->link_latency_s = lat * lmul;
    return MGT_OK;
}

/* The inter-node link of a multi-node run, as link= spells it; the world applies it. */
static mgt_status parse_xlink(mgt_mock_options *o, const char *item, const char *val)
{
    double bw = o->link_bytes_per_s, lat = o->link_latency_s;
    mgt_status st = parse_link(o, item, val);
    o->xlink_bytes_per_s = o->link_bytes_per_s;
    o->xlink_latency_s = o->link_latency_s;
    o->link_bytes_per_s = bw;
    o->link_latency_s = lat;
    if (st != MGT_OK)
        o->xlink_bytes_per_s = o->xlink_latency_s = 0;
    return st;
}

static mgt_status parse_threads(mgt_mock_options *o, const char *item, const char *val)
{
    long v;
    if (!parse_long(val, &v) || v < 1 || v > 1024)
        return bad(item, "threads is a whole number from 1 to 1024");
    o->threads_per_device = (int)v;
    return MGT_OK;
}

static mgt_status parse_mem(mgt_mock_options *o, const char *item, const char *val)
{
    return parse_size(val, &o->mem_limit) ? MGT_OK
                                          : bad(item, "expected a size such as 512M or 8G");
}

/* microseconds, with or without "us" */
static mgt_status parse_delay(mgt_mock_options *o, const char *item, const char *val)
{
    size_t n = strlen(val);
    char num[32];
    long v;
    if (n >= 2 && strcmp(val + n - 2, "us") == 0)
        n -= 2;
    if (n == 0 || n >= sizeof num)
        return bad(item, "expected microseconds, e.g. delay=200");
    memcpy(num, val, n);
    num[n] = '\0';
    if (!parse_long(num, &v) || v > 10000000)
        return bad(item, "expected microseconds up to 10000000, e.g. delay=200");
    o->delay_us = (unsigned)v;
    return MGT_OK;
}

static mgt_status parse_seed(mgt_mock_options *o, const char *item, const char *val)
{
    long v;
    if (!parse_long(val, &v))
        return bad(item, "expected a whole number");
    o->seed = (uint64_t)v;
    return MGT_OK;
}

static mgt_status parse_conv(mgt_mock_options *o, const char *item, const char *val)
{
    if (strcmp(val, "onednn") != 0 && strcmp(val, "im2col") != 0)
        return bad(item, "expected conv=onednn (the default) or conv=im2col");
    o->conv_im2col = strcmp(val, "im2col") == 0;
    return MGT_OK;
}

static mgt_status parse_layout(mgt_mock_options *o, const char *item, const char *val)
{
    if (strcmp(val, "blocked") != 0 && strcmp(val, "nchw") != 0)
        return bad(item,
                   "expected layout=blocked (the default on a CPU with AVX-512F) or layout=nchw");
    o->layout_nchw = strcmp(val, "nchw") == 0;
    o->layout_blocked = !o->layout_nchw;
    return MGT_OK;
}

/* resnet20 b128 on 2 threads of an AVX2 CPU (2026-12-06, AMD EPYC Zen 3): its batch norms took
   102 ms a step in nChw16c against 40 in NCHW (ReLU and add included), the step 313 ms against
   257; the convolutions the same either way. */
bool mgt_mock_options_pick_layout(mgt_mock_options *o)
{
    if (o->layout_nchw || o->layout_blocked || o->conv_im2col || __builtin_cpu_supports("avx512f"))
        return false;
    o->layout_nchw = true;
    return true;
}

/* The items, in the order the help and the unknown-item message list them. A new item is one
   entry here, its parse function and its field in mgt_mock_options. */
static const struct mock_item {
    const char *key;
    mgt_status (*parse)(mgt_mock_options *o, const char *item, const char *val);
} mock_items[] = {
    {"threads", parse_threads}, {"mem", parse_mem},     {"peers", parse_peers},
    {"fault", parse_fault},     {"delay", parse_delay}, {"seed", parse_seed},
    {"link", parse_link},       {"conv", parse_conv},   {"xlink", parse_xlink},
    {"layout", parse_layout},
};

static mgt_status parse_item(mgt_mock_options *o, char *item)
{
    char *eq = strchr(item, '=');
    if (!eq)
        return bad(item, "expected key=value");
    *eq = '\0';
    const char *key = item, *val = eq + 1;
    char shown[160];
    snprintf(shown, sizeof shown, "%s=%s", key, val);
    size_t count = sizeof mock_items / sizeof mock_items[0];
    for (size_t i = 0; i < count; i++)
        if (strcmp(key, mock_items[i].key) == 0)
            return mock_items[i].parse(o, shown, val);
    char known[256] = "";
    size_t len = 0;
    for (size_t i = 0; i < count && len < sizeof known; i++)
        len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "",
                                mock_items[i].key);
    return mgt_error_set(MGT_ERR_INVALID, "'%s': unknown item (known: %s)", shown, known);
}

mgt_status mgt_mock_options_parse(mgt_mock_options *o, const char *spec)
{
    memset(o, 0, sizeof *o);
    o->peer_mode = MGT_PEER_ALL;
    o->seed = 1;
    if (!spec || !*spec)
        return MGT_OK;
    char *copy = strdup(spec);
    if (!copy)
        return mgt_error_set(MGT_ERR_OOM, "out of host memory parsing '%s'", spec);
    mgt_status st = MGT_OK;
    char *save = NULL;
    for (char *item = strtok_r(copy, ";", &save); item && st == MGT_OK;
         item = strtok_r(NULL, ";", &save)) {
        while (isspace((unsigned char)*item))
            item++;
        if (*item)
            st = parse_item(o, item);
    }
    free(copy);
    return st;
}

/* Whether device `id` is one of the set's. */
static bool opened(const int *ids, int n, long id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

static void list_ids(char *out, size_t cap, const int *ids, int n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%d", i ? ", " : "", ids[i]);
}

mgt_status mgt_mock_options_check(const mgt_mock_options *o, const int *ids, int n)
{
    char have[256];
    list_ids(have, sizeof have, ids, n);
    for (int i = 0; i < o->nfaults; i++) {
        const mgt_mock_fault *f = &o->fault[i];
        if (opened(ids, n, f->device))
            continue;
        char item[96];
        snprintf(item, sizeof item, "fault=%s@%d:%ld%s%s", fault_kinds[f->kind], f->device, f->nth,
                 f->op[0] ? ":" : "", f->op);
        return mgt_error_set(MGT_ERR_INVALID, "'%s': no device %d among the %d opened (ids %s)",
                             item, f->device, n, have);
    }
    if (o->peer_mode != MGT_PEER_LIST)
        return MGT_OK;
    /* the pairs as peers= lists them, to quote the item */
    char item[512] = "peers=";
    size_t len = strlen(item);
    int missing = -1;
    for (int a = 0; a < MGT_MAX_DEVICES; a++)
        for (int b = a + 1; b < MGT_MAX_DEVICES; b++) {
            if (!o->peer[a][b])
                continue;
            if (len < sizeof item)
                len += (size_t)snprintf(item + len, sizeof item - len, "%s%d-%d",
                                        item[len - 1] == '=' ? "" : ",", a, b);
            if (missing < 0 && !opened(ids, n, a))
                missing = a;
            if (missing < 0 && !opened(ids, n, b))
                missing = b;
        }
    if (missing >= 0)
        return mgt_error_set(MGT_ERR_INVALID, "'%s': no device %d among the %d opened (ids %s)",
                             item, missing, n, have);
    return MGT_OK;
}
