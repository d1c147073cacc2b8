/* Parses the mock-device options string (MGT_MOCK, --mock) into mgt_mock_options. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mgt/device.h"

static mgt_status bad(const char *item, const char *why)
{
    return mgt_error_set(MGT_ERR_INVALID, "mock options: '%s': %s", item, why);
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

/* alloc@D:N or kernel@D:N */
static mgt_status parse_fault(mgt_mock_options *o, const char *item, const char *val)
{
    const char *at = strchr(val, '@');
    const char *colon = at ? strchr(at, ':') : NULL;
    if (!at || !colon)
        return bad(item, "expected alloc@DEVICE:N or kernel@DEVICE:N");
    size_t kl = (size_t)(at - val);
    if (kl == 5 && strncmp(val, "alloc", 5) == 0)
        o->fault_kind = MGT_FAULT_ALLOC;
    else if (kl == 6 && strncmp(val, "kernel", 6) == 0)
        o->fault_kind = MGT_FAULT_KERNEL;
    else
        return bad(item, "the fault kind is alloc or kernel");
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
    o->fault_op[0] = '\0';
    if (op) {
        if (o->fault_kind != MGT_FAULT_KERNEL || !op[1] || strlen(op + 1) >= sizeof o->fault_op)
            return bad(item, "an op name follows N only for kernel faults, e.g. kernel@0:1:axpy");
        snprintf(o->fault_op, sizeof o->fault_op, "%s", op + 1);
    }
    o->fault_device = (int)d;
    o->fault_nth = n;
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

static mgt_status parse_item(mgt_mock_options *o, char *item)
{
    char *eq = strchr(item, '=');
    if (!eq)
        return bad(item, "expected key=value");
    *eq = '\0';
    const char *key = item, *val = eq + 1;
    mgt_status st = MGT_OK;
    long v;
    char shown[160];
    snprintf(shown, sizeof shown, "%s=%s", key, val);
    if (strcmp(key, "threads") == 0) {
        if (!parse_long(val, &v) || v < 1 || v > 1024)
            st = bad(shown, "threads is a whole number from 1 to 1024");
        else
            o->threads_per_device = (int)v;
    } else if (strcmp(key, "mem") == 0) {
        if (!parse_size(val, &o->mem_limit))
            st = bad(shown, "expected a size such as 512M or 8G");
    } else if (strcmp(key, "peers") == 0) {
        st = parse_peers(o, shown, val);
    } else if (strcmp(key, "fault") == 0) {
        st = parse_fault(o, shown, val);
    } else if (strcmp(key, "delay") == 0) {
        size_t n = strlen(val);
        char num[32];
        if (n >= 2 && strcmp(val + n - 2, "us") == 0)
            n -= 2;
        if (n == 0 || n >= sizeof num)
            return bad(shown, "expected microseconds, e.g. delay=200");
        memcpy(num, val, n);
        num[n] = '\0';
        if (!parse_long(num, &v) || v > 10000000)
            st = bad(shown, "expected microseconds up to 10000000, e.g. delay=200");
        else
            o->delay_us = (unsigned)v;
    } else if (strcmp(key, "link") == 0) {
        st = parse_link(o, shown, val);
    } else if (strcmp(key, "conv") == 0) {
        if (strcmp(val, "onednn") == 0 || strcmp(val, "im2col") == 0)
            o->conv_im2col = strcmp(val, "im2col") == 0;
        else
            st = bad(shown, "expected conv=onednn (the default) or conv=im2col");
    } else if (strcmp(key, "seed") == 0) {
        if (!parse_long(val, &v))
            st = bad(shown, "expected a whole number");
        else
            o->seed = (uint64_t)v;
    } else {
        st =
            bad(shown, "unknown item (known: threads, mem, peers, fault, delay, seed, link, conv)");
    }
    return st;
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
        return mgt_error_set(MGT_ERR_OOM, "mock options: out of host memory");
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
