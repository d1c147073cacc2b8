/* The pointwise activations' math on vectors of AW lanes (the includer defines AW: 16 for
   AVX-512F's zmm registers in act.c, 8 for AVX2's ymm in act_avx2.c, 4 for the x86-64
   baseline's SSE in act_base.c), with act_fwd_span and act_bwd_span over a whole row. One file
   per width because GCC lowers a comparison on a vector wider than the target's registers to
   one scalar compare per lane (its arithmetic it splits well), and the selects here are
   comparisons; every function is static and always inlined into its file's target clones.
   Every operation is per lane and the same IEEE operation at each width (FMA stays off: ISO C
   contracts nothing), so all widths give the same bits. */
#ifndef AW
#error "define AW (the lanes of a vector) before including act_lanes.h"
#endif
#include "device/cpu/vec.h"

typedef float af __attribute__((vector_size(AW * sizeof(float))));
typedef int32_t ai __attribute__((vector_size(AW * sizeof(int32_t))));
typedef uint32_t au __attribute__((vector_size(AW * sizeof(uint32_t))));
/* Always inlined, so no vector crosses a call (CMakeLists.txt: -Wno-psabi). */
#define ACT_INLINE __attribute__((always_inline)) static inline

ACT_INLINE af ald(const float *p)
{
    af v;
    memcpy(&v, p, sizeof v);
    return v;
}

ACT_INLINE void ast(float *p, af v) { memcpy(p, &v, sizeof v); }

ACT_INLINE af adup(float a)
{
    af v;
    for (int i = 0; i < AW; i++)
        v[i] = a;
    return v;
}

/* d[0, k) = s[0, k) for k < AW, in copies of fixed sizes (a memcpy of a variable size is a
   call into libc). */
ACT_INLINE void copy_part(float *d, const float *s, size_t k)
{
    size_t o = 0;
    if (AW > 8 && (k & 8)) {
        memcpy(d + o, s + o, 8 * sizeof(float));
        o += 8;
    }
    if (AW > 4 && (k & 4)) {
        memcpy(d + o, s + o, 4 * sizeof(float));
        o += 4;
    }
    if (k & 2) {
        memcpy(d + o, s + o, 2 * sizeof(float));
        o += 2;
    }
    if (k & 1)
        d[o] = s[o];
}

/* The first k < AW floats at p, `fill` after them; and their store back. */
ACT_INLINE af ald_fill(const float *p, size_t k, float fill)
{
    float b[AW];
    ast(b, adup(fill));
    copy_part(b, p, k);
    return ald(b);
}

ACT_INLINE af ald_part(const float *p, size_t k) { return ald_fill(p, k, 0.0f); }

ACT_INLINE void ast_part(float *p, af v, size_t k)
{
    float b[AW];
    ast(b, v);
    copy_part(p, b, k);
}

/* a where m is set, b elsewhere (GCC's C has no ?: on vectors) */
ACT_INLINE af asel(ai m, af a, af b) { return (af)(((ai)a & m) | ((ai)b & ~m)); }

/* e^x per lane, in float: Cephes' expf (its range reduction by n = round(x log2 e) with ln 2
   split in two, and its degree-7 polynomial), within 2 ulp of libm's expf over the normal
   range. 2^n is applied as two exact powers of two, so results that overflow give +inf and
   the ones below FLT_MIN come out as denormals or 0, as expf's; x is clamped to [-104, 89]
   first (vexp_above: to 89 only, for an x the caller keeps at -104 or more), which changes no
   result (e^89 overflows, e^-104 rounds to 0), and a NaN stays NaN (both comparisons are
   false, and NaN times any power of two is NaN). The integer work is unsigned: a NaN lane's
   garbage exponent cannot overflow. */
ACT_INLINE af vexp_above(af x)
{
    x = asel(x > 89.0f, adup(89.0f), x);
    /* adding 1.5 * 2^23 rounds to an integer, which the low bits then hold */
    const float magic = 12582912.0f;
    af t = x * (float)M_LOG2E + magic;
    af n = t - magic;
    au ni = (au)t - (au)adup(magic);
    /* 0.693359375 has 9 significant bits, so n times it is exact */
    af r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    /* the polynomial in Estrin's order (pairs, then r^2 and r^4), not Horner's chain */
    af r2 = r * r, r4 = r2 * r2;
    af q01 = r * 1.6666665459e-1f + 5.0000001201e-1f;
    af q23 = r * 8.3334519073e-3f + 4.1665795894e-2f;
    af q45 = r * 1.9875691500e-4f + 1.3981999507e-3f;
    af p = (q01 + q23 * r2) + q45 * r4;
    af e = r2 * p + r + 1.0f;
    au a = (au)((ai)ni >> 1), b = ni - a; /* n = a + b, each within a float's exponent */
    af sa = (af)((a + 127u) << 23), sb = (af)((b + 127u) << 23);
    return (e * sa) * sb;
}

