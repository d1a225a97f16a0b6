/* CRC-32 with zlib's polynomial and conventions (reflected 0x04C11DB7, register starts and ends
 * inverted), so that mrt_crc32(data, n, crc) == zlib.crc32(data, crc).  The loader checks every
 * section of an artifact with it (docs/format.md, "Checksums"): loading ResNet-18's 89 MB took
 * 18.9 ms with zlib's table code, 9.9 ms with this (D82).
 *
 * x86-64: carry-less multiplication (PCLMULQDQ) folds the data 64 bytes at a time in four 128-bit
 * lanes.  Folding a lane forward by D bits multiplies its low quadword (the higher-degree half in the
 * reflected bit order) by x^(D+32) mod P and its high quadword by x^(D-32) mod P, each constant
 * bit-reflected over 33 bits (the extra bit absorbs the one-bit shift of a product of reflected
 * operands), and XORs the two products into the lane D bits further on.  The result is congruent,
 * not reduced: the last 16-byte lane and the tail (< 16 bytes) then go through the bitwise loop,
 * whose cost is fixed.  tests/native/test_crc32.py derives the constants from the polynomial.
 * aarch64: the CRC32X instruction (ARMv8 CRC extension, HWCAP_CRC32) takes 8 bytes per step. */

#define MRT_CRC32_POLY_REFLECTED 0xEDB88320u

/* the register after n more bytes, one bit at a time (the fixed-cost ends, and machines without the
 * instructions, where Python calls zlib instead) */
static uint32_t crc32_bitwise(uint32_t c, const uint8_t *p, long n) {
    for (; n > 0; n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (MRT_CRC32_POLY_REFLECTED & (0u - (c & 1u)));
    }
    return c;
}

static int crc32_hw = -1; /* -1: not probed yet */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* x^544 and x^480 mod P (fold by 512 bits, four lanes ahead), x^160 and x^96 mod P (fold by 128) */
#define CRC32_K_FOLD512_LO 0x154442bd4ULL
#define CRC32_K_FOLD512_HI 0x1c6e41596ULL
#define CRC32_K_FOLD128_LO 0x1751997d0ULL
#define CRC32_K_FOLD128_HI 0x0ccaa009eULL

__attribute__((target("pclmul,sse2"))) static inline __m128i crc32_fold(__m128i x, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* the register c after the n >= 64 bytes at p */
__attribute__((target("pclmul,sse2"))) static uint32_t crc32_pclmul(uint32_t c, const uint8_t *p, long n) {
    const __m128i k512 = _mm_set_epi64x((long long)CRC32_K_FOLD512_HI, (long long)CRC32_K_FOLD512_LO);
    const __m128i k128 = _mm_set_epi64x((long long)CRC32_K_FOLD128_HI, (long long)CRC32_K_FOLD128_LO);
    __m128i x0 = _mm_loadu_si128((const __m128i *)p), x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32)), x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c)); /* the register enters as the first 4 bytes */
    p += 64;
    n -= 64;
    for (; n >= 64; p += 64, n -= 64) {
        x0 = _mm_xor_si128(crc32_fold(x0, k512), _mm_loadu_si128((const __m128i *)p));
        x1 = _mm_xor_si128(crc32_fold(x1, k512), _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = _mm_xor_si128(crc32_fold(x2, k512), _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = _mm_xor_si128(crc32_fold(x3, k512), _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    __m128i x = _mm_xor_si128(crc32_fold(x0, k128), x1);
    x = _mm_xor_si128(crc32_fold(x, k128), x2);
    x = _mm_xor_si128(crc32_fold(x, k128), x3);
    for (; n >= 16; p += 16, n -= 16) x = _mm_xor_si128(crc32_fold(x, k128), _mm_loadu_si128((const __m128i *)p));
    uint8_t last[16];
    _mm_storeu_si128((__m128i *)last, x);
    return crc32_bitwise(crc32_bitwise(0, last, 16), p, n);
}

static int crc32_probe(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("pclmul") ? 1 : 0;
}
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_acle.h>

__attribute__((target("arch=armv8-a+crc"))) static uint32_t crc32_arm(uint32_t c, const uint8_t *p, long n) {
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8); /* (unaligned, little-endian) */
        c = __crc32d(c, v);
    }
    for (; n > 0; p++, n--) c = __crc32b(c, *p);
    return c;
}

static int crc32_probe(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & (1UL << 7)) ? 1 : 0; /* HWCAP_CRC32 */
#else
    return 0;
#endif
}
#else
static int crc32_probe(void) { return 0; }
#endif

int mrt_crc32_hw(void) {
    if (crc32_hw < 0) crc32_hw = crc32_probe();
    return crc32_hw;
}

uint32_t mrt_crc32(const uint8_t *data, long n, uint32_t crc) {
    if (n <= 0) return crc;
    const uint32_t c = ~crc;
    if (mrt_crc32_hw()) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
        if (n >= 64) return ~crc32_pclmul(c, data, n);
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
        return ~crc32_arm(c, data, n);
#endif
    }
    return ~crc32_bitwise(c, data, n);
}
