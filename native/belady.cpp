// Belady CPU-cache planner (Ginex §3.4, batch-granular, with bypass), one superbatch per call.
//
// Model: batch i reads the set n_id_i. During batch i the CPU cache is fixed: an access to a
// resident row is a hit, any other (non-GPU) access is a miss read from disk. After batch i the
// cache becomes the (at most C) rows of {residents} U {misses of batch i} whose next use is
// soonest; a missed row that makes the cut is an insert (position in n_id_i -> slot).
//
// "Badness" orders rows, larger = evicted first:
//   * next use j inside the window (this superbatch + the lookahead): j;
//   * no use in the window but a positive tie-break frequency f: kFarBase + (kFarSpan - f), so a
//     far row ranks below every known next use and hot far rows outrank cold ones;
//   * no evidence of any future use: kNever (a resident stays until displaced; a miss is bypassed).
// Residents sit in one bucket per badness class (class Residents): a hit appends its row to a
// later bucket in O(1), and a bucket is sorted by (badness, node) only when rows are evicted from
// it, so each access costs O(1) plus its share of the sorts of the buckets evictions reach. A
// batch's misses are bucketed by class too and sorted only as far as admission gets.
//
// Two entry points. `belady_plan` maps node ids to dense local ids (an int32 array over the id
// universe when it is known and not far larger than the trace, else an open-addressing hash) and
// finds every access's next use by one backward pass (Ginex' iters/ptr arrays, in one sweep).
// `belady_trace` + `belady_simulate` split the same work in two for the prepare graph: the trace
// (next uses, first uses indexed by node id) needs only the window's ids and can be built ahead,
// in parallel; the simulation, chained superbatch to superbatch, keeps its state per node id.
// Both produce identical plans.
// No Python here: bindings.cpp checks the arrays and releases the GIL.
#include "belady.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace diskflow {
namespace {

constexpr int32_t kNoUse = kBeladyNoUse;                          // no next use inside the window
constexpr uint64_t kFarBase = uint64_t{1} << 62;                  // far rows: above every batch index
constexpr uint64_t kFarSpan = uint64_t{1} << 61;                  // frequencies are clamped to this
constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max(); // no evidence of future use

// ---------------------------------------------------------------------------------------------
// Input checking.

// Offsets must split `total` accesses into batches: offsets[0] = 0, non-decreasing, last = total.
void check_offsets(const View<int64_t>& offsets, int64_t total) {
    if (offsets.size < 1 || offsets[0] != 0)
        throw std::invalid_argument("offsets: must start with 0");
    for (int64_t b = 1; b < offsets.size; ++b)
        if (offsets[b] < offsets[b - 1])
            throw std::invalid_argument("offsets: must be non-decreasing (batch " + std::to_string(b - 1) + ")");
    if (offsets[offsets.size - 1] != total)
        throw std::invalid_argument("offsets: last offset " + std::to_string(offsets[offsets.size - 1]) +
                                    " != number of accesses " + std::to_string(total));
    if (offsets.size - 1 >= kNoUse) throw std::invalid_argument("offsets: too many batches");
    for (int64_t b = 1; b < offsets.size; ++b)
        if (offsets[b] - offsets[b - 1] >= std::numeric_limits<int32_t>::max())
            throw std::invalid_argument("offsets: batch " + std::to_string(b - 1) + " has 2^31 or more ids");
}

void check_sorted_unique(const View<int64_t>& ids, const char* name) {
    for (int64_t i = 0; i < ids.size; ++i) {
        if (ids[i] < 0) throw std::invalid_argument(std::string(name) + ": negative node id " + std::to_string(ids[i]));
        if (i > 0 && ids[i] <= ids[i - 1])
            throw std::invalid_argument(std::string(name) + ": must be sorted and unique (at position " +
                                        std::to_string(i) + ")");
    }
}

// ---------------------------------------------------------------------------------------------
// Node id -> dense local id. When the id universe [0, N) is known (the frequency array's length)
// and not far larger than the trace, a plain int32 array of N entries (one random access per
// lookup, 4 bytes a node: half the frequency array the caller already holds); otherwise an
// open-addressing hash (linear probing, grows at load 1/2). Callers range-check ids first.

class LocalIds {
public:
    LocalIds(int64_t expected, int64_t universe) {
        if (universe >= 0 && universe <= kDenseFactor * std::max<int64_t>(expected, 1024)) {
            dense_.assign(static_cast<size_t>(universe), -1);
            is_dense_ = true;
            nodes_.reserve(static_cast<size_t>(std::min<int64_t>(expected, universe)));
            return;
        }
        size_t cap = 1024;
        while (cap < static_cast<size_t>(expected) * 2) cap <<= 1;
        resize(cap);
    }

    // The local id of `node` (>= 0, and < the universe when dense), assigning the next one when it
    // is new (sets `fresh`).
    int32_t get(int64_t node, bool& fresh) {
        if (is_dense_) {
            int32_t& d = dense_[static_cast<size_t>(node)];
            fresh = d < 0;
            if (fresh) {
                d = static_cast<int32_t>(nodes_.size());
                nodes_.push_back(node);
            }
            return d;
        }
        size_t i = slot(node);
        while (table_[i].key != kFree) {
            if (table_[i].key == node) { fresh = false; return table_[i].val; }
            i = (i + 1) & mask_;
        }
        fresh = true;
        const int32_t id = static_cast<int32_t>(nodes_.size());
        table_[i] = {node, id};
        nodes_.push_back(node);
        if (nodes_.size() * 2 > table_.size()) resize(table_.size() * 2);
        return id;
    }

    // Hint that `node` will be looked up soon (the table is far larger than the CPU caches).
    void prefetch(int64_t node) const {
        if (is_dense_) __builtin_prefetch(&dense_[static_cast<size_t>(node)]);
        else __builtin_prefetch(&table_[slot(node)]);
    }

    int64_t node(int32_t local) const { return nodes_[local]; }
    int32_t size() const { return static_cast<int32_t>(nodes_.size()); }

private:
    static constexpr int64_t kFree = -1;
    static constexpr int64_t kDenseFactor = 16;  // dense when N <= 16 x the accesses of the call
    struct Entry { int64_t key; int32_t val; };

