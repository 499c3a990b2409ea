/* collcomm's native shared-memory core: the arena barrier and the one-host collectives of
 * collcomm/algorithms/shm_direct.py, in C.
 *
 * This file implements *the same protocol* as the Python code, step for step: the same
 * header words (passed in by the caller, from the one layout module), the same slots and
 * page offsets, the same number of syncs, the same phases, and the same order of
 * accumulation. A rank running this code and a rank running the Python code therefore
 * work together in one arena, and give bit-identical results.
 *
 * Everything that ends in an exception stays in Python: a wait that lasts longer than
 * 100 ms calls back ``arena._check(late, target, waited)`` (which raises PeerLostError or
 * CommTimeoutError with its usual text), and a signature mismatch, a split-size mismatch
 * or a case the C code does not cover is returned as a status code that shm_direct turns
 * into the Python behaviour.
 *
 * CPython C API only (no numpy headers): buffers come in through the buffer protocol.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

/* ------------------------------------------------------------------ status codes */
#define ST_DONE 0      /* the call is complete */
#define ST_MISMATCH 1  /* signature words differ (after the first sync): raise MismatchError */
#define ST_PYTHON 2    /* past the first sync, some rank published in place / by address:
                          the Python code finishes the call */
#define ST_PAIRS 3     /* all_to_all: the split sizes do not match (after the first sync) */
#define ST_REFUSE 4    /* nothing done (before any traffic): run the Python path instead */

/* ------------------------------------------------------------------ dtypes and ops */
enum { DT_BOOL, DT_I8, DT_U8, DT_I16, DT_U16, DT_I32, DT_U32, DT_I64, DT_U64,
       DT_F16, DT_F32, DT_F64, DT_C64, DT_C128, DT_BF16, N_DT };
enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_BAND, OP_BOR, OP_BXOR, OP_LAND, OP_LOR, OP_LXOR,
       N_OP };

static const int dt_size[N_DT] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8, 8, 16, 2};

/* How numpy's minimum/maximum break ties between equal values (0.0 vs -0.0): keep the
 * first operand (0) or take the second (1); set from Python, which probes numpy. A NaN
 * always wins, the first one if both are. */
static int tie_second[3] = {0, 1, 1};   /* float16, float32 (also bfloat16), float64 */

