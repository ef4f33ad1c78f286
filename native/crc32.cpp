// zlib-compatible crc32 (see crc32.h): table-driven bytes, PCLMULQDQ folding of 16-byte blocks.
// The folding follows Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"
// (Gopal et al., 2009) for the reflected polynomial 0x104C11DB7; its constants are x^k mod P,
// bit-reflected and shifted left by one (k = D +- 32 to fold a 128-bit lane forward by D bits:
// D = 512 and 128 for the 64- and 16-byte steps, 2048 for the 256-byte steps of the AVX-512 path
// (VPCLMULQDQ), 64 for the last fold) and the Barrett constant floor(x^64 / P).
#include "crc32.h"

#include <array>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DISKFLOW_X86 1
#endif

namespace diskflow {
namespace {

constexpr uint32_t kPoly = 0xEDB88320u;  // 0x04C11DB7 reflected

// Slice-by-8 tables: table[k][b] is the crc of byte b followed by k zero bytes.
struct Tables {
    std::array<std::array<uint32_t, 256>, 8> t{};
    Tables() {
        for (uint32_t b = 0; b < 256; ++b) {
            uint32_t c = b;
            for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
            t[0][b] = c;
        }
        for (uint32_t b = 0; b < 256; ++b)
            for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
    }
};

const Tables& tables() {
    static const Tables tab;
    return tab;
}

// The raw (uninverted) crc state over n bytes, table-driven.
uint32_t crc_table(uint32_t crc, const uint8_t* p, size_t n) {
    const auto& t = tables().t;
    while (n >= 8) {
        uint32_t lo = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                      static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
        lo ^= crc;
        crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
              t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#ifdef DISKFLOW_X86
// The folding constants (see the head of this file): kXk is x^k mod P.
constexpr long long kX544 = 0x0154442bd4LL, kX480 = 0x01c6e41596LL;      // D = 512
constexpr long long kX160 = 0x01751997d0LL, kX96 = 0x00ccaa009eLL;       // D = 128
constexpr long long kX2080 = 0x011542778aLL, kX2016 = 0x01322d1430LL;    // D = 2048
constexpr long long kX64 = 0x0163cd6124LL;                               // the last fold
constexpr long long kPoly33 = 0x01db710641LL, kMu = 0x01f7011641LL;      // P and floor(x^64 / P), Barrett

#define DISKFLOW_CLMUL __attribute__((target("pclmul,sse4.1")))

DISKFLOW_CLMUL inline __m128i load(const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); }

// x folded forward over 512 or 128 bits by the constants k, plus the next block.
DISKFLOW_CLMUL inline __m128i fold(__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// Continues a fold whose state is x1..x4 (the next 64 bytes' worth) over p[0..n), n a multiple of
// 16, and reduces it to the raw crc state.
DISKFLOW_CLMUL inline __attribute__((always_inline)) uint32_t fold_finish(__m128i x1, __m128i x2, __m128i x3,
                                                                          __m128i x4, const uint8_t* p, size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(kX480, kX544);
    const __m128i k3k4 = _mm_set_epi64x(kX96, kX160);
    const __m128i k5 = _mm_set_epi64x(0, kX64);
    const __m128i poly_mu = _mm_set_epi64x(kMu, kPoly33);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    for (; n >= 64; p += 64, n -= 64) {
        x1 = fold(x1, k1k2, load(p));
        x2 = fold(x2, k1k2, load(p + 16));
        x3 = fold(x3, k1k2, load(p + 32));
        x4 = fold(x4, k1k2, load(p + 48));
    }
    x1 = fold(x1, k3k4, x2);
    x1 = fold(x1, k3k4, x3);
    x1 = fold(x1, k3k4, x4);
    for (; n >= 16; p += 16, n -= 16) x1 = fold(x1, k3k4, load(p));
    // 128 -> 64 bits (appending 32 zero bits), then 64 -> 32 by Barrett reduction.
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x10), _mm_srli_si128(x1, 8));
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00), _mm_srli_si128(x1, 4));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly_mu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly_mu, 0x00);
    return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(t, x1), 1));
}

