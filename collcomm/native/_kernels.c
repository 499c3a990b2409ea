/* The reduction kernels: acc[i] = acc[i] (op) other[i], one function per dtype x op.
 *
 * Included by _shmcore.c, after _dtypes.c. KERNELS[dtype][op] is NULL where collcomm.ops
 * does not allow the op on the dtype (or where C cannot match numpy bit for bit: PRODUCT
 * on complex); kernel_for() looks a code up. Every kernel must give the bytes numpy gives:
 * the same order of operations, numpy's NaN and tie rules for min/max, integer
 * wrap-around, float16/bfloat16 through float32.
 */

typedef void (*kernel_t)(void *acc, const void *b, Py_ssize_t count);

/* integers: wrap-around arithmetic in the unsigned type U (W: at least int wide, so that
 * multiplying two small unsigned values does not overflow a signed int) */
#define INT_KERNELS(NAME, T, U, W)                                                       \
    static void NAME##_sum(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)(U)((W)(U)a[i] + (W)(U)b[i]);       \
    }                                                                                    \
    static void NAME##_prod(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)(U)((W)(U)a[i] * (W)(U)b[i]);       \
    }                                                                                    \
    static void NAME##_min(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = b[i] < a[i] ? b[i] : a[i];             \
    }                                                                                    \
    static void NAME##_max(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = b[i] > a[i] ? b[i] : a[i];             \
    }                                                                                    \
    static void NAME##_band(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)(a[i] & b[i]);                      \
    }                                                                                    \
    static void NAME##_bor(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)(a[i] | b[i]);                      \
    }                                                                                    \
    static void NAME##_bxor(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)(a[i] ^ b[i]);                      \
    }                                                                                    \
    static void NAME##_land(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)((a[i] != 0) & (b[i] != 0));        \
    }                                                                                    \
    static void NAME##_lor(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)((a[i] != 0) | (b[i] != 0));        \
    }                                                                                    \
    static void NAME##_lxor(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)((a[i] != 0) ^ (b[i] != 0));        \
    }

INT_KERNELS(i8, int8_t, uint8_t, unsigned int)
INT_KERNELS(u8, uint8_t, uint8_t, unsigned int)
INT_KERNELS(i16, int16_t, uint16_t, unsigned int)
INT_KERNELS(u16, uint16_t, uint16_t, unsigned int)
INT_KERNELS(i32, int32_t, uint32_t, uint32_t)
INT_KERNELS(u32, uint32_t, uint32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t, uint64_t)
INT_KERNELS(u64, uint64_t, uint64_t, uint64_t)

/* bool: numpy treats any non-zero byte as True and writes 0 / 1 */
#define BOOL_KERNEL(NAME, EXPR)                                                          \
    static void NAME(void *a_, const void *b_, Py_ssize_t n) {                           \
        uint8_t *a = (uint8_t *)a_; const uint8_t *b = (const uint8_t *)b_;              \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            int x = a[i] != 0, y = b[i] != 0;                                            \
            a[i] = (uint8_t)(EXPR);                                                      \
        }                                                                                \
    }
BOOL_KERNEL(b_or, x | y)
BOOL_KERNEL(b_and, x & y)
BOOL_KERNEL(b_xor, x ^ y)

/* floating point: numpy's minimum/maximum propagate a NaN (the first if both are) and
 * break ties as probed (tie_second) */
#define FLOAT_KERNELS(NAME, T, TIE)                                                      \
    static void NAME##_sum(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = a[i] + b[i];                           \
    }                                                                                    \
    static void NAME##_prod(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = a[i] * b[i];                           \
    }                                                                                    \
    static void NAME##_min(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        const int second = tie_second[TIE];                                              \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T x = a[i], y = b[i];                                                        \
            a[i] = (x != x) ? x : (y != y) ? y : (x < y) ? x : (y < x) ? y : second ? y : x; \
        }                                                                                \
    }                                                                                    \
    static void NAME##_max(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        const int second = tie_second[TIE];                                              \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T x = a[i], y = b[i];                                                        \
            a[i] = (x != x) ? x : (y != y) ? y : (x > y) ? x : (y > x) ? y : second ? y : x; \
        }                                                                                \
    }                                                                                    \
    static void NAME##_land(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)((a[i] != 0) & (b[i] != 0));        \
    }                                                                                    \
    static void NAME##_lor(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)((a[i] != 0) | (b[i] != 0));        \
    }                                                                                    \
    static void NAME##_lxor(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) a[i] = (T)((a[i] != 0) ^ (b[i] != 0));        \
    }
FLOAT_KERNELS(f32, float, 1)
FLOAT_KERNELS(f64, double, 2)

/* float16: arithmetic in float32 and rounded back (numpy's half loops); min/max pick one of
 * the original bit patterns */
#define HALF_KERNEL(NAME, EXPR)                                                          \
    static void NAME(void *a_, const void *b_, Py_ssize_t n) {                           \
        uint16_t *a = (uint16_t *)a_; const uint16_t *b = (const uint16_t *)b_;          \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            float x = f16_to_f32(a[i]), y = f16_to_f32(b[i]);                            \
            a[i] = (EXPR);                                                               \
        }                                                                                \
    }
HALF_KERNEL(f16_sum, f32_to_f16(x + y))
HALF_KERNEL(f16_prod, f32_to_f16(x * y))
HALF_KERNEL(f16_min, (x != x) ? a[i] : (y != y) ? b[i] : (x < y) ? a[i] : (y < x) ? b[i]
                                      : tie_second[0] ? b[i] : a[i])
HALF_KERNEL(f16_max, (x != x) ? a[i] : (y != y) ? b[i] : (x > y) ? a[i] : (y > x) ? b[i]
                                      : tie_second[0] ? b[i] : a[i])
