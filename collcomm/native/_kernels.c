/* The reduction kernels: acc[i] = acc[i] (op) other[i], one function per dtype x op, and
 * their three-operand twins out[i] = a[i] (op) b[i] (NAME3, KERNELS3).
 *
 * Included by _shmcore.c, after _dtypes.c. KERNELS[dtype][op] is NULL where collcomm.ops
 * does not allow the op on the dtype (or where C cannot match numpy bit for bit: PRODUCT
 * on complex); kernel_for() looks a code up. Every kernel must give the bytes numpy gives:
 * the same order of operations, numpy's NaN and tie rules for min/max, integer
 * wrap-around, float16/bfloat16 through float32.
 *
 * The loop is written once (KERNEL); a dtype family says how an element is read (LOAD:
 * the stored type T to the computing type C), how the result is written back (STORE) and
 * the expression per op, in terms of x = acc[i] and y = other[i] as read.
 */
typedef void (*kernel_t)(void *acc, const void *b, Py_ssize_t count);
/* out[i] = a[i] (op) b[i]: the same expression, a third buffer (out may be a or b) */
typedef void (*kernel3_t)(void *out, const void *a, const void *b, Py_ssize_t count);

#define AS_IS(v) (v)
#define NONZERO(v) ((v) != 0)

/* The one loop; SETUP runs once before it (min/max read the tie rule there, so that the
 * loop still vectorises) */
#define KERNEL_WITH(NAME, T, C, LOAD, STORE, SETUP, EXPR)                                \
    static void NAME(void *a_, const void *b_, Py_ssize_t n) {                           \
        T *a = (T *)a_; const T *b = (const T *)b_;                                      \
        SETUP                                                                            \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            C x = LOAD(a[i]), y = LOAD(b[i]);                                            \
            a[i] = STORE(EXPR);                                                          \
        }                                                                                \
    }                                                                                    \
    static void NAME##3(void *o_, const void *a_, const void *b_, Py_ssize_t n) {        \
        T *o = (T *)o_; const T *a = (const T *)a_; const T *b = (const T *)b_;          \
        SETUP                                                                            \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            C x = LOAD(a[i]), y = LOAD(b[i]);                                            \
            o[i] = STORE(EXPR);                                                          \
        }                                                                                \
    }

#define KERNEL(NAME, T, C, LOAD, STORE, EXPR) KERNEL_WITH(NAME, T, C, LOAD, STORE, , EXPR)

/* numpy's minimum (LT: <) / maximum (LT: >) of x and y, giving X or Y: a NaN wins (the
 * first if both are), then the smaller / larger, ties as probed (tie_second[TIE]: take
 * the second operand) */
#define NP_PICK_KERNEL(NAME, T, C, LOAD, STORE, X, Y, LT, TIE)                           \
    KERNEL_WITH(NAME, T, C, LOAD, STORE, const int second = tie_second[TIE];,            \
                (x != x) ? X : (y != y) ? Y : (x LT y) ? X : (y LT x) ? Y : second ? Y : X)