    size_t slot(int64_t node) const {
        return static_cast<size_t>((static_cast<uint64_t>(node) * 0x9E3779B97F4A7C15ull) >> shift_);
    }

    void resize(size_t cap) {
        table_.assign(cap, Entry{kFree, 0});
        mask_ = cap - 1;
        shift_ = 64;
        for (size_t c = cap; c > 1; c >>= 1) --shift_;
        for (size_t id = 0; id < nodes_.size(); ++id) {
            size_t i = slot(nodes_[id]);
            while (table_[i].key != kFree) i = (i + 1) & mask_;
            table_[i] = {nodes_[id], static_cast<int32_t>(id)};
        }
    }

    bool is_dense_ = false;
    std::vector<int32_t> dense_;
    std::vector<Entry> table_;
    std::vector<int64_t> nodes_;
    size_t mask_ = 0;
    int shift_ = 64;
};

constexpr int64_t kPrefetchAhead = 16;  // accesses between a hash prefetch and its lookup
constexpr int64_t kAdmitAhead = 8;      // admissions between a state prefetch and its write

// ---------------------------------------------------------------------------------------------
// The trace of one call, mapped to local ids, with every access's next use.

struct Trace {
    LocalIds ids;
    std::vector<int32_t> local;     // per access
    std::vector<int32_t> gpu_slot;  // per local id: slot in the GPU tier or -1
    std::vector<int32_t> first_use; // per local id: first batch using it (kNoUse: none)
    std::vector<int32_t> next_use;  // per access of the first `n_plan` batches: next batch using it

    Trace(int64_t expected, int64_t universe) : ids(expected, universe) {}
};

// Maps `extra` nodes (the initial cache) and then every access to local ids; looks GPU membership
// up once per distinct node; computes next uses (for accesses before `plan_end`) and first uses;
// rejects negative ids, ids beyond the frequency array and repeated ids inside one batch.
void build_trace(Trace& tr, const View<int64_t>& nodes, const View<int64_t>& offsets, int64_t plan_end,
                 const View<int64_t>& gpu_ids, int64_t freq_len, const std::vector<int64_t>& extra) {
    if (gpu_ids.size >= std::numeric_limits<int32_t>::max())
        throw std::invalid_argument("gpu_ids: more than 2^31 - 1 nodes");
    const uint64_t limit = freq_len >= 0 ? static_cast<uint64_t>(freq_len) : uint64_t{1} << 63;
    auto add = [&](int64_t node) -> int32_t {
        if (static_cast<uint64_t>(node) >= limit) {  // one compare: negative ids wrap above the limit
            if (node < 0) throw std::invalid_argument("nodes: negative node id " + std::to_string(node));
            throw std::invalid_argument("frequency: has " + std::to_string(freq_len) +
                                        " entries but node id " + std::to_string(node) + " occurs");
        }
        bool fresh;
        const int32_t u = tr.ids.get(node, fresh);
        if (fresh) {
            const int64_t* hit = std::lower_bound(gpu_ids.data, gpu_ids.data + gpu_ids.size, node);
            const bool in_gpu = hit != gpu_ids.data + gpu_ids.size && *hit == node;
            tr.gpu_slot.push_back(in_gpu ? static_cast<int32_t>(hit - gpu_ids.data) : -1);
        }
        return u;
    };
    for (int64_t node : extra) add(node);
    tr.local.resize(nodes.size);
    for (int64_t t = 0; t < nodes.size; ++t) {
        if (t + kPrefetchAhead < nodes.size) {
            const int64_t ahead = nodes[t + kPrefetchAhead];
            if (static_cast<uint64_t>(ahead) < limit) tr.ids.prefetch(ahead);
        }
        tr.local[t] = add(nodes[t]);
    }

    const int64_t n_batches = offsets.size - 1;
    std::vector<int32_t>& last = tr.first_use;  // becomes the first use once the sweep is done
    last.assign(tr.ids.size(), kNoUse);
    tr.next_use.resize(plan_end);
    for (int64_t b = n_batches - 1; b >= 0; --b) {
        const int32_t bi = static_cast<int32_t>(b);
        for (int64_t t = offsets[b]; t < offsets[b + 1]; ++t) {
            const int32_t u = tr.local[t];
            if (last[u] == bi)
                throw std::invalid_argument("nodes: node " + std::to_string(nodes[t]) +
                                            " occurs twice in batch " + std::to_string(b));
            if (t < plan_end) tr.next_use[t] = last[u];
            last[u] = bi;
        }
    }
}

// Badness of a row (larger = evicted first), see the header comment.
struct Ranker {
    Frequency freq;
    bool use_freq;