ACT_INLINE af vexp(af x) { return vexp_above(asel(x < -104.0f, adup(-104.0f), x)); }

/* vexp, but 0 where e^x is below FLT_MIN (x < ln FLT_MIN; such lanes are computed at -87,
   whose e^x is normal): the softmax's exponentials, where masked logits (Swin's -100) would
   otherwise make denormal results, each of which takes a slow path in the CPU's multiplier
   (about half of a masked window's softmax time), for terms below 2^-126 of their row's sum. */
ACT_INLINE af vexp_flush(af x)
{
    ai tiny = x < -87.33654475f;
    return asel(tiny, adup(0.0f), vexp_above(asel(tiny, adup(-87.0f), x)));
}

/* Each activation AW lanes at a time, one pair per row of MGT_ACT_LIST: act_<name>(x) and
   act_<name>_bwd(dy, x) = dy * act'(x). Comparisons are selects, so a NaN passes through each
   as in the scalar form; GELU's erfc is a fitted polynomial on vexp (vphi_cdf).
   Within a few ulp of the reference's double. */
ACT_INLINE af act_relu6(af x) { return asel(x < 0.0f, adup(0.0f), asel(x > 6.0f, adup(6.0f), x)); }

/* a select, not dy * 0|1 as the others: hardtanh_backward's arithmetic, and a denormal dy
   (common deep in backward) costs a microcode assist per multiply on x86 */
ACT_INLINE af act_relu6_bwd(af dy, af x) { return asel((x > 0.0f) & (x < 6.0f), dy, adup(0.0f)); }

ACT_INLINE af act_hardsigmoid(af x)
{
    return asel(x <= -3.0f, adup(0.0f), asel(x >= 3.0f, adup(1.0f), x / 6.0f + 0.5f));
}

ACT_INLINE af act_hardsigmoid_bwd(af dy, af x)
{
    return dy * asel((x > -3.0f) & (x < 3.0f), adup(1.0f / 6.0f), adup(0.0f));
}

ACT_INLINE af act_hardswish(af x)
{
    return asel(x <= -3.0f, adup(0.0f), asel(x >= 3.0f, x, x * (x + 3.0f) / 6.0f));
}

ACT_INLINE af act_hardswish_bwd(af dy, af x)
{
    return dy * asel(x < -3.0f, adup(0.0f), asel(x <= 3.0f, x / 3.0f + 0.5f, adup(1.0f)));
}

ACT_INLINE af act_silu(af x) { return x / (1.0f + vexp(-x)); }

ACT_INLINE af act_silu_bwd(af dy, af x)
{
    af sg = 1.0f / (1.0f + vexp(-x));
    return dy * (sg * (1.0f + x * (1.0f - sg)));
}

ACT_INLINE af act_sigmoid(af x) { return 1.0f / (1.0f + vexp(-x)); }

ACT_INLINE af act_sigmoid_bwd(af dy, af x)
{
    af sg = 1.0f / (1.0f + vexp(-x));
    return dy * (sg * (1.0f - sg));
}

/* Phi(x), the normal distribution's cdf, per lane, and *g = e^(-x^2 / 2), which the density
   is (GELU's backward needs both, from one vexp). Phi(x) = erfc(-x / sqrt 2) / 2 from erfc(z)
   at z = |x| / sqrt 2 in the form t e^(-z^2) Q(t), t = 1 / (1 + z / 2) in (0, 1]: Q is a
   degree-10 polynomial fitted to erfc(z) e^(z^2) / t for relative error (tools/fit-erfc.py:
   1.1e-8 in exact arithmetic, 2.3e-7 evaluated here in float), so GELU keeps its relative
   accuracy in the negative tail, where x Phi(x) is tiny. Both polynomials in this file run in
   Estrin's order (pairs of terms, then powers of two of the variable) rather than Horner's
   chain, whose latency held these loops up. */
ACT_INLINE af vphi_cdf(af x, af *g)
{
    af z = asel(x < 0.0f, -x, x) * (float)M_SQRT1_2;
    af t = 1.0f / (1.0f + 0.5f * z);
    af t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
    af a01 = t * 0.282093851f + 0.282094795f, a23 = t * 0.17537634f + 0.246880628f;
    af a45 = t * -0.0572435271f + 0.0930036234f, a67 = t * -0.447011685f + 0.127114144f;
    af a89 = t * -0.230870945f + 0.486207562f;
    af q = ((a01 + a23 * t2) + (a45 + a67 * t2) * t4) + (a89 + t2 * 0.0423552026f) * t8;
    *g = vexp(-(z * z));
    af e = 0.5f * ((t * q) * *g);
    return asel(x < 0.0f, e, 1.0f - e);
}

ACT_INLINE af act_gelu(af x)
{
    af g;
    return x * vphi_cdf(x, &g);
}

ACT_INLINE af act_gelu_bwd(af dy, af x)
{
    af g;
    af phi = vphi_cdf(x, &g);
    return dy * (phi + x * (g * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2)));
}