/* ------------------------------------------------------------------ float16 <-> float32
 * numpy's own conversions (npy_half_to_float / npy_float_to_half: round to nearest even). */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t h_exp = h & 0x7c00u, f_sgn = ((uint32_t)h & 0x8000u) << 16, bits;
    if (h_exp == 0) {
        uint32_t h_sig = h & 0x03ffu;
        if (h_sig == 0) {
            bits = f_sgn;
        } else {
            h_sig <<= 1;
            while ((h_sig & 0x0400u) == 0) {
                h_sig <<= 1;
                h_exp++;
            }
            bits = f_sgn + (((uint32_t)(127 - 15 - h_exp)) << 23) + (((uint32_t)(h_sig & 0x03ffu)) << 13);
        }
    } else if (h_exp == 0x7c00u) {
        bits = f_sgn + 0x7f800000u + (((uint32_t)(h & 0x03ffu)) << 13);
    } else {
        bits = f_sgn + ((((uint32_t)(h & 0x7fffu)) + 0x1c000u) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_f16(float value)
{
    uint32_t f;
    memcpy(&f, &value, 4);
    uint32_t f_exp = f & 0x7f800000u, f_sig;
    uint16_t h_sgn = (uint16_t)((f & 0x80000000u) >> 16), h_sig;
    if (f_exp >= 0x47800000u) {
        if (f_exp == 0x7f800000u) {
            f_sig = f & 0x007fffffu;
            if (f_sig != 0) {
                uint16_t ret = (uint16_t)(0x7c00u + (f_sig >> 13));
                if (ret == 0x7c00u)
                    ret++;
                return (uint16_t)(h_sgn + ret);
            }
        }
        return (uint16_t)(h_sgn + 0x7c00u);
    }
    if (f_exp <= 0x38000000u) {
        if (f_exp < 0x33000000u)
            return h_sgn;
        f_exp >>= 23;
        f_sig = 0x00800000u + (f & 0x007fffffu);
        f_sig >>= (113 - f_exp);
        if (((f_sig & 0x00003fffu) != 0x00001000u) || (f & 0x000007ffu))
            f_sig += 0x00001000u;
        h_sig = (uint16_t)(f_sig >> 13);
        return (uint16_t)(h_sgn + h_sig);
    }
    uint16_t h_exp = (uint16_t)((f_exp - 0x38000000u) >> 13);
    f_sig = f & 0x007fffffu;
    if ((f_sig & 0x00003fffu) != 0x00001000u)
        f_sig += 0x00001000u;
    h_sig = (uint16_t)(f_sig >> 13);
    h_sig = (uint16_t)(h_sig + h_exp);
    return (uint16_t)(h_sgn + h_sig);
}

/* bfloat16 as collcomm.ops does it: bits << 16 is the float32; back with round to
 * nearest even, NaN kept a NaN ((bits >> 16) | 0x40). */
static inline float bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float value)
{
    uint32_t x;
    memcpy(&x, &value, 4);
    if (isnan(value))
        return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((uint32_t)(x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

/* ------------------------------------------------------------------ kernels: acc ⊕= b */
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

/* ------------------------------------------------------------------ the arena */
typedef struct {
    PyObject_HEAD
    char *base;            /* the arena mapping */
    Py_ssize_t size;       /* its bytes */
    Py_buffer mapping;     /* keeps the mapping alive while we point into it */
    int n, rank;
    Py_ssize_t header, slot, stride, page, one_shot;
    int words;             /* 64-bit words of header per rank */
    int w_counter, w_offset, w_size, w_shared, w_signature, w_sleepers;
    long long spin_ns;     /* spin this long before yielding */
    int yields;            /* then sched_yield this many times before blocking */
    int use_futex;
    unsigned long long done;      /* calls completed here, syncs included (tests check the path) */
    unsigned long long finished;  /* calls the Python code finished (ST_PYTHON) */
} Core;

static PyObject *s_phase, *s_count, *s_check;   /* interned attribute names */

static inline uint64_t *word(Core *c, int r, int w)
{
    return (uint64_t *)c->base + (Py_ssize_t)r * c->words + w;
}
static inline uint64_t get(Core *c, int r, int w)
{
    return __atomic_load_n(word(c, r, w), __ATOMIC_ACQUIRE);
}
static inline void put(Core *c, int w, uint64_t v)
{
    __atomic_store_n(word(c, c->rank, w), v, __ATOMIC_RELAXED);
}
static inline char *slot_at(Core *c, int phase, int r)
{
    return c->base + c->header + ((Py_ssize_t)phase * c->n + r) * c->stride;
}

static inline long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline void futex_wake_all(uint64_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* -------------------------------------------------------------- the GIL, released lazily */
typedef struct {
    PyThreadState *ts;     /* non-NULL: released */
} Gil;
static inline void gil_release(Gil *g)
{
    if (g->ts == NULL)
        g->ts = PyEval_SaveThread();
}
static inline void gil_take(Gil *g)
{
    if (g->ts != NULL) {
        PyEval_RestoreThread(g->ts);
        g->ts = NULL;
    }
}

/* ------------------------------------------------------------------ the counter barrier */
/* Bump our counter; wake whoever sleeps on it. Returns the target everybody must reach. */
static uint64_t arrive(Core *c)
{
    uint64_t *mine = word(c, c->rank, c->w_counter);
    uint64_t target = __atomic_load_n(mine, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(mine, target, __ATOMIC_SEQ_CST);
    uint64_t *sleepers = word(c, c->rank, c->w_sleepers);
    if (c->use_futex && __atomic_load_n(sleepers, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(sleepers, 0, __ATOMIC_RELAXED);
        futex_wake_all(mine);
    }
    return target;
}

/* Spin this long holding the GIL (releasing and taking it back costs more than most
 * waits of a small collective); longer waits release it. */
#define GIL_SPIN_NS 5000

/* The first rank from `from` on whose counter is below target, or -1. */
static inline int first_late(Core *c, uint64_t target, int from)
{
    for (int r = from; r < c->n; r++)
        if (get(c, r, c->w_counter) < target)
            return r;
    return -1;
}

/* Wait until every counter has reached `target`: spin (GIL held), then yield, then block
 * on a futex on the late rank's counter (≤ 1 ms per wait) with the GIL released; every
 * 100 ms the Python side checks for dead peers and the timeout. 0, or -1 with an
 * exception set (and the GIL held). */
static int wait_all(Core *c, PyObject *arena, uint64_t target, Gil *gil)
{
    int late = first_late(c, target, 0);
    if (late < 0)
        return 0;
    long long start = now_ns();
    while (1) {
        for (int i = 0; i < 64; i++) {
            cpu_relax();
            if (get(c, late, c->w_counter) >= target) {
                late = first_late(c, target, late);
                if (late < 0)
                    return 0;
            }
        }
        long long spun = now_ns() - start;
        if (spun >= c->spin_ns)
            break;
        if (spun >= GIL_SPIN_NS)      /* a longer wait: let this process's other threads run */
            gil_release(gil);
    }
    gil_release(gil);
    for (int i = 0; i < c->yields; i++) {
        sched_yield();
        late = first_late(c, target, late);
        if (late < 0)
            return 0;
    }
    long long next_check = start + 100000000LL;
    long sleep_ns = 50000;
    while (1) {
        if (c->use_futex) {
            uint64_t *counter = word(c, late, c->w_counter);
            __atomic_store_n(word(c, late, c->w_sleepers), 1, __ATOMIC_SEQ_CST);
            uint64_t seen = __atomic_load_n(counter, __ATOMIC_SEQ_CST);
            if (seen < target) {
                struct timespec ts = {0, 1000000};
                syscall(SYS_futex, (uint32_t *)counter, FUTEX_WAIT, (uint32_t)(seen & 0xffffffffu),
                        &ts, NULL, 0);
            }
        } else {
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
            sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
        }
        late = first_late(c, target, late);
        if (late < 0)
            return 0;
        long long now = now_ns();
        if (now >= next_check) {
            next_check = now + 100000000LL;
            gil_take(gil);
            if (PyErr_CheckSignals() < 0)       /* Ctrl-C: KeyboardInterrupt, as in Python */
                return -1;
            PyObject *late_list = PyList_New(0);
            if (late_list == NULL)
                return -1;
            for (int r = 0; r < c->n; r++) {
                if (get(c, r, c->w_counter) < target) {
                    PyObject *v = PyLong_FromLong(r);
                    int bad = v == NULL || PyList_Append(late_list, v) < 0;
                    Py_XDECREF(v);
                    if (bad) {
                        Py_DECREF(late_list);
                        return -1;
                    }
                }
            }
            PyObject *t = PyLong_FromUnsignedLongLong(target);
            PyObject *w = PyFloat_FromDouble((double)(now - start) / 1e9);
            PyObject *res = NULL;
            if (t != NULL && w != NULL)
                res = PyObject_CallMethodObjArgs(arena, s_check, late_list, t, w, NULL);
            Py_XDECREF(t);
            Py_XDECREF(w);
            Py_DECREF(late_list);
            if (res == NULL)
                return -1;
            Py_DECREF(res);
            late = first_late(c, target, 0);
            if (late < 0)
                return 0;
            gil_release(gil);
        }
    }
}

static int sync_all(Core *c, PyObject *arena, Gil *gil)
{
    return wait_all(c, arena, arrive(c), gil);
}

/* _enter of shm_direct: publish the call's signature, sync, compare everybody's.
 * 0: same call everywhere; 1: some rank differs; -1: exception. */
static int enter(Core *c, PyObject *arena, int phase, uint64_t sig, Gil *gil)
{
    int w = c->w_signature + phase;
    put(c, w, sig);
    if (sync_all(c, arena, gil) < 0)
        return -1;
    for (int r = 0; r < c->n; r++)
        if (get(c, r, w) != sig)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ per-call plumbing */
typedef struct {
    Core *c;
    PyObject *arena;
    int phase;             /* the arena's phase, advanced locally, written back at the end */
    Gil gil;
    Py_buffer bufs[2];
    int nbufs;
} Call;

static int call_begin(Call *k, Core *c, PyObject *arena)
{
    k->c = c;
    k->arena = arena;
    k->gil.ts = NULL;
    k->nbufs = 0;
    PyObject *p = PyObject_GetAttr(arena, s_phase);
    if (p == NULL)
        return -1;
    long v = PyLong_AsLong(p);
    Py_DECREF(p);
    if (v == -1 && PyErr_Occurred())
        return -1;
    k->phase = (int)(v & 1);
    return 0;
}

static inline int next_phase(Call *k)
{
    k->phase ^= 1;
    return k->phase;
}

/* A C-contiguous buffer of `obj` (writable if asked); NULL data for None; -1 (no
 * exception: the caller refuses the call, before any traffic) if there is none. */
static int get_buffer(Call *k, PyObject *obj, int writable, char **data, Py_ssize_t *len)
{
    if (obj == Py_None) {
        *data = NULL;
        *len = 0;
        return 0;
    }
    Py_buffer *view = &k->bufs[k->nbufs];
    if (PyObject_GetBuffer(obj, view, writable ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
                                               : PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();   /* not contiguous, read-only, ...: the Python code says what is wrong */
        return -1;
    }
    k->nbufs++;
    *data = (char *)view->buf;
    *len = view->len;
    return 0;
}

/* Write back the arena's phase and counter (the Python Arena keeps them as attributes),
 * release the buffers; `status` < 0 means an exception is pending (kept). */
static PyObject *call_end(Call *k, int status)
{
    gil_take(&k->gil);
    for (int i = 0; i < k->nbufs; i++)
        PyBuffer_Release(&k->bufs[i]);
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (status < 0)
        PyErr_Fetch(&type, &value, &tb);
    PyObject *ph = PyLong_FromLong(k->phase);
    PyObject *count = PyLong_FromUnsignedLongLong(
        __atomic_load_n(word(k->c, k->c->rank, k->c->w_counter), __ATOMIC_RELAXED));
    int bad = ph == NULL || count == NULL || PyObject_SetAttr(k->arena, s_phase, ph) < 0 ||
              PyObject_SetAttr(k->arena, s_count, count) < 0;
    Py_XDECREF(ph);
    Py_XDECREF(count);
    if (status < 0) {
        if (bad)
            PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (bad)
        return NULL;
    if (status == ST_DONE)
        k->c->done++;
    else if (status == ST_PYTHON)
        k->c->finished++;
    return PyLong_FromLong(status);
}

static inline Py_ssize_t page_offset(Core *c, const char *data, Py_ssize_t nbytes)
{
    /* shm_direct._offset: match the buffer's page offset only for large copies */
    return nbytes < c->one_shot ? 0 : (Py_ssize_t)((uintptr_t)data % (uintptr_t)c->page);
}

/* Rank r's staged data of this phase, at the offset it announced; NULL if that offset
 * would not fit the slot (a corrupt header: raise rather than read out of bounds). */
static char *peer(Call *k, int phase, int r, Py_ssize_t nbytes)
{
    Core *c = k->c;
    uint64_t off = get(c, r, c->w_offset + phase);
    if (off >= (uint64_t)c->page || (Py_ssize_t)off + nbytes > c->stride) {
        gil_take(&k->gil);
        PyErr_Format(PyExc_RuntimeError, "collcomm native core: rank %d announced offset %llu "
                     "for %zd bytes, outside its slot", r, (unsigned long long)off, nbytes);
        return NULL;
    }
    return slot_at(c, phase, r) + off;
}

static int any_shared(Core *c, int phase)
{
    for (int r = 0; r < c->n; r++)
        if (get(c, r, c->w_shared + phase))
            return 1;
    return 0;
}

static inline void split(Py_ssize_t count, int n, int i, Py_ssize_t *lo, Py_ssize_t *hi)
{
    Py_ssize_t q = count / n, r = count % n;
    *lo = i * q + (i < r ? i : r);
    *hi = *lo + q + (i < r ? 1 : 0);
}

static inline int overlaps(const char *a, Py_ssize_t alen, const char *b, Py_ssize_t blen)
{
    return alen > 0 && blen > 0 && a < b + blen && b < a + alen;
}

#define PARSE_LONG(var, obj)                                  \
    long var = PyLong_AsLong(obj);                            \
    if (var == -1 && PyErr_Occurred())                        \
        return NULL;

#define PARSE_U64(var, obj)                                   \
    uint64_t var = PyLong_AsUnsignedLongLongMask(obj);        \
    if (var == (uint64_t)-1 && PyErr_Occurred())              \
        return NULL;

static int check_args(Py_ssize_t nargs, Py_ssize_t want, const char *name)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ the collectives */

/* all_reduce(arena, buf, code, sig): one chunk (nbytes <= slot), staged (no CMA), our
 * buffer not in the shared heap. One-shot up to one_shot bytes, else two-shot. */
static PyObject *Core_all_reduce(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "all_reduce") < 0)
        return NULL;
    PARSE_LONG(code, args[2]);
    PARSE_U64(sig, args[3]);
    int isz;
    kernel_t fn = kernel_for(code, &isz);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *buf;
    Py_ssize_t nbytes;
    if (get_buffer(&k, args[1], 1, &buf, &nbytes) < 0)
        return call_end(&k, ST_REFUSE);
    if (fn == NULL || nbytes % isz || nbytes > c->slot || nbytes == 0)
        return call_end(&k, ST_REFUSE);
    Py_ssize_t count = nbytes / isz;
    int n = c->n, me = c->rank, phase = next_phase(&k);
    Py_ssize_t off = page_offset(c, buf, nbytes);
    put(c, c->w_shared + phase, 0);
    put(c, c->w_offset + phase, (uint64_t)off);
    char *mine = slot_at(c, phase, me) + off;
    if (nbytes > c->one_shot)
        gil_release(&k.gil);
    memcpy(mine, buf, nbytes);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    if (any_shared(c, phase))
        return call_end(&k, ST_PYTHON);
    if (nbytes <= c->one_shot) {
        /* every rank reduces all n slots in rank order: identical bits everywhere */
        for (int r = 0; r < n; r++) {
            const char *src = r == me ? mine : peer(&k, phase, r, nbytes);
            if (src == NULL)
                return call_end(&k, -1);
            if (r == 0)
                memcpy(buf, src, nbytes);
            else
                fn(buf, src, count);
        }
        return call_end(&k, ST_DONE);
    }
    /* two-shot: reduce our slice of every slot into our own slot (ours first, then the
     * others in rank order, as the Python code does), sync, copy every owner's slice out */
    Py_ssize_t s0, s1;
    split(count, n, me, &s0, &s1);
    for (int r = 0; r < n; r++) {
        if (r == me)
            continue;
        const char *src = peer(&k, phase, r, nbytes);
        if (src == NULL)
            return call_end(&k, -1);
        fn(mine + s0 * isz, src + s0 * isz, s1 - s0);
    }
    if (sync_all(c, k.arena, &k.gil) < 0)
        return call_end(&k, -1);
    for (int r = 0; r < n; r++) {
        Py_ssize_t r0, r1;
        split(count, n, r, &r0, &r1);
        const char *src = r == me ? mine : peer(&k, phase, r, nbytes);
        if (src == NULL)
            return call_end(&k, -1);
        memcpy(buf + r0 * isz, src + r0 * isz, (r1 - r0) * isz);
    }
    return call_end(&k, ST_DONE);
}

/* reduce(arena, send, recv or None, code, root, sig): one chunk, always staged. */
static PyObject *Core_reduce(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 6, "reduce") < 0)
        return NULL;
    PARSE_LONG(code, args[3]);
    PARSE_LONG(root, args[4]);
    PARSE_U64(sig, args[5]);
    int isz;
    kernel_t fn = kernel_for(code, &isz);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t nbytes, rbytes;
    if (get_buffer(&k, args[1], 0, &send, &nbytes) < 0 ||
        get_buffer(&k, args[2], 1, &recv, &rbytes) < 0)
        return call_end(&k, ST_REFUSE);
    int n = c->n, me = c->rank;
    if (fn == NULL || nbytes % isz || nbytes > c->slot || nbytes == 0 || root < 0 || root >= n ||
        (me == root && (recv == NULL || rbytes != nbytes)))
        return call_end(&k, ST_REFUSE);
    Py_ssize_t count = nbytes / isz;
    int phase = next_phase(&k);
    Py_ssize_t off = page_offset(c, send, nbytes);
    put(c, c->w_offset + phase, (uint64_t)off);
    char *mine = slot_at(c, phase, me) + off;
    if (nbytes > c->one_shot)
        gil_release(&k.gil);
    memcpy(mine, send, nbytes);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    Py_ssize_t s0, s1;
    split(count, n, me, &s0, &s1);
    for (int r = 0; r < n; r++) {
        if (r == me)
            continue;
        const char *src = peer(&k, phase, r, nbytes);
        if (src == NULL)
            return call_end(&k, -1);
        fn(mine + s0 * isz, src + s0 * isz, s1 - s0);
    }
    if (sync_all(c, k.arena, &k.gil) < 0)
        return call_end(&k, -1);
    if (me == root) {
        for (int r = 0; r < n; r++) {
            Py_ssize_t r0, r1;
            split(count, n, r, &r0, &r1);
            const char *src = r == me ? mine : peer(&k, phase, r, nbytes);
            if (src == NULL)
                return call_end(&k, -1);
            memcpy(recv + r0 * isz, src + r0 * isz, (r1 - r0) * isz);
        }
    }
    return call_end(&k, ST_DONE);
}

/* broadcast(arena, buf, root, sig): one chunk, staged by the root. */
static PyObject *Core_broadcast(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "broadcast") < 0)
        return NULL;
    PARSE_LONG(root, args[2]);
    PARSE_U64(sig, args[3]);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *buf;
    Py_ssize_t nbytes;
    if (get_buffer(&k, args[1], 1, &buf, &nbytes) < 0)
        return call_end(&k, ST_REFUSE);
    int me = c->rank;
    if (nbytes > c->slot || nbytes == 0 || root < 0 || root >= c->n)
        return call_end(&k, ST_REFUSE);
    int phase = next_phase(&k);
    if (nbytes > c->one_shot)
        gil_release(&k.gil);
    if (me == root) {
        Py_ssize_t off = page_offset(c, buf, nbytes);
        put(c, c->w_shared + phase, 0);
        put(c, c->w_offset + phase, (uint64_t)off);
        memcpy(slot_at(c, phase, me) + off, buf, nbytes);
    }
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    if (me != root) {
        if (get(c, root, c->w_shared + phase))
            return call_end(&k, ST_PYTHON);
        const char *src = peer(&k, phase, root, nbytes);
        if (src == NULL)
            return call_end(&k, -1);
        memcpy(buf, src, nbytes);
    }
    return call_end(&k, ST_DONE);
}

/* gather(arena, send, recv or None, root (-1: all_gather), sig): one chunk, staged. */
static PyObject *Core_gather(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 5, "gather") < 0)
        return NULL;
    PARSE_LONG(root, args[3]);
    PARSE_U64(sig, args[4]);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t kb, rbytes;
    if (get_buffer(&k, args[1], 0, &send, &kb) < 0 ||
        get_buffer(&k, args[2], 1, &recv, &rbytes) < 0)
        return call_end(&k, ST_REFUSE);
    int n = c->n, me = c->rank;
    int receiver = root < 0 || me == root;
    if (kb > c->slot || kb == 0 || root >= n || (receiver && (recv == NULL || rbytes != n * kb)))
        return call_end(&k, ST_REFUSE);
    if (receiver && recv != NULL) {
        char *own = recv + me * kb;
        if (!overlaps(own, kb, send, kb))
            memcpy(own, send, kb);
    }
    int phase = next_phase(&k);
    Py_ssize_t off = page_offset(c, send, kb);
    put(c, c->w_shared + phase, 0);
    put(c, c->w_offset + phase, (uint64_t)off);
    if (kb > c->one_shot)
        gil_release(&k.gil);
    memcpy(slot_at(c, phase, me) + off, send, kb);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    if (any_shared(c, phase))
        return call_end(&k, ST_PYTHON);
    if (receiver) {
        for (int r = 0; r < n; r++) {
            if (r == me)
                continue;
            const char *src = peer(&k, phase, r, kb);
            if (src == NULL)
                return call_end(&k, -1);
            memcpy(recv + r * kb, src, kb);
        }
    }
    return call_end(&k, ST_DONE);
}

/* reduce_scatter(arena, send, recv, code, sig): one chunk (n blocks fit a slot), staged. */
static PyObject *Core_reduce_scatter(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 5, "reduce_scatter") < 0)
        return NULL;
    PARSE_LONG(code, args[3]);
    PARSE_U64(sig, args[4]);
    int isz;
    kernel_t fn = kernel_for(code, &isz);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t sbytes, kb;
    if (get_buffer(&k, args[1], 0, &send, &sbytes) < 0 ||
        get_buffer(&k, args[2], 1, &recv, &kb) < 0)
        return call_end(&k, ST_REFUSE);
    int n = c->n, me = c->rank;
    if (fn == NULL || kb % isz || kb == 0 || sbytes != n * kb || kb / isz > c->slot / (isz * n))
        return call_end(&k, ST_REFUSE);
    Py_ssize_t count = kb / isz;
    int phase = next_phase(&k);
    if (sbytes > c->one_shot)
        gil_release(&k.gil);
    memcpy(slot_at(c, phase, me), send, sbytes);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    memcpy(recv, slot_at(c, phase, 0) + me * kb, kb);
    for (int r = 1; r < n; r++)
        fn(recv, slot_at(c, phase, r) + me * kb, count);
    return call_end(&k, ST_DONE);
}