    uint64_t operator()(int32_t next_use, int64_t node) const {
        if (next_use != kNoUse) return static_cast<uint64_t>(next_use);
        if (!use_freq) return kNever;
        const int64_t f = freq[node];
        if (f <= 0) return kNever;
        return kFarBase + (kFarSpan - std::min<uint64_t>(static_cast<uint64_t>(f), kFarSpan));
    }
};

// Sorts [first, last) ascending by (bad, node), for the row types below (Resident, Miss): an LSD
// radix sort (digits of at most 12 bits, spread evenly) on the key ((bad - min bad) << node bits) |
// (node - min node) when the range is large and that key fits 64 bits (six passes at most),
// std::sort otherwise. Keys are distinct within a range (a node is at most once in a bucket or a
// batch), so both orders agree. `scratch` is reused from call to call.
constexpr size_t kRadixMin = 2048;

inline int bit_width(uint64_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(v); }

template <class T>
void sort_rows(T* first, T* last, std::vector<T>& scratch) {
    const size_t n = static_cast<size_t>(last - first);
    if (n < kRadixMin) {
        std::sort(first, last);
        return;
    }
    uint64_t bmin = first->bad, bmax = first->bad;
    int64_t nmin = first->node, nmax = first->node;
    for (const T* p = first; p != last; ++p) {
        bmin = std::min(bmin, p->bad);
        bmax = std::max(bmax, p->bad);
        nmin = std::min(nmin, p->node);
        nmax = std::max(nmax, p->node);
    }
    const int nb = bit_width(static_cast<uint64_t>(nmax - nmin));
    const int total = nb + bit_width(bmax - bmin);
    constexpr int kDigit = 12;  // 4096 counters (32 KiB): a pass's counts stay in L1
    if (total > 64) {  // the packed key must fit 64 bits (then at most six passes)
        std::sort(first, last);
        return;
    }
    auto key = [&](const T& r) -> uint64_t {
        return ((r.bad - bmin) << nb) | static_cast<uint64_t>(r.node - nmin);
    };
    if (scratch.size() < n) scratch.resize(n);
    T* src = first;
    T* dst = scratch.data();
    // As few passes as digits of at most kDigit bits allow, the bits spread evenly over them: a
    // bucket's key of ~23 node bits takes two passes of 12 bits, not three of 11, 11 and 1.
    const int passes = (total + kDigit - 1) / kDigit;
    const int digit = passes == 0 ? 0 : (total + passes - 1) / passes;
    std::vector<size_t> count(size_t{1} << digit);
    for (int shift = 0; shift < total; shift += digit) {
        std::fill(count.begin(), count.end(), 0);
        const uint64_t mask = (uint64_t{1} << digit) - 1;
        for (size_t i = 0; i < n; ++i) ++count[(key(src[i]) >> shift) & mask];
        size_t sum = 0;
        for (size_t& c : count) {
            const size_t k = c;
            c = sum;
            sum += k;
        }
        for (size_t i = 0; i < n; ++i) dst[count[(key(src[i]) >> shift) & mask]++] = src[i];
        std::swap(src, dst);
    }
    if (src != first) std::copy(src, src + n, first);
}

struct Resident {
    uint64_t bad;
    int64_t node;
    int64_t key;   // state index: local id (hash path) or node id (dense path)
    int32_t slot;
    bool operator<(const Resident& o) const { return bad != o.bad ? bad < o.bad : node < o.node; }
};

// The residents ordered by (badness, node), worst first out. One bucket per badness class: bucket
// j < W holds the rows next used in batch j, bucket W the far rows, W + 1 the rows without
// evidence. A hit moves a row to a later bucket and leaves a stale entry in the current batch's
// bucket, dropped wholesale after the batch. So past the current batch every entry is live, one
// per resident: no per-entry validity check. Rows are appended unordered (O(1)); a bucket is put
// in order only when rows are evicted from it (the rows appended since are sorted and merged in),
// which happens at most once per batch because the rows admitted in a batch are added after its
// evictions. Rows that are never evicted are never ordered.
class Residents {
public:
    // `spare` and `scratch`: storage kept by the caller between simulations (a `SimWorkspace`); the
    // buckets' storage goes back to `spare` when the residents are done, the largest blocks first
    // and at most `keep_rows` rows of it in all (which block serves which bucket changes from call
    // to call, so keeping every block would let each grow to the largest bucket's size).
    Residents(int64_t n_batches, std::vector<std::vector<Resident>>& spare, std::vector<Resident>& scratch,
              size_t keep_rows)
        : n_(n_batches), buckets_(n_batches + 2), spare_(spare), scratch_(scratch), keep_rows_(keep_rows) {}
    Residents(const Residents&) = delete;
    Residents& operator=(const Residents&) = delete;
    ~Residents() {
        for (Bucket& h : buckets_)
            if (h.rows.capacity()) {
                h.rows.clear();
                spare_.push_back(std::move(h.rows));
            }
        std::sort(spare_.begin(), spare_.end(),
                  [](const std::vector<Resident>& a, const std::vector<Resident>& b) { return a.capacity() > b.capacity(); });
        size_t kept = 0, n = 0;
        while (n < spare_.size() && kept + spare_[n].capacity() <= keep_rows_) kept += spare_[n++].capacity();
        spare_.resize(n);
        if (scratch_.capacity() > keep_rows_) std::vector<Resident>().swap(scratch_);
    }

    void push(const Resident& r) {
        const int64_t b = bucket(r.bad);
        Bucket& h = buckets_[b];
        if (h.rows.capacity() == 0 && !spare_.empty()) {
            h.rows.swap(spare_.back());
            spare_.pop_back();
        }
        h.rows.push_back(r);
        // Each bucket is a stream of appends: fetch the line a few rows on, so the next appends do not
        // wait to read it in.
        __builtin_prefetch(reinterpret_cast<const char*>(h.rows.data() + h.rows.size()) + 4 * 64, 1);
        top_ = std::max(top_, b);
    }

    // The worst resident, or nullptr when there is none.
    const Resident* worst() {
        while (top_ >= 0 && buckets_[top_].rows.empty()) --top_;
        if (top_ < 0) return nullptr;
        Bucket& h = buckets_[top_];
        if (h.sorted < h.rows.size()) {
            Resident* rows = h.rows.data();
            const size_t n = h.rows.size();
            sort_rows(rows + h.sorted, rows + n, scratch_);
            if (h.sorted > 0) {  // merge the sorted head and the newly sorted tail through the scratch
                if (scratch_.size() < n) scratch_.resize(n);
                std::merge(rows, rows + h.sorted, rows + h.sorted, rows + n, scratch_.data());
                std::copy(scratch_.data(), scratch_.data() + n, rows);
            }
            h.sorted = n;
        }
        return &h.rows.back();
    }

    // The resident `k` places better than the one `worst()` just returned, in its badness class, or
    // nullptr: a row soon to be evicted, whose state the caller can fetch ahead.
    const Resident* worst_ahead(size_t k) const {
        const Bucket& h = buckets_[top_];
        return k < h.rows.size() ? &h.rows[h.rows.size() - 1 - k] : nullptr;
    }

    // Removes the resident `worst()` just returned.
    void pop_worst() {
        Bucket& h = buckets_[top_];
        h.rows.pop_back();
        h.sorted = h.rows.size();
    }

