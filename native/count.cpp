// Access counting (see count.h). No Python here.
#include "count.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
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

void count_ids(const int64_t* nodes, int64_t n, int64_t num_nodes, std::vector<int64_t>& ids,
               std::vector<int64_t>& counts) {
    if (num_nodes < 0) throw std::invalid_argument("num_nodes: must be >= 0");
    const uint64_t limit = static_cast<uint64_t>(num_nodes);
    for (int64_t i = 0; i < n; ++i)
        if (static_cast<uint64_t>(nodes[i]) >= limit)  // one compare: negative ids wrap above the limit
            throw std::invalid_argument("nodes: node id " + std::to_string(nodes[i]) + " at position " +
                                        std::to_string(i) + " is outside [0, " + std::to_string(num_nodes) + ")");
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
    // One scratch array per thread, all zero between calls: its pages are faulted in once.
    thread_local std::vector<uint32_t> scratch;
    if (scratch.size() < static_cast<size_t>(num_nodes)) scratch.assign(static_cast<size_t>(num_nodes), 0);
    uint32_t* c = scratch.data();
    constexpr int64_t kAhead = 16;
    for (int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) __builtin_prefetch(c + nodes[i + kAhead], 1);
        ++c[nodes[i]];
    }
    // Scan eight entries at a time (a zero word skips them); every touched entry is reset.
    const int64_t words = num_nodes / 2;
    const uint64_t* w = reinterpret_cast<const uint64_t*>(c);
    ids.reserve(static_cast<size_t>(std::min<int64_t>(n, num_nodes)));
    counts.reserve(ids.capacity());
    auto take = [&](int64_t v) {
        if (c[v]) {
            ids.push_back(v);
            counts.push_back(c[v]);
            c[v] = 0;
        }
    };
    int64_t k = 0;
    for (; k + 4 <= words; k += 4) {
        if ((w[k] | w[k + 1] | w[k + 2] | w[k + 3]) == 0) continue;
        for (int64_t v = 2 * k; v < 2 * k + 8; ++v) take(v);
    }
    for (int64_t v = 2 * k; v < num_nodes; ++v) take(v);
}

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