/* scatter(arena, send or None, recv, root, sig): one chunk (n blocks fit a slot). */
static PyObject *Core_scatter(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 5, "scatter") < 0)
        return NULL;
    PARSE_LONG(root, args[3]);
    PARSE_U64(sig, args[4]);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t sbytes, kb;
    if (get_buffer(&k, args[1], 0, &send, &sbytes) < 0 ||
        get_buffer(&k, args[2], 1, &recv, &kb) < 0)
        return call_end(&k, ST_REFUSE);
    int n = c->n, me = c->rank;
    if (kb == 0 || root < 0 || root >= n || n * kb > c->slot ||
        (me == root && (send == NULL || sbytes != n * kb)))
        return call_end(&k, ST_REFUSE);
    if (me == root && !overlaps(send + me * kb, kb, recv, kb))
        memcpy(recv, send + me * kb, kb);
    int phase = next_phase(&k);
    if (n * kb > c->one_shot)
        gil_release(&k.gil);
    if (me == root)
        memcpy(slot_at(c, phase, me), send, n * kb);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    if (me != root)
        memcpy(recv, slot_at(c, phase, root) + me * kb, kb);
    return call_end(&k, ST_DONE);
}

/* all_to_all(arena, send, send_counts, recv, recv_counts, itemsize, sig, cma_limit):
 * agree on the largest block (and check the split sizes pair by pair), then rounds of
 * staged pieces. cma_limit >= 0: past the agreement, if largest * itemsize > cma_limit
 * the Python code finishes the call by cross-memory attach (ST_PYTHON). */
