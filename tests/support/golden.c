/* The tests' array goldens: loading a file and finding its arrays (see golden.h). */
#include "golden.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

mgt_test_golden *mgt_test_golden_load(const char *dir, const char *name, const char *maker)
{
    mgt_test_golden *g = calloc(1, sizeof *g);
    assert_non_null(g);
    snprintf(g->path, sizeof g->path, "%s/%s/%s.bin", MGT_TEST_DATA_DIR, dir, name);
    FILE *f = fopen(g->path, "rb");
    if (!f)
        fail_msg("cannot open %s (run /usr/bin/python3 %s)", g->path, maker);
    char line[256];
    int version = 0;
    if (!fgets(line, sizeof line, f) || sscanf(line, "mgt-golden %d %d", &version, &g->n) != 2 ||
        version != 1 || g->n < 0 || g->n > MGT_TEST_GOLDEN_MAX_ARRAYS)
        fail_msg("%s: bad header", g->path);
    for (int i = 0; i < g->n; i++) {
        mgt_test_golden_array *a = &g->a[i];
        char type[8];
        unsigned long long count = 0;
        if (!fgets(line, sizeof line, f) ||
            sscanf(line, "%63s %7s %llu", a->name, type, &count) != 3 ||
            (strcmp(type, "f32") != 0 && strcmp(type, "i32") != 0) || count > (1u << 24))
            fail_msg("%s: bad line for array %d", g->path, i);
        a->is_int = strcmp(type, "i32") == 0;
        a->count = (size_t)count;
        a->data = malloc(a->count * 4 + 4);
        assert_non_null(a->data);
        if (fread(a->data, 4, a->count, f) != a->count)
            fail_msg("%s: %s is cut short", g->path, a->name);
    }
    fclose(f);
    return g;
}

void mgt_test_golden_free(mgt_test_golden *g)
{
    for (int i = 0; i < g->n; i++)
        free(g->a[i].data);
    free(g);
}

mgt_test_golden_array *mgt_test_golden_find(mgt_test_golden *g, const char *name, size_t count,
                                            bool is_int)
{
    for (int i = 0; i < g->n; i++) {
        mgt_test_golden_array *a = &g->a[i];
        if (strcmp(a->name, name) != 0)
            continue;
        if (a->is_int != is_int)
            fail_msg("%s: %s is not %s", g->path, name, is_int ? "i32" : "f32");
        if (count && a->count != count)
            fail_msg("%s: %s has %zu values, the test expects %zu", g->path, name, a->count, count);
        return a;
    }
    fail_msg("%s: no array %s", g->path, name);
    return NULL;
}

float *mgt_test_golden_f32(mgt_test_golden *g, const char *name, size_t count)
{
    return mgt_test_golden_find(g, name, count, false)->data;
}

int32_t *mgt_test_golden_i32(mgt_test_golden *g, const char *name, size_t count)
{
    return mgt_test_golden_find(g, name, count, true)->data;
}

uint32_t mgt_test_fnv1a(const char *s)
{
    uint32_t h = 0x811C9DC5u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x01000193u;
    return h;
}

static uint32_t fmix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    return x ^ (x >> 16);
}

double mgt_test_hash_uniform(uint32_t salt, size_t i)
{
    return (double)(fmix32((uint32_t)i * 0x9E3779B1u + salt) >> 8) / 16777216.0;
}

size_t mgt_test_sample_index(const char *name, size_t numel, size_t idx[MGT_TEST_SAMPLES])
{
    if (numel <= MGT_TEST_SAMPLES) {
        for (size_t i = 0; i < numel; i++)
            idx[i] = i;
        return numel;
    }
    char key[96];
    snprintf(key, sizeof key, "sample:%s", name);
    uint32_t salt = mgt_test_fnv1a(key);
    for (size_t i = 0; i < MGT_TEST_SAMPLES; i++) {
        size_t j = (size_t)(int64_t)(mgt_test_hash_uniform(salt, i) * (double)numel);
        idx[i] = j < numel ? j : numel - 1;
    }
    return MGT_TEST_SAMPLES;
}

bool mgt_test_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

double mgt_test_replay_uniform(void *replay, double lo, double hi)
{
    mgt_test_replay *r = replay;
    if (r->pos >= r->n || r->kind[r->pos] != 'u' || fabs(lo - r->lo[r->pos]) > 1e-6 ||
        fabs(hi - r->hi[r->pos]) > 1e-6) {
        r->bad = true;
        return lo;
    }
    return r->v[r->pos++];
}

int64_t mgt_test_replay_randint(void *replay, int64_t lo, int64_t hi)
{
    mgt_test_replay *r = replay;
    if (r->pos >= r->n || r->kind[r->pos] != 'i' || lo != (int64_t)r->lo[r->pos] ||
        hi != (int64_t)r->hi[r->pos]) {
        r->bad = true;
        return lo;
    }
    return (int64_t)r->v[r->pos++];
}