    // After batch b every row next used in b has moved on: its bucket holds only stale entries.
    // Its storage is kept for a later bucket (freeing and refaulting large blocks every batch
    // costs more than the planning itself).
    void retire(int64_t b) {
        Bucket& h = buckets_[b];
        if (h.rows.capacity()) {     // a bucket that never held a row has no storage to give back
            h.rows.clear();
            spare_.push_back(std::move(h.rows));
        }
        h = Bucket();
    }

private:
    struct Bucket {
        std::vector<Resident> rows;  // ascending by (badness, node) up to `sorted`, then appended
        size_t sorted = 0;
    };

    int64_t bucket(uint64_t bad) const {
        if (bad < kFarBase) return static_cast<int64_t>(bad);
        return bad == kNever ? n_ + 1 : n_;
    }

    int64_t n_;
    std::vector<Bucket> buckets_;
    std::vector<std::vector<Resident>>& spare_;
    std::vector<Resident>& scratch_;  // radix passes and merges
    size_t keep_rows_;
    int64_t top_ = -1;
};

struct Miss {
    uint64_t bad;
    int64_t node;
    int64_t key;  // state index, as in Resident
    int32_t pos;  // position in n_id of its batch
    bool operator<(const Miss& o) const { return bad != o.bad ? bad < o.bad : node < o.node; }
};

// The scratch of one simulation, kept for the next: a chain plans superbatch after superbatch
// with arrays of the same sizes (per node, per slot, per access of a batch), and fresh ones cost
// the kernel a page fault and a zeroed page for every 4 KiB of them on every call, as much as a
// quarter of the simulation. Every array is (re)initialised before use, so a workspace carries
// no state from one call to the next; `WorkspaceLease` hands them out.
struct SimWorkspace {
    std::vector<char> held;                   // belady_simulate's check: per node, held by a slot
    std::vector<int32_t> slot_of;             // per key: CPU slot, -1 none
    std::vector<int64_t> cache;               // slot -> key
    std::vector<int64_t> free_slots;
    std::vector<Miss> missed, by_class, miss_scratch;
    std::vector<Resident> admitted;
    std::vector<std::vector<Resident>> spare;  // the residents' bucket storage
    std::vector<Resident> scratch;
};

// One idle workspace is kept process-wide (concurrent simulations beyond the first get their
// own, dropped after), so the memory kept between calls is at most one simulation's scratch.
class WorkspaceLease {
public:
    WorkspaceLease() {
        std::lock_guard<std::mutex> lock(mutex());
        ws_ = std::move(idle());
        if (!ws_) ws_ = std::make_unique<SimWorkspace>();
    }
    ~WorkspaceLease() {
        std::lock_guard<std::mutex> lock(mutex());
        if (!idle()) idle() = std::move(ws_);
    }
    WorkspaceLease(const WorkspaceLease&) = delete;
    WorkspaceLease& operator=(const WorkspaceLease&) = delete;
    SimWorkspace& operator*() { return *ws_; }

    // The idle workspace, taken out of the pool (null where none is idle).
    static std::unique_ptr<SimWorkspace> take_idle() {
        std::lock_guard<std::mutex> lock(mutex());
        return std::move(idle());
    }

private:
    // Never destroyed: a daemon thread may still be simulating while the process exits.
    static std::mutex& mutex() { static auto* m = new std::mutex(); return *m; }
    static std::unique_ptr<SimWorkspace>& idle() {
        static auto* w = new std::unique_ptr<SimWorkspace>();
        return *w;
    }
    std::unique_ptr<SimWorkspace> ws_;
};

template <class V>
int64_t capacity_bytes(const V& v) {
    return static_cast<int64_t>(v.capacity() * sizeof(typename V::value_type));
}

}  // namespace

int64_t belady_release_workspace() {
    const std::unique_ptr<SimWorkspace> ws = WorkspaceLease::take_idle();
    if (!ws) return 0;
    int64_t bytes = capacity_bytes(ws->held) + capacity_bytes(ws->slot_of) + capacity_bytes(ws->cache) +
                    capacity_bytes(ws->free_slots) + capacity_bytes(ws->missed) + capacity_bytes(ws->by_class) +
                    capacity_bytes(ws->miss_scratch) + capacity_bytes(ws->admitted) + capacity_bytes(ws->spare) +
                    capacity_bytes(ws->scratch);
    for (const auto& bucket : ws->spare) bytes += capacity_bytes(bucket);
    return bytes;   // `ws` is freed here
}

