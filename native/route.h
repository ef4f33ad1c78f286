// Routing one minibatch: its plan (src 0 GPU / 1 CPU / 2 miss, idx) turned into the packed index's
// addresses, and its packed rows' node ids grouped by feature shard. Plain C++ over raw pointers;
// bindings.cpp checks the arrays and releases the GIL.
//
// numpy did this in a dozen passes per batch (positions of the misses, their ids, the shards by a
// division, a stable argsort, two scatters, two copies, a bincount), each into a fresh array whose
// pages the kernel zeroes first; here it is one pass over the batch and a counting sort of its
// packed rows by shard.
#pragma once

#include <cstdint>
#include <vector>

namespace diskflow {

struct RoutedBatch {
    std::vector<uint8_t> src;     // per position: the index's code (2 packed, 3 disk cache; 0, 1 kept)
    std::vector<int64_t> idx;     // per position: GPU/CPU slot kept, packed row, or disk-cache row
    std::vector<int64_t> counts;  // [num_shards]: packed rows per shard
    std::vector<int64_t> ids;     // packed rows' node ids in packed order (shard-major, miss order within)
};

// `n_id[n]` (int32 or int64), `src[n]`, `idx[n]`: the batch and its plan, whose misses (src 2) are
// numbered 0..m-1 in position order. `in_cache`/`row` (m each, or both null: every miss packed, in
// miss order): per miss, whether the disk cache holds it and its row there, or else its rank among
// the packed rows (a permutation of 0..k-1 over the k packed misses). Throws std::invalid_argument
// with the fault (without the batch's name: the caller prefixes it).
template <typename Id>
void route_batch(const Id* n_id, const uint8_t* src, const int64_t* idx, int64_t n, const uint8_t* in_cache,
                 const int64_t* row, int64_t layout_misses, int64_t shard_rows, int64_t num_shards, RoutedBatch& out);

}  // namespace diskflow
