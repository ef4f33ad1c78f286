// zlib's crc32 (the gzip polynomial, reflected): the checksum of every packed segment.
// No Python here.
//
// Packing gathers each segment's rows and checksums them. Checksumming the gathered segment
// afterwards reads every byte back from memory; checksumming each row while it is still in the
// core's cache, as it is copied (rows.cpp `gather_rows_crc`), does not. Carry-less multiplication
// folds 64 bytes per step where the CPU has it (PCLMULQDQ, checked at run time); a table
// computes the same value elsewhere and for the bytes that do not fill a 16-byte block.
#pragma once

#include <cstddef>
#include <cstdint>

namespace diskflow {

// The running crc32 of `data[0..n)` after `value` (zlib's ``crc32(data, value)``; 0 to start).
uint32_t crc32_update(uint32_t value, const uint8_t* data, size_t n);

// Whether crc32_update folds with PCLMULQDQ on this CPU (else the table serves every byte).
bool crc32_folds();

// The crc32 of A followed by B from crc32(A), crc32(B) and B's length (zlib's crc32_combine):
// the checksum of a file's block from the checksums of pieces that different writers wrote.
uint32_t crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

// The running crc32 after `value` of `n` zero bytes (zlib's crc32 of a zero buffer), without the buffer.
uint32_t crc32_zeros(uint32_t value, uint64_t n);

// out[i] = crc32 of data[i*block, min((i+1)*block, n)), for every block (the last may be short).
void crc32_blocks(const uint8_t* data, size_t n, size_t block, uint32_t* out);

}  // namespace diskflow
