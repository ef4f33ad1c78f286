// Routing one minibatch (see route.h). No Python here.
#include "route.h"

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace diskflow {
namespace {

constexpr uint8_t kMiss = 2;    // the planner's miss = the index's packed row
constexpr uint8_t kDcache = 3;  // the index's disk-cache row

// Per-thread scratch reused by the next batch (its pages faulted in once).
struct Scratch {
    std::vector<int64_t> miss_pos, by_rank, shard, next;
};

Scratch& scratch() {
    thread_local Scratch s;
    return s;
}

}  // namespace

template <typename Id>
void route_batch(const Id* n_id, const uint8_t* src, const int64_t* idx, int64_t n, const uint8_t* in_cache,
                 const int64_t* row, int64_t layout_misses, int64_t shard_rows, int64_t num_shards, RoutedBatch& out) {
    if (shard_rows < 1 || num_shards < 1) throw std::invalid_argument("shard_rows and num_shards must be >= 1");
    Scratch& s = scratch();
    out.src.assign(src, src + n);
    out.idx.assign(idx, idx + n);
    // The misses' positions, compacted without a branch (miss or not is unpredictable), and whether the
    // plan numbered them 0..m-1 in order, checked in the same pass.
    std::vector<int64_t>& miss_pos = s.miss_pos;
    if (miss_pos.size() < static_cast<size_t>(n)) miss_pos.resize(static_cast<size_t>(n));
    int64_t m = 0;
    bool misnumbered = false;
    {
        int64_t* mp = miss_pos.data();
        for (int64_t t = 0; t < n; ++t) {
            const bool miss = src[t] == kMiss;
            misnumbered |= miss & (idx[t] != m);
            mp[m] = t;
            m += miss;
        }
    }
    if (misnumbered) throw std::invalid_argument("the plan's miss numbers are not 0..k-1 in n_id order");
    std::vector<int64_t>& by_rank = s.by_rank;  // packed rank -> position in the batch
    int64_t k = m;
    if (in_cache == nullptr) {
        by_rank.assign(miss_pos.begin(), miss_pos.begin() + m);
    } else {
        if (layout_misses != m)
            throw std::invalid_argument("the layout lists " + std::to_string(layout_misses) + " misses, the plan " +
                                        std::to_string(m));
        k = 0;
        for (int64_t i = 0; i < m; ++i) k += in_cache[i] ? 0 : 1;
        by_rank.assign(static_cast<size_t>(k), -1);
        for (int64_t i = 0; i < m; ++i) {
            const int64_t t = miss_pos[i];
            if (in_cache[i]) {
                out.src[t] = kDcache;
                out.idx[t] = row[i];
                continue;
            }
            const int64_t q = row[i];
            if (q < 0 || q >= k || by_rank[q] >= 0)
                throw std::invalid_argument("the layout's packed rows are not numbered 0.." + std::to_string(k - 1));
            by_rank[q] = t;
        }
    }
    out.counts.assign(static_cast<size_t>(num_shards), 0);
    std::vector<int64_t>& shard = s.shard;
    shard.resize(static_cast<size_t>(k));
    // A node's shard is id / shard_rows: by a multiply with the divisor's reciprocal, corrected by one
    // either way where rounding erred (a division per packed row was most of this loop).
    // Exact below 2^52 (the estimate is off by at most one there); larger ids divide.
    const double inv = 1.0 / static_cast<double>(shard_rows);
    const int64_t limit = num_shards > std::numeric_limits<int64_t>::max() / shard_rows
                              ? std::numeric_limits<int64_t>::max() : shard_rows * num_shards;
    for (int64_t q = 0; q < k; ++q) {
        const int64_t id = static_cast<int64_t>(n_id[by_rank[q]]);
        if (id < 0 || id >= limit)
            throw std::invalid_argument("packed node id outside the store's " + std::to_string(num_shards) + " shards");
        int64_t p;
        if (id < (int64_t{1} << 52)) {
            p = static_cast<int64_t>(static_cast<double>(id) * inv);
            if (p * shard_rows > id) --p;
            else if ((p + 1) * shard_rows <= id) ++p;
        } else {
            p = id / shard_rows;
        }
        shard[q] = p;
        ++out.counts[p];
    }
    std::vector<int64_t>& next = s.next;  // per shard: its next packed row
    next.assign(static_cast<size_t>(num_shards), 0);
    for (int64_t p = 1; p < num_shards; ++p) next[p] = next[p - 1] + out.counts[p - 1];
    out.ids.resize(static_cast<size_t>(k));
    for (int64_t q = 0; q < k; ++q) {  // stable: miss order within a shard
        const int64_t r = next[shard[q]]++;
        out.idx[by_rank[q]] = r;
        out.ids[r] = static_cast<int64_t>(n_id[by_rank[q]]);
    }
}

template void route_batch<int32_t>(const int32_t*, const uint8_t*, const int64_t*, int64_t, const uint8_t*,
                                   const int64_t*, int64_t, int64_t, int64_t, RoutedBatch&);
template void route_batch<int64_t>(const int64_t*, const uint8_t*, const int64_t*, int64_t, const uint8_t*,
                                   const int64_t*, int64_t, int64_t, int64_t, RoutedBatch&);

}  // namespace diskflow
