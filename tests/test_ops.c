/* test_ops.c: the small f32 vector ops (cpu/ops.h) against double-precision formulas, with the edge cases
 * the decode loop relies on: argmax ties go to the lowest index and NaN never wins; softmax of large logits
 * does not overflow; rmsnorm works in place. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/cpu_features.h"
#include "cpu/ops.h"
#include "test_util.h"

static void test_rmsnorm(void) {
    float x[37], w[37], out[37];
    double ss = 0;
    for (int i = 0; i < 37; i++) {
        x[i] = (float)sin(i * 0.7) * 3.0f;
        w[i] = 0.5f + (float)i / 37.0f;
        ss += (double)x[i] * x[i];
    }
    const double r = 1.0 / sqrt(ss / 37 + 1e-6);
    fm_rmsnorm(out, x, w, 37, 1e-6f);
    int ok = 1;
    for (int i = 0; i < 37; i++) ok &= fabs(out[i] - x[i] * r * w[i]) <= 1e-5 * fabs(x[i] * r * w[i]) + 1e-7;
    CHECK_MSG(ok, "rmsnorm differs from the double formula");
    memcpy(out, x, sizeof x);
    fm_rmsnorm(out, out, w, 37, 1e-6f); /* in place */
    ok = 1;
    for (int i = 0; i < 37; i++) ok &= fabs(out[i] - x[i] * r * w[i]) <= 1e-5 * fabs(x[i] * r * w[i]) + 1e-7;
    CHECK_MSG(ok, "rmsnorm in place differs");
}

static void test_silu_mul(void) {
    float g[5] = {-20.0f, -1.0f, 0.0f, 1.5f, 30.0f}, u[5] = {2.0f, 3.0f, 4.0f, -1.0f, 0.5f};
    float e[5];
    for (int i = 0; i < 5; i++) e[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    fm_silu_mul(g, u, 5);
    for (int i = 0; i < 5; i++) CHECK_NEAR(g[i], e[i], 1e-6 * fabs(e[i]) + 1e-9);
}

static void test_argmax(void) {
    float a[6] = {1, 3, 2, 3, -1, 3};
    CHECK(fm_argmax(a, 6) == 1); /* ties: lowest index */
    float b[4] = {NAN, -5, -2, NAN};
    CHECK(fm_argmax(b, 4) == 2); /* NaN never wins */
    float c[3] = {-INFINITY, -INFINITY, -1e30f};
    CHECK(fm_argmax(c, 3) == 2);
    float d[1] = {7};
    CHECK(fm_argmax(d, 1) == 0);
}

/* The definition: the first index of the largest non-NaN value (the scalar loop's answer), 0 when all NaN. */
static int64_t argmax_ref(const float *x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

/* Every ISA level against the definition on rows of every length mod 8 with ties, +-0, infinities and NaNs
 * (a value from a small set, so ties are common; the largest somewhere, often repeated, or nowhere). */
static void test_argmax_levels(void) {
    static const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, -INFINITY, INFINITY, NAN, 3.0f, -7.0f};
    float x[300];
    uint64_t r = 99;
    int bad = 0, cases = 0;
    for (int isa = FM_ISA_SCALAR; isa <= (int)fm_cpu_isa_best(); isa++) {
        if (fm_cpu_set_isa((fm_isa)isa)) continue;
        for (int n = 1; n <= 300; n += n < 40 ? 1 : 37)
            for (int rep = 0; rep < 12; rep++) {
                const int kinds = rep < 4 ? 5 : rep < 8 ? 8 : 10; /* finite only; + infinities; + NaN */
                for (int i = 0; i < n; i++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    x[i] = rep % 4 == 3 ? NAN : pool[(r >> 33) % (uint64_t)kinds];
                }
                if (rep % 4 == 3 && n > 2) x[n / 2] = -1.0f; /* all NaN but one */
                cases++;
                bad += fm_argmax(x, n) != argmax_ref(x, n);
            }
    }
    fm_cpu_set_isa(fm_cpu_isa_best());
    CHECK_MSG(bad == 0, "argmax differs from the definition in %d of %d rows", bad, cases);
    float all_nan[19];
    for (int i = 0; i < 19; i++) all_nan[i] = NAN;
    CHECK(fm_argmax(all_nan, 19) == 0);
}

static void test_softmax(void) {
    float x[4] = {1000.0f, 1001.0f, 999.0f, -1000.0f};
    fm_softmax(x, 4);
    double e0 = exp(-1.0), e2 = exp(-2.0), z = e0 + 1 + e2;
    CHECK_NEAR(x[0], e0 / z, 1e-6);
    CHECK_NEAR(x[1], 1 / z, 1e-6);
    CHECK_NEAR(x[2], e2 / z, 1e-6);
    CHECK(x[3] == 0.0f);
    CHECK(isfinite(x[0]) && isfinite(x[1]));
}

static void test_dot_axpy(void) {
    float a[19], b[19], y[19];
    double e = 0;
    for (int i = 0; i < 19; i++) {
        a[i] = (float)i * 0.25f - 2.0f;
        b[i] = 1.0f / (float)(i + 1);
        y[i] = (float)i;
        e += (double)a[i] * b[i];
    }
    CHECK_NEAR(fm_dot_f32(a, b, 19), e, 1e-5);
    fm_axpy(y, -2.0f, a, 19);
    int ok = 1;
    for (int i = 0; i < 19; i++) ok &= y[i] == (float)i + -2.0f * a[i];
    CHECK(ok);
}

int main(void) {
    test_rmsnorm();
    test_silu_mul();
    test_argmax();
    test_argmax_levels();
    test_softmax();
    test_dot_axpy();
    return fm_test_report("test_ops");
}
