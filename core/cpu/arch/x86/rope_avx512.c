/* avx512 NEOX row rotation (see core/cpu/rope_rows.c). No FMA: products are
 * rounded separately, as in the scalar kvm_rope_rotate. */
#include "../../kernels.h"

#include <immintrin.h>

typedef __m512 V;
#define VW 16
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VSET1(x) _mm512_set1_ps(x)
#define FN kvm_rope_rows_neox_avx512

#include "rope_simd.inc"
