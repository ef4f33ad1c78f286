// Row copies between feature matrices: out[out_pos[i]] = src[src_rows[i]], one memcpy per row.
// Plain C++ over raw pointers; bindings.cpp checks the arrays and releases the GIL.
//
// Assembling a batch moves every row of it once: from the GPU/CPU tier or the staged disk rows
// into the batch's matrix, and planned inserts from the batch into the CPU tier. numpy's
// `out[pos] = src[idx]` does it in two passes (a gathered temporary, then a scatter), doubling the
// memory traffic and faulting in a fresh temporary for every batch; this is one pass.
#pragma once

#include <cstdint>

namespace diskflow {

// A C-contiguous matrix of `rows` rows of `row_bytes` bytes each.
struct RowMatrix {
    char* data;
    int64_t rows;
    int64_t row_bytes;
};

// out[out_pos[i]] = src[src_rows[i]] for i in [0, n); both matrices have the same row_bytes.
// Every position is checked before anything is copied: std::out_of_range names the first bad one.
void copy_rows(RowMatrix out, const int64_t* out_pos, RowMatrix src, const int64_t* src_rows, int64_t n);

// out[i] = src[src_rows[i]] for i in [0, n): a gather into consecutive rows (packing a segment),
// `out` holding at least n rows. Checked first, as copy_rows.
void gather_rows(RowMatrix out, RowMatrix src, const int64_t* src_rows, int64_t n);

// gather_rows that also returns the running crc32 (zlib's, after `crc`) of the n rows written: each
// row is checksummed from the source while it is in cache, and written with non-temporal stores
// where rows and `out` are 16-byte aligned (a packed segment is written to disk, not read again:
// streaming it past the cache saves reading every destination line first). Checked first, as
// copy_rows.
uint32_t gather_rows_crc(RowMatrix out, RowMatrix src, const int64_t* src_rows, int64_t n, uint32_t crc);

}  // namespace diskflow