namespace {

// Per-access inputs of a simulation. State is kept per key: a dense local id (the hash path,
// `Dense` false: keys[t], first_use and gpu_slot indexed by local id) or the node id itself (the
// dense path, `Dense` true: first_use indexed by node, gpu_slot per access or empty for none).
// Both paths order rows by (badness, node id), so they produce identical plans.
struct SimInput {
    const int32_t* keys = nullptr;       // hash path: local id per access
    BatchIndices first_use;              // per key: first batch of the window using it (kNoUse: none)
    const int32_t* gpu_slot = nullptr;   // hash path: per key; dense path: per access (nullptr: none)
    const void* next_use = nullptr;      // per planned access: NU entries, NU's largest value none (simulate)
    int64_t num_keys = 0;                // state entries: distinct local ids, or the node universe N
    int64_t n_window = 0;                // batches of the window (plan + lookahead): next-use range
    const LocalIds* ids = nullptr;       // hash path: local id -> node
};

// Simulates the first `n_plan` batches; fills src/idx (one per access of those batches). `NU`: the
// type of the next uses (uint8_t, uint16_t or int32_t, see BatchIndices).
template <bool Dense, class NU>
void simulate(const SimInput& in, const View<int64_t>& nodes, const View<int64_t>& offsets, int64_t n_plan,
              int64_t capacity, const View<int64_t>& init_cache, const Ranker& rank, uint8_t* src, int64_t* idx,
              BeladyPlan& out, SimWorkspace& ws) {
    auto key_at = [&](int64_t t) -> int64_t { return Dense ? nodes[t] : in.keys[t]; };
    const NU* next_use = static_cast<const NU*>(in.next_use);
    auto next_at = [&](int64_t t) -> int32_t { return batch_index(next_use[t]); };
    auto gpu_at = [&](int64_t t, int64_t key) -> int32_t {
        if (Dense) return in.gpu_slot ? in.gpu_slot[t] : -1;
        return in.gpu_slot[key];
    };
    std::vector<int32_t>& slot_of = ws.slot_of;  // per key: CPU slot, -1 none
    slot_of.assign(static_cast<size_t>(in.num_keys), -1);
    std::vector<int64_t>& cache = ws.cache;  // slot -> key
    cache.assign(static_cast<size_t>(capacity), -1);
    int64_t largest = 0;
    for (int64_t b = 0; b < n_plan; ++b) largest = std::max(largest, offsets[b + 1] - offsets[b]);
    // the rows held, and the stale entries a batch's hits leave behind until it is retired, twice over
    Residents residents(in.n_window, ws.spare, ws.scratch, static_cast<size_t>(2 * (capacity + largest)));
    std::vector<int64_t>& free_slots = ws.free_slots;  // popped from the back: lowest slot first
    free_slots.clear();

    // Hash path: the initial cache holds local ids 0.. in slot order (build_trace mapped it first).
    for (int64_t s = capacity - 1; s >= 0; --s)
        if (init_cache[s] < 0) free_slots.push_back(s);
    int64_t next_local = 0;
    for (int64_t s = 0; s < capacity; ++s) {
        if (Dense) {  // a cache's nodes are in slot order, random by id: fetch their state ahead, in two steps
            if (s + 2 * kPrefetchAhead < capacity) {
                const int64_t far = init_cache[s + 2 * kPrefetchAhead];
                if (far >= 0) {
                    __builtin_prefetch(&slot_of[far], 1);
                    __builtin_prefetch(in.first_use.address(far));
                }
            }
            if (rank.use_freq && s + kPrefetchAhead < capacity) {   // its first use is in cache by now
                const int64_t near = init_cache[s + kPrefetchAhead];
                if (near >= 0 && in.first_use[near] == kNoUse) __builtin_prefetch(rank.freq.address(near));
            }
        }
        if (init_cache[s] < 0) continue;
        const int64_t key = Dense ? init_cache[s] : next_local++;
        slot_of[key] = static_cast<int32_t>(s);
        cache[s] = key;
        const int32_t first = in.first_use[key];
        if (first != kNoUse && (first < 0 || first >= in.n_window))
            throw std::invalid_argument("first_use: node " + std::to_string(init_cache[s]) + " is first used in batch " +
                                        std::to_string(first) + ", outside the window of " +
                                        std::to_string(in.n_window) + " batches");
        residents.push({rank(first, init_cache[s]), init_cache[s], key, static_cast<int32_t>(s)});
    }

    // This batch's admissible misses by badness class (next-use batch j < W, far rows at W);
    // admission walks the classes in order and sorts each only when it gets there.
    // Held flat, then placed class by class (a counting sort on the class), in buffers sized once
    // for the largest batch: no vector grows inside the loop.
    // Written through a raw pointer: a push_back per miss (a call and a capacity check, not inlined) took
    // a quarter of the simulation's own time in a profile.
    std::vector<Miss>& missed = ws.missed;
    if (missed.size() < static_cast<size_t>(largest)) missed.resize(static_cast<size_t>(largest));
    Miss* const miss_buf = missed.data();
    size_t n_missed = 0;
    std::vector<Miss>& by_class = ws.by_class;
    by_class.resize(static_cast<size_t>(largest));
    std::vector<int64_t> class_start(static_cast<size_t>(in.n_window) + 2);
    auto miss_class = [&](uint64_t bad) -> size_t {
        return bad < kFarBase ? static_cast<size_t>(bad) : static_cast<size_t>(in.n_window);
    };
    std::vector<Resident>& admitted = ws.admitted;
    admitted.clear();
    std::vector<Miss>& miss_scratch = ws.miss_scratch;
    out.ins_off.assign(1, 0);
    for (int64_t b = 0; b < n_plan; ++b) {
        int64_t k = 0;
        const int64_t start = offsets[b];
        const int64_t end = offsets[b + 1];
        for (int64_t t = start; t < end; ++t) {
            if (t + kPrefetchAhead < end) {  // the per-key state and frequency are random reads
                const int64_t ahead = t + kPrefetchAhead;
                __builtin_prefetch(&slot_of[key_at(ahead)]);
                if (rank.use_freq && next_at(ahead) == kNoUse) __builtin_prefetch(rank.freq.address(nodes[ahead]));
            }
            const int64_t key = key_at(t);
            const int32_t g = gpu_at(t, key);
            if (g >= 0) {
                src[t] = 0;
                idx[t] = g;
                ++out.gpu_hits;
                continue;
            }
            const uint64_t bad = rank(next_at(t), nodes[t]);
            const int32_t slot = slot_of[key];
            if (slot >= 0) {
                src[t] = 1;
                idx[t] = slot;
                ++out.hits;
                residents.push({bad, nodes[t], key, slot});
            } else {
                src[t] = 2;
                idx[t] = k++;
                if (bad != kNever && capacity > 0)
                    miss_buf[n_missed++] = Miss{bad, nodes[t], key, static_cast<int32_t>(t - start)};
            }
        }
        out.misses += k;
        residents.retire(b);

        // Admit the best misses, in (badness, node) order, while they beat the worst resident
        // (strictly) or a slot is free. The worst resident only improves meanwhile, so the first
        // miss that does not get in ends the admission.
        bool admitting = true;
        std::fill(class_start.begin(), class_start.end(), 0);
        for (size_t i = 0; i < n_missed; ++i) ++class_start[miss_class(miss_buf[i].bad) + 1];
        for (size_t c = 1; c < class_start.size(); ++c) class_start[c] += class_start[c - 1];
        for (size_t i = 0; i < n_missed; ++i)
            by_class[static_cast<size_t>(class_start[miss_class(miss_buf[i].bad)]++)] = miss_buf[i];
        n_missed = 0;
        for (size_t c = 0, lo = 0; c + 1 < class_start.size() && admitting; ++c) {
            Miss* cls = by_class.data() + lo;
            Miss* cls_end = by_class.data() + class_start[c];   // class c's end (its start before the scatter)
            lo = static_cast<size_t>(class_start[c]);
            if (cls != cls_end) {
                sort_rows(cls, cls_end, miss_scratch);
                for (const Miss* mp = cls; mp != cls_end; ++mp) {
                    const Miss& m = *mp;
                    // Admitted rows come in badness order, so their keys are random: fetch the state a
                    // miss will write some admissions ahead, as the access loop does for its reads.
                    if (cls_end - mp > kAdmitAhead) __builtin_prefetch(&slot_of[mp[kAdmitAhead].key], 1);
                    int64_t s;
                    if (!free_slots.empty()) {
                        s = free_slots.back();
                        free_slots.pop_back();
                    } else {
                        // The worst row held is the worst earlier resident or, when it is worse
                        // still or there is none, the last row admitted in this batch (added to
                        // `residents` after the loop): then no later miss beats it.
                        const Resident* worst = residents.worst();
                        if (worst == nullptr || (!admitted.empty() && *worst < admitted.back()) ||
                            !(m.bad < worst->bad)) {  // every later miss is worse still
                            admitting = false;
                            break;
                        }
                        if (const Resident* next = residents.worst_ahead(kAdmitAhead)) {  // likewise the evicted
                            __builtin_prefetch(&slot_of[next->key], 1);
                            __builtin_prefetch(&cache[next->slot], 1);
                        }
                        s = worst->slot;
                        slot_of[worst->key] = -1;
                        residents.pop_worst();
                    }
                    slot_of[m.key] = static_cast<int32_t>(s);
                    cache[s] = m.key;
                    admitted.push_back({m.bad, m.node, m.key, static_cast<int32_t>(s)});
                    out.ins_pos.push_back(m.pos);
                    out.ins_slot.push_back(s);
                }
            }
        }
        // Residents from now on. An admitted row is never the one evicted in its own batch (were it
        // the worst row held, every later miss would be no better than it: admission stops), so
        // adding them after the evictions changes nothing and keeps each bucket sorted once a batch.
        for (const Resident& r : admitted) residents.push(r);
        admitted.clear();
        out.ins_off.push_back(static_cast<int64_t>(out.ins_pos.size()));
    }
    out.final_cache.resize(capacity);
    for (int64_t s = 0; s < capacity; ++s)
        out.final_cache[s] = cache[s] < 0 ? -1 : (Dense ? cache[s] : in.ids->node(static_cast<int32_t>(cache[s])));
}

// Capacity in [0, 2^31 - 1) and one init_cache entry per slot.
void check_capacity(int64_t capacity, const View<int64_t>& init_cache) {
    if (capacity < 0 || capacity >= std::numeric_limits<int32_t>::max())
        throw std::invalid_argument("capacity: must be in [0, 2^31 - 1), got " + std::to_string(capacity));
    if (init_cache.size != capacity)
        throw std::invalid_argument("init_cache: has " + std::to_string(init_cache.size) + " slots, capacity is " +
                                    std::to_string(capacity));
}

}  // namespace