static int read_counts(PyObject *seq, int n, Py_ssize_t *out)
{
    PyObject *fast = PySequence_Fast(seq, "counts must be a sequence");
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        Py_DECREF(fast);
        return 1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (int i = 0; i < n; i++) {
        out[i] = PyLong_AsSsize_t(items[i]);
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        if (out[i] < 0) {
            Py_DECREF(fast);
            return 1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *Core_all_to_all(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 8, "all_to_all") < 0)
        return NULL;
    PARSE_LONG(isz, args[5]);
    PARSE_U64(sig, args[6]);
    PARSE_LONG(cma_limit, args[7]);
    int n = c->n, me = c->rank;
    Py_ssize_t *tab = PyMem_Malloc(sizeof(Py_ssize_t) * 4 * (size_t)n);
    if (tab == NULL)
        return PyErr_NoMemory();
    Py_ssize_t *sc = tab, *rc = tab + n, *sd = tab + 2 * n, *rd = tab + 3 * n;
    int bad = read_counts(args[2], n, sc);
    if (bad == 0)
        bad = read_counts(args[4], n, rc);
    if (bad < 0) {
        PyMem_Free(tab);
        return NULL;
    }
    Call k;
    if (call_begin(&k, c, args[0]) < 0) {
        PyMem_Free(tab);
        return NULL;
    }
    char *send, *recv;
    Py_ssize_t sbytes, rbytes;
    if (get_buffer(&k, args[1], 0, &send, &sbytes) < 0 ||
        get_buffer(&k, args[3], 1, &recv, &rbytes) < 0) {
        PyMem_Free(tab);
        return call_end(&k, ST_REFUSE);
    }
    Py_ssize_t ssum = 0, rsum = 0, largest = 0;
    if (!bad) {
        for (int j = 0; j < n; j++) {
            sd[j] = ssum;
            rd[j] = rsum;
            ssum += sc[j];
            rsum += rc[j];
            if (j != me && sc[j] > largest)
                largest = sc[j];
        }
    }
    Py_ssize_t slot_elems = isz > 0 ? c->slot / isz : 0;
    if (bad || isz <= 0 || ssum * isz > sbytes || rsum * isz > rbytes || 2 * n * 8 > c->slot ||
        slot_elems < n) {
        PyMem_Free(tab);
        return call_end(&k, ST_REFUSE);
    }
    int agree = next_phase(&k);
    put(c, c->w_size + agree, (uint64_t)largest);
    int64_t *table = (int64_t *)slot_at(c, agree, me);
    for (int j = 0; j < n; j++) {
        table[j] = sc[j];
        table[n + j] = rc[j];
    }
    int e = enter(c, k.arena, agree, sig, &k.gil);
    if (e != 0) {
        PyMem_Free(tab);
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    }
    /* every rank checks the whole matrix: what i sends j is what j expects from i */
    for (int i = 0; i < n; i++) {
        const int64_t *ti = (const int64_t *)slot_at(c, agree, i);
        for (int j = 0; j < n; j++) {
            const int64_t *tj = (const int64_t *)slot_at(c, agree, j);
            if (ti[j] != tj[n + i]) {
                PyMem_Free(tab);
                return call_end(&k, ST_PAIRS);
            }
        }
    }
    /* our block to ourselves (the check above covered it: sc[me] == rc[me]) */
    if (sc[me])
        memmove(recv + rd[me] * isz, send + sd[me] * isz, (size_t)sc[me] * isz);
    Py_ssize_t all_largest = 0;
    for (int r = 0; r < n; r++) {
        Py_ssize_t v = (Py_ssize_t)get(c, r, c->w_size + agree);
        if (v > all_largest)
            all_largest = v;
    }
    if (cma_limit >= 0 && all_largest * isz > cma_limit) {
        PyMem_Free(tab);
        return call_end(&k, ST_PYTHON);
    }
    Py_ssize_t piece = c->slot / (isz * n);
    if (all_largest * isz * n > c->one_shot)
        gil_release(&k.gil);
    for (Py_ssize_t lo = 0; lo < all_largest; lo += piece) {
        int phase = next_phase(&k);
        char *staged = slot_at(c, phase, me);
        for (int j = 0; j < n; j++) {
            if (j == me)
                continue;
            Py_ssize_t cnt = sc[j] - lo;
            cnt = cnt < 0 ? 0 : cnt > piece ? piece : cnt;
            if (cnt)
                memcpy(staged + (Py_ssize_t)j * piece * isz, send + (sd[j] + lo) * isz, cnt * isz);
        }
        if (sync_all(c, k.arena, &k.gil) < 0) {
            PyMem_Free(tab);
            return call_end(&k, -1);
        }
        for (int r = 0; r < n; r++) {
            if (r == me)
                continue;
            Py_ssize_t cnt = rc[r] - lo;
            cnt = cnt < 0 ? 0 : cnt > piece ? piece : cnt;
            if (cnt)
                memcpy(recv + (rd[r] + lo) * isz, slot_at(c, phase, r) + (Py_ssize_t)me * piece * isz,
                       cnt * isz);
        }
    }
    PyMem_Free(tab);
    return call_end(&k, ST_DONE);
}

/* barrier(arena, sig): one sync with the signature check. */
static PyObject *Core_barrier(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 2, "barrier") < 0)
        return NULL;
    PARSE_U64(sig, args[1]);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    int phase = next_phase(&k);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    return call_end(&k, e < 0 ? -1 : e ? ST_MISMATCH : ST_DONE);
}

