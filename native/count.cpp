// Access counting (see count.h). No Python here.
#include "count.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace diskflow {
namespace {

// Dense counting needs a scan of all N entries; when the accesses are far fewer than N, sorting
// them is cheaper than that scan.
constexpr int64_t kDenseFactor = 16;

void check_ascending(const int64_t* ids, int64_t n, const char* name) {
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < 0) throw std::invalid_argument(std::string(name) + ": negative node id " + std::to_string(ids[i]));
        if (i > 0 && ids[i] <= ids[i - 1])
            throw std::invalid_argument(std::string(name) + ": ids must be strictly ascending (at position " +
                                        std::to_string(i) + ")");
    }
}

}  // namespace

template <typename Id>
void check_ids(const Id* nodes, int64_t n, int64_t num_nodes, const char* name) {
    if (num_nodes < 0) throw std::invalid_argument("num_nodes: must be >= 0");
    const uint64_t limit = static_cast<uint64_t>(num_nodes);
    for (int64_t i = 0; i < n; ++i)
        if (static_cast<uint64_t>(static_cast<int64_t>(nodes[i])) >= limit)   // negative ids wrap above it
            throw std::invalid_argument(std::string(name) + ": node id " +
                                        std::to_string(static_cast<int64_t>(nodes[i])) + " at position " +
                                        std::to_string(i) + " is outside [0, " + std::to_string(num_nodes) + ")");
}

void count_ids(const int64_t* nodes, int64_t n, int64_t num_nodes, std::vector<int64_t>& ids,
               std::vector<int64_t>& counts) {
    check_ids(nodes, n, num_nodes, "nodes");
    if (n >= (int64_t{1} << 32)) throw std::invalid_argument("nodes: 2^32 or more accesses in one call");
    ids.clear();
    counts.clear();
    if (n == 0) return;
    if (num_nodes > kDenseFactor * n) {  // few accesses over a large id space: sort them
        std::vector<int64_t> s(nodes, nodes + n);
        std::sort(s.begin(), s.end());
        for (int64_t i = 0; i < n;) {
            int64_t j = i + 1;
            while (j < n && s[j] == s[i]) ++j;
            ids.push_back(s[i]);
            counts.push_back(j - i);
            i = j;
        }
        return;
    }
    // A zeroed array of N counters, per call: calloc maps zero pages lazily, so only the pages the
    // accesses touch are faulted in (the scan below reads the rest as the shared zero page), and
    // nothing stays allocated between calls.
    std::unique_ptr<uint32_t, decltype(&std::free)> scratch(
        static_cast<uint32_t*>(std::calloc(static_cast<size_t>(num_nodes), sizeof(uint32_t))), &std::free);
    if (!scratch) throw std::bad_alloc();
    uint32_t* c = scratch.get();
    constexpr int64_t kAhead = 16;
    for (int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) __builtin_prefetch(c + nodes[i + kAhead], 1);
        ++c[nodes[i]];
    }
    const int64_t distinct_max = std::min<int64_t>(n, num_nodes);
    ids.reserve(static_cast<size_t>(distinct_max));
    counts.reserve(static_cast<size_t>(distinct_max));
    // Scan eight counters at a time: a block of zeros is skipped after one test.
    int64_t v = 0;
    for (; v + 8 <= num_nodes; v += 8) {
        uint64_t w[4];
        std::memcpy(w, c + v, sizeof w);  // no aliasing of the uint32 array through uint64 pointers
        if ((w[0] | w[1] | w[2] | w[3]) == 0) continue;
        for (int64_t u = v; u < v + 8; ++u)
            if (c[u]) {
                ids.push_back(u);
                counts.push_back(c[u]);
            }
    }
    for (; v < num_nodes; ++v)
        if (c[v]) {
            ids.push_back(v);
            counts.push_back(c[v]);
        }
}

template <typename Id, typename Out>
void count_dense(const Id* nodes, int64_t n, int64_t num_nodes, Out* out) {
    const uint64_t limit = static_cast<uint64_t>(std::max<int64_t>(num_nodes, 0));
    constexpr int64_t kAhead = 16;
    constexpr Out kMax = std::numeric_limits<Out>::max();
    for (int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) __builtin_prefetch(out + nodes[i + kAhead], 1);   // a prefetch never faults
        const uint64_t v = static_cast<uint64_t>(static_cast<int64_t>(nodes[i]));
        if (v >= limit) throw std::invalid_argument("nodes: an id changed while it was counted");
        if (out[v] == kMax)
            throw std::overflow_error("count_dense: a count would pass " + std::to_string(static_cast<int64_t>(kMax)) +
                                      " (count in a wider type)");
        ++out[v];
    }
}

template void check_ids<int32_t>(const int32_t*, int64_t, int64_t, const char*);
template void check_ids<int64_t>(const int64_t*, int64_t, int64_t, const char*);
template void count_dense<int32_t, uint8_t>(const int32_t*, int64_t, int64_t, uint8_t*);
template void count_dense<int64_t, uint8_t>(const int64_t*, int64_t, int64_t, uint8_t*);
template void count_dense<int32_t, uint16_t>(const int32_t*, int64_t, int64_t, uint16_t*);
template void count_dense<int64_t, uint16_t>(const int64_t*, int64_t, int64_t, uint16_t*);
template void count_dense<int32_t, int32_t>(const int32_t*, int64_t, int64_t, int32_t*);
template void count_dense<int64_t, int32_t>(const int64_t*, int64_t, int64_t, int32_t*);

void merge_count_pairs(const int64_t* ia, const int64_t* ca, int64_t na, const int64_t* ib, const int64_t* cb,
                       int64_t nb, std::vector<int64_t>& ids, std::vector<int64_t>& counts) {
    check_ascending(ia, na, "a");
    check_ascending(ib, nb, "b");
    ids.resize(static_cast<size_t>(na + nb));
    counts.resize(ids.size());
    int64_t i = 0, j = 0, k = 0;
    while (i < na && j < nb) {
        if (ia[i] < ib[j]) { ids[k] = ia[i]; counts[k++] = ca[i++]; }
        else if (ib[j] < ia[i]) { ids[k] = ib[j]; counts[k++] = cb[j++]; }
        else { ids[k] = ia[i]; counts[k++] = ca[i++] + cb[j++]; }
    }
    if (i < na) {
        std::memcpy(ids.data() + k, ia + i, sizeof(int64_t) * (na - i));
        std::memcpy(counts.data() + k, ca + i, sizeof(int64_t) * (na - i));
        k += na - i;
    }
    if (j < nb) {
        std::memcpy(ids.data() + k, ib + j, sizeof(int64_t) * (nb - j));
        std::memcpy(counts.data() + k, cb + j, sizeof(int64_t) * (nb - j));
        k += nb - j;
    }
    ids.resize(static_cast<size_t>(k));
    counts.resize(static_cast<size_t>(k));
}

}  // namespace diskflow