int64_t belady_planned_accesses(View<int64_t> offsets, int64_t total, int64_t n_plan) {
    check_offsets(offsets, total);
    if (n_plan < 0 || n_plan > offsets.size - 1)
        throw std::invalid_argument("n_plan: " + std::to_string(n_plan) + " is not in [0, number of batches]");
    return offsets[n_plan];
}

void belady_plan(View<int64_t> nodes, View<int64_t> offsets, int64_t n_plan, int64_t capacity,
                 View<int64_t> init_cache, View<int64_t> gpu_ids, const Frequency* frequency, uint8_t* src,
                 int64_t* idx, BeladyPlan& out) {
    const int64_t freq_len = frequency != nullptr ? frequency->size : -1;  // -1: no frequency
    const Frequency freq = frequency != nullptr ? *frequency : Frequency{};
    check_capacity(capacity, init_cache);
    const int64_t plan_end = belady_planned_accesses(offsets, nodes.size, n_plan);
    check_sorted_unique(gpu_ids, "gpu_ids");
    std::vector<int64_t> resident;
    for (int64_t s = 0; s < capacity; ++s) {
        if (init_cache[s] >= 0) resident.push_back(init_cache[s]);
        else if (init_cache[s] != -1)
            throw std::invalid_argument("init_cache: slot " + std::to_string(s) + " holds " +
                                        std::to_string(init_cache[s]) + " (expected a node id or -1)");
    }
    Trace tr(capacity + nodes.size / 4, freq_len);  // a guess at the distinct nodes; the table grows
    build_trace(tr, nodes, offsets, plan_end, gpu_ids, freq_len, resident);
    // The initial cache's nodes were mapped first: slot order gives local ids 0, 1, ...
    for (size_t r = 0; r < resident.size(); ++r) {
        bool fresh;
        if (tr.ids.get(resident[r], fresh) != static_cast<int32_t>(r))
            throw std::invalid_argument("init_cache: node " + std::to_string(resident[r]) + " is held by two slots");
        if (tr.gpu_slot[r] >= 0)
            throw std::invalid_argument("init_cache: node " + std::to_string(resident[r]) +
                                        " belongs to the GPU tier");
    }
    SimInput in;
    in.keys = tr.local.data();
    in.first_use = BatchIndices{tr.first_use.data(), static_cast<int64_t>(tr.first_use.size()), 4};
    in.gpu_slot = tr.gpu_slot.data();
    in.next_use = tr.next_use.data();
    in.num_keys = tr.ids.size();
    in.n_window = offsets.size - 1;
    in.ids = &tr.ids;
    WorkspaceLease ws;
    simulate<false, int32_t>(in, nodes, offsets, n_plan, capacity, init_cache, Ranker{freq, freq_len >= 0}, src, idx,
                             out, *ws);
}

