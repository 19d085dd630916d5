/* avx2 NEOX row rotation (see core/cpu/rope_rows.c). No FMA: products are
 * rounded separately, as in the scalar kvm_rope_rotate. */
#include "../../kernels.h"

#include <immintrin.h>

typedef __m256 V;
#define VW 8
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VSET1(x) _mm256_set1_ps(x)
#define FN kvm_rope_rows_neox_avx2

#include "rope_simd.inc"