HALF_KERNEL(f16_land, ((x != 0) & (y != 0)) ? 0x3c00u : 0)
HALF_KERNEL(f16_lor, ((x != 0) | (y != 0)) ? 0x3c00u : 0)
HALF_KERNEL(f16_lxor, ((x != 0) ^ (y != 0)) ? 0x3c00u : 0)

/* bfloat16: combined in float32, rounded back to nearest even (collcomm.ops._bf16_fn) */
static inline float fmin_np(float x, float y)
{
    return (x != x) ? x : (y != y) ? y : (x < y) ? x : (y < x) ? y : tie_second[1] ? y : x;
}
static inline float fmax_np(float x, float y)
{
    return (x != x) ? x : (y != y) ? y : (x > y) ? x : (y > x) ? y : tie_second[1] ? y : x;
}
#define BF16_KERNEL(NAME, EXPR)                                                          \
    static void NAME(void *a_, const void *b_, Py_ssize_t n) {                           \
        uint16_t *a = (uint16_t *)a_; const uint16_t *b = (const uint16_t *)b_;          \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            float x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);                          \
            a[i] = f32_to_bf16(EXPR);                                                    \
        }                                                                                \
    }
BF16_KERNEL(bf16_sum, x + y)
BF16_KERNEL(bf16_prod, x * y)
BF16_KERNEL(bf16_min, fmin_np(x, y))
BF16_KERNEL(bf16_max, fmax_np(x, y))
BF16_KERNEL(bf16_land, ((x != 0) & (y != 0)) ? 1.0f : 0.0f)
BF16_KERNEL(bf16_lor, ((x != 0) | (y != 0)) ? 1.0f : 0.0f)
BF16_KERNEL(bf16_lxor, ((x != 0) ^ (y != 0)) ? 1.0f : 0.0f)

/* complex: numpy's componentwise sum; logical ops on "non-zero" (re or im). No product:
 * numpy's SIMD loop fuses its multiply-adds where the CPU can, and the signs of the NaNs
 * it then returns are not reproduced here (PRODUCT on complex stays in Python). */
#define COMPLEX_KERNELS(NAME, T)                                                       \
    static void NAME##_sum(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < 2 * n; i++) a[i] = a[i] + b[i];                       \
    }                                                                                    \
    static void NAME##_land(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            int x = a[2 * i] != 0 || a[2 * i + 1] != 0, y = b[2 * i] != 0 || b[2 * i + 1] != 0; \
            a[2 * i] = (T)(x & y); a[2 * i + 1] = 0;                                     \
        }                                                                                \
    }                                                                                    \
    static void NAME##_lor(void *a_, const void *b_, Py_ssize_t n) {                     \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            int x = a[2 * i] != 0 || a[2 * i + 1] != 0, y = b[2 * i] != 0 || b[2 * i + 1] != 0; \
            a[2 * i] = (T)(x | y); a[2 * i + 1] = 0;                                     \
        }                                                                                \
    }                                                                                    \
    static void NAME##_lxor(void *a_, const void *b_, Py_ssize_t n) {                    \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            int x = a[2 * i] != 0 || a[2 * i + 1] != 0, y = b[2 * i] != 0 || b[2 * i + 1] != 0; \
            a[2 * i] = (T)(x ^ y); a[2 * i + 1] = 0;                                     \
        }                                                                                \
    }
COMPLEX_KERNELS(c64, float)
COMPLEX_KERNELS(c128, double)

#define INT_ROW(P) {P##_sum, P##_prod, P##_min, P##_max, P##_band, P##_bor, P##_bxor, \
                    P##_land, P##_lor, P##_lxor}
/* NULL: the op is not allowed for the dtype (collcomm.ops refuses it before any call) */
static const kernel_t KERNELS[N_DT][N_OP] = {
    /* bool: SUM is or, PRODUCT and, MIN and, MAX or (numpy on bool) */
    [DT_BOOL] = {b_or, b_and, b_and, b_or, b_and, b_or, b_xor, b_and, b_or, b_xor},
    [DT_I8] = INT_ROW(i8), [DT_U8] = INT_ROW(u8), [DT_I16] = INT_ROW(i16),
    [DT_U16] = INT_ROW(u16), [DT_I32] = INT_ROW(i32), [DT_U32] = INT_ROW(u32),
    [DT_I64] = INT_ROW(i64), [DT_U64] = INT_ROW(u64),
    [DT_F16] = {f16_sum, f16_prod, f16_min, f16_max, NULL, NULL, NULL, f16_land, f16_lor, f16_lxor},
    [DT_F32] = {f32_sum, f32_prod, f32_min, f32_max, NULL, NULL, NULL, f32_land, f32_lor, f32_lxor},
    [DT_F64] = {f64_sum, f64_prod, f64_min, f64_max, NULL, NULL, NULL, f64_land, f64_lor, f64_lxor},
    [DT_C64] = {c64_sum, NULL, NULL, NULL, NULL, NULL, NULL, c64_land, c64_lor, c64_lxor},
    [DT_C128] = {c128_sum, NULL, NULL, NULL, NULL, NULL, NULL, c128_land, c128_lor, c128_lxor},
    [DT_BF16] = {bf16_sum, bf16_prod, bf16_min, bf16_max, NULL, NULL, NULL, bf16_land, bf16_lor,
                 bf16_lxor},
};

/* code = op * 256 + dtype, as shm_direct packs it; NULL (no exception) if unsupported */
static kernel_t kernel_for(long code, int *itemsize)
{
    long op = code >> 8, dt = code & 0xff;
    *itemsize = 1;
    if (op < 0 || op >= N_OP || dt < 0 || dt >= N_DT)
        return NULL;
    *itemsize = dt_size[dt];
    return KERNELS[dt][op];
}