// ---------------------------------------------------------------------------------------------
// The dense path in two steps, so that the trace (the costlier, independent half) of superbatch
// k + 1 can be built while superbatch k is simulated: `belady_trace` needs only the window's ids,
// the GPU tier and N; `belady_simulate` needs the previous plan's final cache.

// The backward sweep of `belady_trace`: next and first uses in entries of type T (none: T's largest value).
template <class T>
void sweep_window(const View<int64_t>& nodes, const View<int64_t>& offsets, int64_t plan_end, int64_t num_nodes,
                  T* nu, T* fu) {
    constexpr T kNone = std::numeric_limits<T>::max();
    std::fill(fu, fu + num_nodes, kNone);
    for (int64_t b = offsets.size - 2; b >= 0; --b) {
        const T bi = static_cast<T>(b);
        for (int64_t t = offsets[b + 1] - 1; t >= offsets[b]; --t) {
            if (t >= kPrefetchAhead) __builtin_prefetch(&fu[nodes[t - kPrefetchAhead]]);
            T& last = fu[nodes[t]];
            if (last == bi)
                throw std::invalid_argument("nodes: node " + std::to_string(nodes[t]) + " occurs twice in batch " +
                                            std::to_string(b));
            if (t < plan_end) nu[t] = last;
            last = bi;
        }
    }
}

// Backward sweep over the window with every state array indexed by node id.
void belady_trace(View<int64_t> nodes, View<int64_t> offsets, int64_t n_plan, View<int64_t> gpu_ids,
                  int64_t num_nodes, void* nu, void* fu, int32_t* gs) {
    if (num_nodes < 0) throw std::invalid_argument("num_nodes: must be >= 0, got " + std::to_string(num_nodes));
    const int64_t plan_end = belady_planned_accesses(offsets, nodes.size, n_plan);
    check_sorted_unique(gpu_ids, "gpu_ids");
    const uint64_t limit = static_cast<uint64_t>(num_nodes);
    for (int64_t t = 0; t < nodes.size; ++t)
        if (static_cast<uint64_t>(nodes[t]) >= limit) {
            if (nodes[t] < 0) throw std::invalid_argument("nodes: negative node id " + std::to_string(nodes[t]));
            throw std::invalid_argument("frequency: has " + std::to_string(num_nodes) + " entries but node id " +
                                        std::to_string(nodes[t]) + " occurs");
        }
    switch (batch_index_width(offsets.size - 1)) {
        case 1: sweep_window(nodes, offsets, plan_end, num_nodes, static_cast<uint8_t*>(nu), static_cast<uint8_t*>(fu)); break;
        case 2: sweep_window(nodes, offsets, plan_end, num_nodes, static_cast<uint16_t*>(nu), static_cast<uint16_t*>(fu)); break;
        default: sweep_window(nodes, offsets, plan_end, num_nodes, static_cast<int32_t*>(nu), static_cast<int32_t*>(fu)); break;
    }
    if (gpu_ids.size) {
        if (gpu_ids[gpu_ids.size - 1] >= num_nodes)
            throw std::invalid_argument("gpu_ids: node " + std::to_string(gpu_ids[gpu_ids.size - 1]) +
                                        " is beyond the " + std::to_string(num_nodes) + " nodes");
        std::vector<int32_t> slot(static_cast<size_t>(num_nodes), -1);
        for (int64_t g = 0; g < gpu_ids.size; ++g) slot[gpu_ids[g]] = static_cast<int32_t>(g);
        for (int64_t t = 0; t < plan_end; ++t) {
            if (t + kPrefetchAhead < plan_end) __builtin_prefetch(&slot[nodes[t + kPrefetchAhead]]);
            gs[t] = slot[nodes[t]];
        }
    }
}

// Every planned access names a node below `limit` and is next used inside the window of `n_window`
// batches, or never (NU's largest value). This pass runs on the serial chain, so it is one branch-free
// sweep the compiler vectorises; only a failure is located, by a scalar pass that names it.
template <class NU>
void check_accesses(const View<int64_t>& nodes, const NU* next_use, uint64_t limit, int64_t n_window) {
    constexpr NU kNone = std::numeric_limits<NU>::max();
    const uint64_t window = static_cast<uint64_t>(n_window);
    bool bad = false;
    for (int64_t t = 0; t < nodes.size; ++t) {
        const NU j = next_use[t];   // a negative int32 entry wraps to a huge index: outside too
        bad |= (static_cast<uint64_t>(nodes[t]) >= limit) |
               ((j != kNone) & (static_cast<uint64_t>(static_cast<int64_t>(j)) >= window));
    }
    if (!bad) return;
    for (int64_t t = 0; t < nodes.size; ++t) {
        if (static_cast<uint64_t>(nodes[t]) >= limit)
            throw std::invalid_argument("nodes: node id " + std::to_string(nodes[t]) + " outside [0, " +
                                        std::to_string(limit) + ")");
        const int32_t j = batch_index(next_use[t]);
        if (j != kNoUse && (j < 0 || j >= n_window))
            throw std::invalid_argument("next_use: access " + std::to_string(t) + " is next used in batch " +
                                        std::to_string(j) + ", outside the window of " + std::to_string(n_window) +
                                        " batches");
    }
}