/* libm's tanhf per lane, as PyTorch's CPU kernel */
ACT_INLINE af act_tanh(af x)
{
    af y;
    for (int i = 0; i < AW; i++)
        y[i] = tanhf(x[i]);
    return y;
}

ACT_INLINE af act_tanh_bwd(af dy, af x)
{
    af t = act_tanh(x);
    return dy * (1.0f - t * t);
}

/* y = f(x) and dx = f_bwd(dy, x) over [0, n), each case of the switches below its own
   inlined straight-line loop: the last partial vector goes through the same lanes, so every
   element's bits are the same function of its inputs wherever it sits. */
#define ACT_FWD_LOOP(f, y, x, n)                                       \
    do {                                                               \
        size_t j_ = 0;                                                 \
        for (; j_ + AW <= (n); j_ += AW)                               \
            ast((y) + j_, f(ald((x) + j_)));                           \
        if (j_ < (n))                                                  \
            ast_part((y) + j_, f(ald_part((x) + j_, (n)-j_)), (n)-j_); \
    } while (0)

#define ACT_BWD_LOOP(f, dx, dy, x, n)                                                       \
    do {                                                                                    \
        size_t j_ = 0;                                                                      \
        for (; j_ + AW <= (n); j_ += AW)                                                    \
            ast((dx) + j_, f(ald((dy) + j_), ald((x) + j_)));                               \
        if (j_ < (n))                                                                       \
            ast_part((dx) + j_, f(ald_part((dy) + j_, (n)-j_), ald_part((x) + j_, (n)-j_)), \
                     (n)-j_);                                                               \
    } while (0)

ACT_INLINE void act_fwd_span(mgt_act act, float *y, const float *x, size_t n)
{
    switch (act) {
#define ACT_FWD_CASE(KIND, name) \
    case MGT_ACT_##KIND: ACT_FWD_LOOP(act_##name, y, x, n); break;
        MGT_ACT_LIST(ACT_FWD_CASE)
#undef ACT_FWD_CASE
    case MGT_ACT_COUNT: break;
    }
}

ACT_INLINE void act_bwd_span(mgt_act act, float *dx, const float *dy, const float *x, size_t n)
{
    switch (act) {
#define ACT_BWD_CASE(KIND, name) \
    case MGT_ACT_##KIND: ACT_BWD_LOOP(act_##name##_bwd, dx, dy, x, n); break;
        MGT_ACT_LIST(ACT_BWD_CASE)
#undef ACT_BWD_CASE
    case MGT_ACT_COUNT: break;
    }
}

/* y[i] = e^(x[i] - shift) over [0, n) (y may be x), 0 where that is below FLT_MIN
   (vexp_flush), returning their sum: the softmax's exponentials (attention's rows). The lanes
   sum apart and then across, so the sum's rounding depends on the width, unlike the
   activations' bits. */
ACT_INLINE float exp_shift_span(float *y, const float *x, float shift, size_t n)
{
    af acc = adup(0.0f), sh = adup(shift);
    size_t k = n % AW, whole = n - k;
    ai lane;
    for (int i = 0; i < AW; i++)
        lane[i] = i;
    /* A partial last vector of a row of at least AW takes the row's last AW floats, read before
       the loop's stores (y may be x) and stored whole after them: the lanes it shares with the
       last whole vector get the same bits again, and only its new lanes count in the sum. A
       shorter row fills the missing lanes with the shift (e^0) and zeroes them after: an
       exponential of -inf would take the slow path of a denormal result on its way to 0. Both
       avoid a store and a reload of a part of a vector, which the CPU cannot forward. */
    af tail = adup(0.0f);
    if (k > 0)
        tail = n >= AW ? ald(x + n - AW) : ald_fill(x, k, shift);
    for (size_t j = 0; j < whole; j += AW) {
        af e = vexp_flush(ald(x + j) - sh);
        ast(y + j, e);
        acc += e;
    }
    if (k > 0) {
        af e = vexp_flush(tail - sh);
        if (n >= AW) {
            ast(y + n - AW, e);
            acc += asel(lane >= (int32_t)(AW - k), e, adup(0.0f));
        } else {
            e = asel(lane < (int32_t)k, e, adup(0.0f));
            ast_part(y, e, k);
            acc += e;
        }
    }
    float s = 0.0f;
    for (int i = 0; i < AW; i++)
        s += acc[i];
    return s;
}

/* The largest of m and x[0, n), NaNs passed over (x > m is false for them): the same value as
   the scalar loop, whatever the order. */
ACT_INLINE float max_above_span(const float *x, size_t n, float m)
{
    af acc = adup(m);
    size_t j = 0;
    for (; j + AW <= n; j += AW) {
        af v = ald(x + j);
        acc = asel(v > acc, v, acc);
    }
    for (; j < n; j++)
        m = x[j] > m ? x[j] : m;
    for (int i = 0; i < AW; i++)
        m = acc[i] > m ? acc[i] : m;
    return m;
}
