/* The dtype and op codes of the native core, and float16 / bfloat16 <-> float32.
 *
 * Included by _shmcore.c. A kernel code is op * 256 + dtype (shm_direct packs it; the
 * numbers match collcomm/native/__init__.py's _DTYPES and OPS). float16 and bfloat16 are
 * combined in float32 and rounded back, exactly as numpy (float16) and collcomm.ops
 * (bfloat16) do, so that the results are bit-identical to the Python path.
 */

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