/* sync(arena): the plain counter barrier (Arena.sync). */
static PyObject *Core_sync(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 1, "sync") < 0)
        return NULL;
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    int e = sync_all(c, k.arena, &k.gil);
    return call_end(&k, e < 0 ? -1 : ST_DONE);
}

/* ------------------------------------------------------------------ the type */
static int Core_init(Core *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"mapping", "n", "rank", "header", "slot", "stride", "page",
                             "one_shot", "layout", "spin_ns", "yields", "futex", NULL};
    PyObject *mapping, *layout;
    long long spin_ns;
    int futex;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OiinnnnnOLip", kwlist, &mapping, &self->n,
                                     &self->rank, &self->header, &self->slot, &self->stride,
                                     &self->page, &self->one_shot, &layout, &spin_ns,
                                     &self->yields, &futex))
        return -1;
    self->spin_ns = spin_ns;
    self->use_futex = futex;
    if (!PyArg_ParseTuple(layout, "iiiiiii;layout: (words, counter, offset, size, shared, "
                          "signature, sleepers)", &self->words, &self->w_counter,
                          &self->w_offset, &self->w_size, &self->w_shared, &self->w_signature,
                          &self->w_sleepers))
        return -1;
    if (self->base != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(mapping, &self->mapping, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->base = (char *)self->mapping.buf;
    self->size = self->mapping.len;
    int top = self->w_signature > self->w_offset ? self->w_signature : self->w_offset;
    if (self->n < 2 || self->rank < 0 || self->rank >= self->n || self->words < 1 ||
        self->page <= 0 || self->slot <= 0 || self->stride < self->slot ||
        self->header < (Py_ssize_t)self->n * self->words * 8 ||
        top + 1 >= self->words || self->w_size + 1 >= self->words ||
        self->w_shared + 1 >= self->words || self->w_sleepers >= self->words ||
        self->header + 2 * (Py_ssize_t)self->n * self->stride > self->size ||
        ((uintptr_t)self->base & 7)) {
        PyBuffer_Release(&self->mapping);
        self->base = NULL;
        PyErr_SetString(PyExc_ValueError, "collcomm native core: the arena geometry does not fit "
                        "its mapping");
        return -1;
    }
    return 0;
}

static void Core_dealloc(Core *self)
{
    if (self->base != NULL)
        PyBuffer_Release(&self->mapping);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))Core_##name, METH_FASTCALL, doc}
