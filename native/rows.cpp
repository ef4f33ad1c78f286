// Row copies between feature matrices (see rows.h). No Python here.
#include "rows.h"

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define DISKFLOW_X86 1
#endif

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "crc32.h"

namespace diskflow {

namespace {

// How far ahead a source row is prefetched: about this many bytes of rows (within the bounds
// below), so that many rows' reads are in flight at once. Rows are read in random order from a
// source far larger than the caches: each waits on memory, and one row's prefetch a few rows ahead
// (8 rows of 512 bytes) left a gather at ~200 ns a row; 64 rows ahead, all lines, ~90 ns.
constexpr size_t kAheadBytes = 32 << 10;
constexpr int64_t kMinAhead = 16, kMaxAhead = 256;

inline int64_t ahead_rows(size_t rb) {
    const int64_t a = static_cast<int64_t>(kAheadBytes / (rb ? rb : 1));
    return a < kMinAhead ? kMinAhead : (a > kMaxAhead ? kMaxAhead : a);
}

// Bytes of a row prefetched at most: the rows are read at random, so without it every cache line
// of a row but the first waits for memory (a gather of 512-byte rows in random order took three
// times as long); past this the hardware's own streaming prefetch has caught on.
constexpr size_t kPrefetchBytes = 512;

// Asks for the cache lines of the `rb`-byte row at `row` (up to kPrefetchBytes of it).
inline void prefetch_row(const char* row, size_t rb) {
    const size_t n = rb < kPrefetchBytes ? rb : kPrefetchBytes;
    for (size_t b = 0; b < n; b += 64) __builtin_prefetch(row + b);
    __builtin_prefetch(row + n - 1);  // a row that straddles one more line than n / 64 covers
}

// Calls visit(i, row) for the source rows s[sp[0]], ..., s[sp[n - 1]] in that order, each row
// prefetched `ahead_rows` rows before its visit: the one loop every copy and gather below runs.
template <typename Visit>
inline void each_source_row(const RowMatrix& s, const int64_t* sp, int64_t n, Visit&& visit) {
    const size_t rb = static_cast<size_t>(s.row_bytes);
    const int64_t ahead = ahead_rows(rb);
    for (int64_t i = 0; i < ahead && i < n; ++i) prefetch_row(s.data + sp[i] * s.row_bytes, rb);
    for (int64_t i = 0; i < n; ++i) {
        if (i + ahead < n) prefetch_row(s.data + sp[i + ahead] * s.row_bytes, rb);
        visit(i, s.data + sp[i] * s.row_bytes);
    }
}

}  // namespace

void copy_rows(RowMatrix o, const int64_t* op, RowMatrix s, const int64_t* sp, int64_t n) {
    if (o.row_bytes != s.row_bytes) throw std::invalid_argument("src: row size differs from out's");
    for (int64_t i = 0; i < n; ++i)  // check everything first: a bad index changes nothing
        if (op[i] < 0 || op[i] >= o.rows || sp[i] < 0 || sp[i] >= s.rows)
            throw std::out_of_range("row " + std::to_string(i) + ": out_pos " + std::to_string(op[i]) + " (of " +
                                    std::to_string(o.rows) + ") / src_rows " + std::to_string(sp[i]) + " (of " +
                                    std::to_string(s.rows) + ") out of range");
    const size_t rb = static_cast<size_t>(o.row_bytes);
    each_source_row(s, sp, n, [&](int64_t i, const char* row) { std::memcpy(o.data + op[i] * o.row_bytes, row, rb); });
}

namespace {

void check_gather(const RowMatrix& o, const RowMatrix& s, const int64_t* sp, int64_t n) {
    if (o.row_bytes != s.row_bytes) throw std::invalid_argument("src: row size differs from out's");
    if (n > o.rows)
        throw std::out_of_range("out: " + std::to_string(o.rows) + " rows, " + std::to_string(n) + " to gather");
    for (int64_t i = 0; i < n; ++i)
        if (sp[i] < 0 || sp[i] >= s.rows)
            throw std::out_of_range("row " + std::to_string(i) + ": src_rows " + std::to_string(sp[i]) + " (of " +
                                    std::to_string(s.rows) + ") out of range");
}

#ifdef DISKFLOW_X86
constexpr bool kCanStream = true;

// Copies `bytes` (a multiple of 16) from `src` to the 16-byte aligned `dst` past the cache.
inline void stream_copy(char* dst, const char* src, size_t bytes) {
    auto* d = reinterpret_cast<__m128i*>(dst);
    const auto* q = reinterpret_cast<const __m128i*>(src);
    const size_t blocks = bytes / 16;
    size_t i = 0;
    for (; i + 4 <= blocks; i += 4) {  // a cache line a step
        const __m128i a = _mm_loadu_si128(q + i), b = _mm_loadu_si128(q + i + 1);
        const __m128i c = _mm_loadu_si128(q + i + 2), e = _mm_loadu_si128(q + i + 3);
        _mm_stream_si128(d + i, a);
        _mm_stream_si128(d + i + 1, b);
        _mm_stream_si128(d + i + 2, c);
        _mm_stream_si128(d + i + 3, e);
    }
    for (; i < blocks; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(q + i));
}

inline void stream_fence() { _mm_sfence(); }
#else
constexpr bool kCanStream = false;
inline void stream_copy(char* dst, const char* src, size_t bytes) { std::memcpy(dst, src, bytes); }
inline void stream_fence() {}
#endif

}  // namespace

uint32_t gather_rows_crc(RowMatrix o, RowMatrix s, const int64_t* sp, int64_t n, uint32_t crc) {
    check_gather(o, s, sp, n);
    const size_t rb = static_cast<size_t>(o.row_bytes);
    const bool stream = kCanStream && rb % 16 == 0 && reinterpret_cast<uintptr_t>(o.data) % 16 == 0;
    each_source_row(s, sp, n, [&](int64_t i, const char* row) {
        char* dst = o.data + i * o.row_bytes;
        if (stream) stream_copy(dst, row, rb);
        else std::memcpy(dst, row, rb);
        crc = crc32_update(crc, reinterpret_cast<const uint8_t*>(row), rb);
    });
    if (stream) stream_fence();  // the streamed rows are visible before the buffer is handed on
    return crc;
}

void gather_rows(RowMatrix o, RowMatrix s, const int64_t* sp, int64_t n) {
    check_gather(o, s, sp, n);
    const size_t rb = static_cast<size_t>(o.row_bytes);
    each_source_row(s, sp, n, [&](int64_t i, const char* row) { std::memcpy(o.data + i * o.row_bytes, row, rb); });
}

}  // namespace diskflow