// Simulates the planned batches of a window from its trace (per-node state, no id mapping).
void belady_simulate(View<int64_t> nodes, View<int64_t> offsets, int64_t n_window, int64_t capacity,
                     View<int64_t> init_cache, View<int64_t> gpu_ids, Frequency freq, BatchIndices next_use,
                     BatchIndices first_use, View<int32_t> gpu_slot, uint8_t* src, int64_t* idx, BeladyPlan& out) {
    check_capacity(capacity, init_cache);
    check_offsets(offsets, nodes.size);
    const int64_t n_plan = offsets.size - 1;
    if (n_window < n_plan) throw std::invalid_argument("n_window: smaller than the planned batches");
    if (next_use.size != nodes.size) throw std::invalid_argument("next_use: one entry per planned access expected");
    if (first_use.size != freq.size)
        throw std::invalid_argument("first_use: one entry per node of the frequency array expected");
    for (const auto& [uses, name] : {std::pair{next_use, "next_use"}, std::pair{first_use, "first_use"}})
        if (uses.width < batch_index_width(n_window))
            throw std::invalid_argument(std::string(name) + ": " + std::to_string(uses.width) +
                                        "-byte entries cannot hold a window of " + std::to_string(n_window) +
                                        " batches (trace built for a smaller window?)");
    if (gpu_slot.size != 0 && gpu_slot.size != nodes.size)
        throw std::invalid_argument("gpu_slot: one entry per planned access (or none) expected");
    if ((gpu_ids.size == 0) != (gpu_slot.size == 0) && nodes.size)
        throw std::invalid_argument("gpu_slot: does not match gpu_ids (trace built with another GPU tier?)");
    const uint64_t limit = static_cast<uint64_t>(freq.size);
    WorkspaceLease ws;
    std::vector<char>& held = (*ws).held;
    held.assign(static_cast<size_t>(freq.size), 0);
    for (int64_t s = 0; s < capacity; ++s) {
        const int64_t node = init_cache[s];
        if (node == -1) continue;
        if (static_cast<uint64_t>(node) >= limit)
            throw std::invalid_argument("init_cache: slot " + std::to_string(s) + " holds " + std::to_string(node) +
                                        " (expected a node id below " + std::to_string(freq.size) + " or -1)");
        if (held[node]) throw std::invalid_argument("init_cache: node " + std::to_string(node) + " is held by two slots");
        held[node] = 1;
        if (std::binary_search(gpu_ids.data, gpu_ids.data + gpu_ids.size, node))
            throw std::invalid_argument("init_cache: node " + std::to_string(node) + " belongs to the GPU tier");
    }
    SimInput in;
    in.first_use = first_use;
    in.gpu_slot = gpu_slot.size ? gpu_slot.data : nullptr;
    in.next_use = next_use.data;
    in.num_keys = freq.size;
    in.n_window = n_window;
    const Ranker rank{freq, true};
    // Next uses index the residents' buckets: one outside the window (a trace of another window) is
    // refused before the simulation reads them, in entries of the width they were traced in.
    auto run = [&](auto width_tag) {
        using NU = decltype(width_tag);
        check_accesses(nodes, static_cast<const NU*>(next_use.data), limit, n_window);
        simulate<true, NU>(in, nodes, offsets, n_plan, capacity, init_cache, rank, src, idx, out, *ws);
    };
    switch (next_use.width) {
        case 1: run(uint8_t{}); break;
        case 2: run(uint16_t{}); break;
        default: run(int32_t{}); break;
    }
}

std::vector<int64_t> belady_initial_fill(View<int64_t> nodes, View<int64_t> offsets, int64_t capacity,
                                         View<int64_t> gpu_ids, const Frequency* frequency) {
    const int64_t freq_len = frequency != nullptr ? frequency->size : -1;
    if (capacity < 0) throw std::invalid_argument("capacity: must be >= 0, got " + std::to_string(capacity));
    check_offsets(offsets, nodes.size);
    check_sorted_unique(gpu_ids, "gpu_ids");
    int64_t universe = 0;
    for (int64_t t = 0; t < nodes.size; ++t) {
        const int64_t node = nodes[t];
        if (node < 0) throw std::invalid_argument("nodes: negative node id " + std::to_string(node));
        if (freq_len >= 0 && node >= freq_len)
            throw std::invalid_argument("frequency: has " + std::to_string(freq_len) + " entries but node id " +
                                        std::to_string(node) + " occurs");
        universe = std::max(universe, node + 1);
    }
    std::vector<int64_t> chosen;
    if (capacity == 0 || nodes.size == 0) return chosen;
    // The batches in order: each one's nodes not met before (and not on the GPU) come next, hotter
    // first, lower id first; only the batches up to the one that fills the capacity are read.
    // `met` holds the batch (+1) that first used a node, so a node repeated within a batch is seen.
    std::unique_ptr<uint32_t, decltype(&std::free)> scratch(
        static_cast<uint32_t*>(std::calloc(static_cast<size_t>(universe), sizeof(uint32_t))), &std::free);
    if (!scratch) throw std::bad_alloc();
    uint32_t* met = scratch.get();
    // Ordered by (-frequency, node): `bad` is -frequency mapped order-preserving onto uint64, so the
    // radix sort of `sort_rows` serves (a batch's new nodes number in the hundreds of thousands).
    struct Cand {
        uint64_t bad;
        int64_t node;
        bool operator<(const Cand& o) const { return bad != o.bad ? bad < o.bad : node < o.node; }
    };
    auto rank = [&](int64_t node) -> uint64_t {
        const uint64_t f = freq_len >= 0 ? static_cast<uint64_t>((*frequency)[node]) : 0;
        return (uint64_t{0} - f) ^ (uint64_t{1} << 63);  // -f as int64, then flipped sign bit: order kept
    };
    std::vector<Cand> first, sort_scratch;
    const int64_t n_batches = offsets.size - 1;
    for (int64_t b = 0; b < n_batches && static_cast<int64_t>(chosen.size()) < capacity; ++b) {
        first.clear();
        const uint32_t mark = static_cast<uint32_t>(b + 1);
        for (int64_t t = offsets[b]; t < offsets[b + 1]; ++t) {
            const int64_t node = nodes[t];
            if (met[node] != 0) {
                if (met[node] == mark)
                    throw std::invalid_argument("nodes: node " + std::to_string(node) + " occurs twice in batch " +
                                                std::to_string(b));
                continue;
            }
            met[node] = mark;
            if (std::binary_search(gpu_ids.data, gpu_ids.data + gpu_ids.size, node)) continue;
            first.push_back({rank(node), node});
        }
        const size_t room = static_cast<size_t>(capacity) - chosen.size();
        if (first.size() > room) {
            std::nth_element(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(room), first.end());
            first.resize(room);
        }
        sort_rows(first.data(), first.data() + first.size(), sort_scratch);
        for (const Cand& c : first) chosen.push_back(c.node);
    }
    return chosen;
}

}  // namespace diskflow
