// Named constants of the native engine, defined once here and exported to Python by bindings.cpp
// (diskflow.native.constants): the direct-I/O granularity and the reader's defaults. Python code
// (native/reader.py, the loader's memory budget, the on-disk formats' padding) reads them from
// there instead of restating the numbers.
#pragma once

#include <cstdint>

namespace diskflow {

// O_DIRECT granularity we enforce: offsets, lengths and buffer addresses are multiples of it. The
// on-disk formats pad their array data to it, so that every array can be read with O_DIRECT.
constexpr int64_t kAlign = 4096;
constexpr int kPageShift = 12;  // log2(kAlign)
static_assert((int64_t{1} << kPageShift) == kAlign, "kPageShift must match kAlign");
// The smallest unit read_rows may read in (set_unit_bytes): the legacy disk sector, the direct-I/O
// alignment of a device with 512-byte logical blocks.
constexpr int64_t kSector = 512;

// Requests larger than this are split: keeps the pread threads busy on one big request, and fits
// io_uring's 32-bit length field.
constexpr int64_t kMaxRequestBytes = int64_t{4} << 20;
static_assert(kMaxRequestBytes <= int64_t{UINT32_MAX}, "an io_uring read's length is 32 bits");

// The reader's defaults. Requests in flight with io_uring (the ring size), and pread threads.
constexpr int kDefaultQueueDepth = 64;
constexpr int kDefaultThreads = 4;
// read_rows: the longest run of adjacent pages read as one request, and the bounce (staging)
// buffer the pages are read into. The loader's memory budget counts the bounce buffer, so it is
// kept small: page sets larger than it are read in several rounds.
constexpr int64_t kDefaultMergeBytes = int64_t{256} << 10;
constexpr int64_t kDefaultBounceBytes = int64_t{1} << 20;
static_assert(kDefaultMergeBytes % kAlign == 0 && kDefaultMergeBytes <= kMaxRequestBytes,
              "merge_bytes must be a multiple of kAlign in [kAlign, kMaxRequestBytes]");
static_assert(kDefaultBounceBytes >= kDefaultMergeBytes, "the bounce buffer must hold one merged request");

}  // namespace diskflow