// The raw crc state over n bytes, n >= 64 and a multiple of 16, folded with PCLMULQDQ.
DISKFLOW_CLMUL uint32_t crc_fold(uint32_t crc, const uint8_t* p, size_t n) {
    const __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
    return fold_finish(x1, load(p + 16), load(p + 32), load(p + 48), p + 64, n - 64);
}

#define DISKFLOW_VCLMUL __attribute__((target("vpclmulqdq,avx512f,pclmul,sse4.1")))

DISKFLOW_VCLMUL inline __m512i fold512(__m512i x, __m512i k, __m512i next) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), next,
                                     0x96);  // a ^ b ^ c
}

// crc_fold with four 512-bit accumulators (sixteen 128-bit lanes, 256 bytes a step), n >= 256.
DISKFLOW_VCLMUL uint32_t crc_fold_wide(uint32_t crc, const uint8_t* p, size_t n) {
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(kX2016, kX2080));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(kX480, kX544));
    __m512i z0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
    __m512i z1 = _mm512_loadu_si512(p + 64), z2 = _mm512_loadu_si512(p + 128), z3 = _mm512_loadu_si512(p + 192);
    p += 256;
    n -= 256;
    for (; n >= 256; p += 256, n -= 256) {
        z0 = fold512(z0, k2048, _mm512_loadu_si512(p));
        z1 = fold512(z1, k2048, _mm512_loadu_si512(p + 64));
        z2 = fold512(z2, k2048, _mm512_loadu_si512(p + 128));
        z3 = fold512(z3, k2048, _mm512_loadu_si512(p + 192));
    }
    z1 = fold512(z0, k512, z1);
    z2 = fold512(z1, k512, z2);
    z3 = fold512(z2, k512, z3);
    return fold_finish(_mm512_extracti32x4_epi32(z3, 0), _mm512_extracti32x4_epi32(z3, 1),
                       _mm512_extracti32x4_epi32(z3, 2), _mm512_extracti32x4_epi32(z3, 3), p, n);
}

#endif  // DISKFLOW_X86

#ifdef DISKFLOW_X86
bool has_pclmul() {
    static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    return yes;
}

bool has_vpclmul() {
    static const bool yes = has_pclmul() && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f");
    return yes;
}
#else
bool has_pclmul() { return false; }
#endif

}  // namespace

bool crc32_folds() { return has_pclmul(); }

uint32_t crc32_update(uint32_t value, const uint8_t* data, size_t n) {
    uint32_t crc = ~value;
#ifdef DISKFLOW_X86
    if (n >= 64 && has_pclmul()) {
        const size_t body = n & ~size_t{15};
        crc = body >= 256 && has_vpclmul() ? crc_fold_wide(crc, data, body) : crc_fold(crc, data, body);
        data += body;
        n -= body;
    }
#endif
    return ~crc_table(crc, data, n);
}

namespace {

// a(x) * b(x) modulo the crc polynomial, both reflected (zlib's multmodp)
uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return p;
}

struct PowerTable {
    uint32_t x2n[32];  // x^(2^k) modulo the polynomial
    PowerTable() {
        uint32_t p = 1u << 30;  // x^1
        x2n[0] = p;
        for (int k = 1; k < 32; ++k) x2n[k] = p = multmodp(p, p);
    }
};

// x^(n * 2^k) modulo the polynomial
uint32_t x2nmodp(uint64_t n, unsigned k) {
    static const PowerTable tab;
    uint32_t p = 1u << 31;  // x^0
    while (n) {
        if (n & 1) p = multmodp(tab.x2n[k & 31], p);
        n >>= 1;
        ++k;
    }
    return p;
}

}  // namespace

uint32_t crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
    return multmodp(x2nmodp(len2, 3), crc1) ^ crc2;
}

uint32_t crc32_zeros(uint32_t value, uint64_t n) {
    return ~multmodp(x2nmodp(n, 3), ~value);
}

void crc32_blocks(const uint8_t* data, size_t n, size_t block, uint32_t* out) {
    for (size_t i = 0; n; ++i) {
        const size_t k = n < block ? n : block;
        out[i] = crc32_update(0, data, k);
        data += k;
        n -= k;
    }
}

}  // namespace diskflow
