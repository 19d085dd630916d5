/* Independent double-precision reference attention for the ART tests:
 * plain loops, no code shared with the library. */
#ifndef KVMEM_TEST_ATTEND_REF_H
#define KVMEM_TEST_ATTEND_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* visible(r, j): may query row r attend to logical position j? */
typedef int (*ref_visible_fn)(void *user, int r, int64_t j);

/* o[r][hq][d] = sum_j softmax_j(scale * q.k_j) v_j over visible j, with K/V
 * rows given as [T][H][D] f32 (k_rows(j) may map positions to slots through
 * `slot`, NULL = identity). Rows that see nothing get zeros. */
static inline void ref_attend(const float *q, int R, int Hq, int H, int D, const float *k, const float *v,
                              int64_t T, const int32_t *slot, double scale, ref_visible_fn vis, void *user,
                              double *o) {
    const int G = Hq / H;
    for (int r = 0; r < R; r++)
        for (int hq = 0; hq < Hq; hq++) {
            const int h = hq / G;
            const float *qr = q + ((size_t)r * Hq + hq) * D;
            double m = -INFINITY;
            for (int64_t j = 0; j < T; j++) {
                if (!vis(user, r, j)) continue;
                const int64_t row = slot ? slot[j] : j;
                const float *kr = k + ((size_t)row * H + h) * D;
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)qr[d] * kr[d];
                s *= scale;
                if (s > m) m = s;
            }
            double l = 0, *acc = o + ((size_t)r * Hq + hq) * D;
            for (int d = 0; d < D; d++) acc[d] = 0;
            for (int64_t j = 0; j < T; j++) {
                if (!vis(user, r, j)) continue;
                const int64_t row = slot ? slot[j] : j;
                const float *kr = k + ((size_t)row * H + h) * D, *vr = v + ((size_t)row * H + h) * D;
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)qr[d] * kr[d];
                double w = exp(s * scale - m);
                l += w;
                for (int d = 0; d < D; d++) acc[d] += w * vr[d];
            }
            for (int d = 0; d < D; d++) acc[d] = l > 0 ? acc[d] / l : 0.0;
        }
}

static inline int ref_all_visible(void *user, int r, int64_t j) {
    (void)user, (void)r, (void)j;
    return 1;
}

/* Largest |a - b| / max(1, |b|) over n values. */
static inline double ref_max_err(const float *a, const double *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(1.0, fabs(b[i]));
        if (!(d <= e)) e = d; /* NaN sticks */
    }
    return e;
}

/* f32 -> f16 bits for values exactly representable as normal halves or 0. */
static inline uint16_t ref_f16_exact(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    if ((u & 0x7fffffffu) == 0) return (uint16_t)sign;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(sign | ((uint32_t)e << 10) | ((u >> 13) & 0x3ffu));
}

#endif