/* logical and/or/xor on "non-zero", written back as TRUE_ or FALSE_ */
#define LOGICAL_KERNELS(P, T, C, LOAD, STORE, TRUE_, FALSE_)                             \
    KERNEL(P##_land, T, C, LOAD, STORE, ((x != 0) & (y != 0)) ? TRUE_ : FALSE_)          \
    KERNEL(P##_lor, T, C, LOAD, STORE, ((x != 0) | (y != 0)) ? TRUE_ : FALSE_)           \
    KERNEL(P##_lxor, T, C, LOAD, STORE, ((x != 0) ^ (y != 0)) ? TRUE_ : FALSE_)

/* integers: wrap-around arithmetic in the unsigned type U (W: at least int wide, so that
 * multiplying two small unsigned values does not overflow a signed int) */
#define INT_KERNELS(P, T, U, W)                                                          \
    KERNEL(P##_sum, T, T, AS_IS, (T), (U)((W)(U)x + (W)(U)y))                            \
    KERNEL(P##_prod, T, T, AS_IS, (T), (U)((W)(U)x * (W)(U)y))                           \
    KERNEL(P##_min, T, T, AS_IS, (T), y < x ? y : x)                                     \
    KERNEL(P##_max, T, T, AS_IS, (T), y > x ? y : x)                                     \
    KERNEL(P##_band, T, T, AS_IS, (T), x & y)                                            \
    KERNEL(P##_bor, T, T, AS_IS, (T), x | y)                                             \
    KERNEL(P##_bxor, T, T, AS_IS, (T), x ^ y)                                            \
    LOGICAL_KERNELS(P, T, T, AS_IS, (T), 1, 0)

INT_KERNELS(i8, int8_t, uint8_t, unsigned int)
INT_KERNELS(u8, uint8_t, uint8_t, unsigned int)
INT_KERNELS(i16, int16_t, uint16_t, unsigned int)
INT_KERNELS(u16, uint16_t, uint16_t, unsigned int)
INT_KERNELS(i32, int32_t, uint32_t, uint32_t)
INT_KERNELS(u32, uint32_t, uint32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t, uint64_t)
INT_KERNELS(u64, uint64_t, uint64_t, uint64_t)

/* floating point, computed in C: float32 and float64 as they are, bfloat16 in float32
 * and rounded back to nearest even (collcomm.ops._bf16_fn); TIE indexes tie_second */
#define FLOAT_KERNELS(P, T, C, LOAD, STORE, TIE, ONE)                                    \
    KERNEL(P##_sum, T, C, LOAD, STORE, x + y)                                            \
    KERNEL(P##_prod, T, C, LOAD, STORE, x * y)                                           \
    NP_PICK_KERNEL(P##_min, T, C, LOAD, STORE, x, y, <, TIE)                             \
    NP_PICK_KERNEL(P##_max, T, C, LOAD, STORE, x, y, >, TIE)                             \
    LOGICAL_KERNELS(P, T, C, LOAD, STORE, ONE, 0)

FLOAT_KERNELS(f32, float, float, AS_IS, (float), 1, 1)
FLOAT_KERNELS(f64, double, double, AS_IS, (double), 2, 1)
FLOAT_KERNELS(bf16, uint16_t, float, bf16_to_f32, f32_to_bf16, 1, 1.0f)

/* float16: arithmetic in float32 and rounded back (numpy's half loops); min/max pick one of
 * the original bit patterns, the logical ops write 1.0 (0x3c00) or 0 */
KERNEL(f16_sum, uint16_t, float, f16_to_f32, f32_to_f16, x + y)
KERNEL(f16_prod, uint16_t, float, f16_to_f32, f32_to_f16, x * y)
NP_PICK_KERNEL(f16_min, uint16_t, float, f16_to_f32, (uint16_t), a[i], b[i], <, 0)
NP_PICK_KERNEL(f16_max, uint16_t, float, f16_to_f32, (uint16_t), a[i], b[i], >, 0)
LOGICAL_KERNELS(f16, uint16_t, float, f16_to_f32, (uint16_t), 0x3c00u, 0)

/* complex: numpy's componentwise sum is the real sum over 2 * n parts; logical ops on
 * "non-zero" (re or im), written back as 1 + 0i or 0 + 0i. No product: numpy's SIMD loop
 * fuses its multiply-adds where the CPU can, and the signs of the NaNs it then returns are
 * not reproduced here (PRODUCT on complex stays in Python). */
static void c64_sum(void *a, const void *b, Py_ssize_t n) { f32_sum(a, b, 2 * n); }
static void c128_sum(void *a, const void *b, Py_ssize_t n) { f64_sum(a, b, 2 * n); }
static void c64_sum3(void *o, const void *a, const void *b, Py_ssize_t n) { f32_sum3(o, a, b, 2 * n); }
static void c128_sum3(void *o, const void *a, const void *b, Py_ssize_t n) { f64_sum3(o, a, b, 2 * n); }
LOGICAL_KERNELS(c64, float _Complex, int, NONZERO, (float _Complex), 1, 0)
LOGICAL_KERNELS(c128, double _Complex, int, NONZERO, (double _Complex), 1, 0)

/* the table of one kernel family: S empty (acc (op)= b) or 3 (out = a (op) b) */
#define INT_ROW(P, S) {P##_sum##S, P##_prod##S, P##_min##S, P##_max##S, P##_band##S, P##_bor##S, \
                       P##_bxor##S, P##_land##S, P##_lor##S, P##_lxor##S}
#define FLOAT_ROW(P, S) {P##_sum##S, P##_prod##S, P##_min##S, P##_max##S, NULL, NULL, NULL, \
                         P##_land##S, P##_lor##S, P##_lxor##S}
#define COMPLEX_ROW(P, S) {P##_sum##S, NULL, NULL, NULL, NULL, NULL, NULL, P##_land##S, P##_lor##S, \
                           P##_lxor##S}
/* NULL: the op is not allowed for the dtype (collcomm.ops refuses it before any call).
 * bool (numpy: any non-zero byte is True, written as 1): SUM is or, PRODUCT and, MIN and,
 * MAX or; the bitwise ops are the logical ones */
#define KERNEL_TABLE(S) {                                                                     \
    [DT_BOOL] = {u8_lor##S, u8_land##S, u8_land##S, u8_lor##S, u8_land##S, u8_lor##S,          \
                 u8_lxor##S, u8_land##S, u8_lor##S, u8_lxor##S},                              \
    [DT_I8] = INT_ROW(i8, S), [DT_U8] = INT_ROW(u8, S), [DT_I16] = INT_ROW(i16, S),           \
    [DT_U16] = INT_ROW(u16, S), [DT_I32] = INT_ROW(i32, S), [DT_U32] = INT_ROW(u32, S),       \
    [DT_I64] = INT_ROW(i64, S), [DT_U64] = INT_ROW(u64, S),                                   \
    [DT_F16] = FLOAT_ROW(f16, S), [DT_F32] = FLOAT_ROW(f32, S), [DT_F64] = FLOAT_ROW(f64, S),  \
    [DT_BF16] = FLOAT_ROW(bf16, S),                                                           \
    [DT_C64] = COMPLEX_ROW(c64, S), [DT_C128] = COMPLEX_ROW(c128, S),                         \
}
static const kernel_t KERNELS[N_DT][N_OP] = KERNEL_TABLE();
/* the same table, out = a (op) b (the reduce between two ranks by CMA) */
static const kernel3_t KERNELS3[N_DT][N_OP] = KERNEL_TABLE(3);

static kernel3_t kernel3_for(long code)
{
    long op = code >> 8, dt = code & 0xff;
    if (op < 0 || op >= N_OP || dt < 0 || dt >= N_DT)
        return NULL;
    return KERNELS3[dt][op];
}

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