static PyMethodDef Core_methods[] = {
    FAST(all_reduce, "all_reduce(arena, buf, code, sig) -> status"),
    FAST(reduce, "reduce(arena, send, recv, code, root, sig) -> status"),
    FAST(broadcast, "broadcast(arena, buf, root, sig) -> status"),
    FAST(gather, "gather(arena, send, recv, root, sig) -> status (root -1: all_gather)"),
    FAST(reduce_scatter, "reduce_scatter(arena, send, recv, code, sig) -> status"),
    FAST(scatter, "scatter(arena, send, recv, root, sig) -> status"),
    FAST(all_to_all, "all_to_all(arena, send, send_counts, recv, recv_counts, itemsize, sig, "
                     "cma_limit) -> status"),
    FAST(barrier, "barrier(arena, sig) -> status"),
    FAST(sync, "sync(arena) -> 0: the arena's counter barrier"),
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Core_members[] = {
    {"done", T_ULONGLONG, offsetof(Core, done), READONLY,
     "calls completed by the native core (collectives, and the syncs of Arena.sync)"},
    {"finished", T_ULONGLONG, offsetof(Core, finished), READONLY,
     "calls the Python code finished (some buffer read in place)"},
    {"n", T_INT, offsetof(Core, n), READONLY, "ranks"},
    {"rank", T_INT, offsetof(Core, rank), READONLY, "this rank"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One rank's native view of a group's arena (see collcomm/native/__init__.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
};

/* ------------------------------------------------------------------ the fast call */
#include "_fastcall.c"

/* ------------------------------------------------------------------ module functions */
/* combine(code, acc, other): acc ⊕= other elementwise (the kernels, for tests) */
static PyObject *mod_combine(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 3, "combine") < 0)
        return NULL;
    PARSE_LONG(code, args[0]);
    int isz;
    kernel_t fn = kernel_for(code, &isz);
    if (fn == NULL) {
        PyErr_Format(PyExc_ValueError, "no native kernel for code %ld", code);
        return NULL;
    }
    Py_buffer a, b;
    if (PyObject_GetBuffer(args[1], &a, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &b, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    if (a.len != b.len || a.len % isz) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "combine: buffers of different sizes");
        return NULL;
    }
    fn(a.buf, b.buf, a.len / isz);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* set_ties(f16, f32, f64): how numpy breaks min/max ties (1: the second operand) */
static PyObject *mod_set_ties(PyObject *m, PyObject *args)
{
    int a, b, c;
    if (!PyArg_ParseTuple(args, "ppp", &a, &b, &c))
        return NULL;
    tie_second[0] = a;
    tie_second[1] = b;
    tie_second[2] = c;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"combine", (PyCFunction)(void (*)(void))mod_combine, METH_FASTCALL,
     "combine(code, acc, other): acc = acc (op) other, elementwise, in place"},
    {"timeout_scope", mod_timeout_scope, METH_O,
     "timeout_scope(delta): call_timeout scopes opened/closed; returns how many are open"},
    {"set_ties", mod_set_ties, METH_VARARGS,
     "set_ties(f16, f32, f64): min/max of equal values keeps the second operand"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_shmcore",
    "collcomm's native shared-memory core (see collcomm/native/__init__.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__shmcore(void)
{
    if (PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    s_phase = PyUnicode_InternFromString("phase");
    s_count = PyUnicode_InternFromString("count");
    s_check = PyUnicode_InternFromString("_check");
    if (s_phase == NULL || s_count == NULL || s_check == NULL || fast_module_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddIntConstant(m, "DONE", ST_DONE) < 0 ||
        PyModule_AddIntConstant(m, "MISMATCH", ST_MISMATCH) < 0 ||
        PyModule_AddIntConstant(m, "PYTHON", ST_PYTHON) < 0 ||
        PyModule_AddIntConstant(m, "PAIRS", ST_PAIRS) < 0 ||
        PyModule_AddIntConstant(m, "REFUSE", ST_REFUSE) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
