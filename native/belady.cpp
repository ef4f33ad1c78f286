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
// Residents are ordered by (badness, node) in per-batch buckets of small max-heaps (class
// Residents): a hit moves its row to a later bucket in O(1) expected time, and the worst resident
// is the top of the highest non-empty bucket, so each access costs O(1) expected, O(log C) at worst.
//
// Node ids are mapped to dense local ids by an open-addressing hash (no array of size N), and the
// next use of every access is found by one backward pass (Ginex' iters/ptr arrays, in one sweep).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace diskflow {
namespace {

constexpr int32_t kNoUse = std::numeric_limits<int32_t>::max();  // no next use inside the window
constexpr uint64_t kFarBase = uint64_t{1} << 62;                  // far rows: above every batch index
constexpr uint64_t kFarSpan = uint64_t{1} << 61;                  // frequencies are clamped to this
constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max(); // no evidence of future use

// ---------------------------------------------------------------------------------------------
// Input checking: zero-copy views of 1-D C-contiguous numpy arrays of an exact dtype.

template <typename T>
struct View {
    const T* data = nullptr;
    int64_t size = 0;
    const T& operator[](int64_t i) const { return data[i]; }
};

template <typename T>
View<T> input(const py::object& obj, const char* name, const char* dtype_name) {
    if (!py::isinstance<py::array>(obj))
        throw py::value_error(std::string(name) + ": expected a numpy array of " + dtype_name);
    auto arr = py::reinterpret_borrow<py::array>(obj);
    if (!arr.dtype().is(py::dtype::of<T>()))
        throw py::value_error(std::string(name) + ": expected dtype " + dtype_name + ", got " +
                              std::string(py::str(arr.dtype())));
    if (arr.ndim() != 1)
        throw py::value_error(std::string(name) + ": expected a 1-D array, got " +
                              std::to_string(arr.ndim()) + " dimensions");
    if (!(arr.flags() & py::array::c_style))
        throw py::value_error(std::string(name) + ": expected a C-contiguous array");
    return View<T>{static_cast<const T*>(arr.data()), static_cast<int64_t>(arr.shape(0))};
}

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
// Node id -> dense local id (open addressing, linear probing, grows at load 1/2).

class LocalIds {
public:
    explicit LocalIds(int64_t expected) {
        size_t cap = 1024;
        while (cap < static_cast<size_t>(expected) * 2) cap <<= 1;
        resize(cap);
    }

    // The local id of `node`, assigning the next one when it is new (sets `fresh`).
    int32_t get(int64_t node, bool& fresh) {
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
    void prefetch(int64_t node) const { __builtin_prefetch(&table_[slot(node)]); }

    int64_t node(int32_t local) const { return nodes_[local]; }
    int32_t size() const { return static_cast<int32_t>(nodes_.size()); }

private:
    static constexpr int64_t kFree = -1;
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

    std::vector<Entry> table_;
    std::vector<int64_t> nodes_;
    size_t mask_ = 0;
    int shift_ = 64;
};

constexpr int64_t kPrefetchAhead = 16;  // accesses between a hash prefetch and its lookup

// ---------------------------------------------------------------------------------------------
// The trace of one call, mapped to local ids, with every access's next use.

struct Trace {
    LocalIds ids;
    std::vector<int32_t> local;     // per access
    std::vector<int32_t> gpu_slot;  // per local id: slot in the GPU tier or -1
    std::vector<int32_t> first_use; // per local id: first batch using it (kNoUse: none)
    std::vector<int32_t> next_use;  // per access of the first `n_plan` batches: next batch using it

    explicit Trace(int64_t expected) : ids(expected) {}
};

// Maps `extra` nodes (the initial cache) and then every access to local ids; looks GPU membership
// up once per distinct node; computes next uses (for accesses before `plan_end`) and first uses;
// rejects negative ids, ids beyond the frequency array and repeated ids inside one batch.
void build_trace(Trace& tr, const View<int64_t>& nodes, const View<int64_t>& offsets, int64_t plan_end,
                 const View<int64_t>& gpu_ids, int64_t freq_len, const std::vector<int64_t>& extra) {
    if (gpu_ids.size >= std::numeric_limits<int32_t>::max())
        throw std::invalid_argument("gpu_ids: more than 2^31 - 1 nodes");
    auto add = [&](int64_t node) -> int32_t {
        bool fresh;
        const int32_t u = tr.ids.get(node, fresh);
        if (fresh) {
            if (node < 0) throw std::invalid_argument("nodes: negative node id " + std::to_string(node));
            if (freq_len >= 0 && node >= freq_len)
                throw std::invalid_argument("frequency: has " + std::to_string(freq_len) +
                                            " entries but node id " + std::to_string(node) + " occurs");
            const int64_t* hit = std::lower_bound(gpu_ids.data, gpu_ids.data + gpu_ids.size, node);
            const bool in_gpu = hit != gpu_ids.data + gpu_ids.size && *hit == node;
            tr.gpu_slot.push_back(in_gpu ? static_cast<int32_t>(hit - gpu_ids.data) : -1);
        }
        return u;
    };
    for (int64_t node : extra) add(node);
    tr.local.resize(nodes.size);
    for (int64_t t = 0; t < nodes.size; ++t) {
        if (t + kPrefetchAhead < nodes.size) tr.ids.prefetch(nodes[t + kPrefetchAhead]);
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
    View<int64_t> freq;
    bool use_freq;

    uint64_t operator()(int32_t next_use, int64_t node) const {
        if (next_use != kNoUse) return static_cast<uint64_t>(next_use);
        if (!use_freq) return kNever;
        const int64_t f = freq[node];
        if (f <= 0) return kNever;
        return kFarBase + (kFarSpan - std::min<uint64_t>(static_cast<uint64_t>(f), kFarSpan));
    }
};

struct Resident {
    uint64_t bad;
    int64_t node;
    int32_t u;
    int32_t slot;
    bool operator<(const Resident& o) const { return bad != o.bad ? bad < o.bad : node < o.node; }
};

// The residents ordered by (badness, node), worst first out. One max-heap per bucket: bucket j < W
// holds the rows next used in batch j, bucket W the far rows, W + 1 the rows without evidence. A
// hit moves a row to a later bucket (pushed onto a small heap, O(1) expected for random node ids)
// and leaves a stale entry in the current batch's bucket, dropped wholesale after the batch. So
// past the current batch every entry is live, one per resident: no per-entry validity check.
class Residents {
public:
    explicit Residents(int64_t n_batches) : n_(n_batches), buckets_(n_batches + 2) {}

    void push(const Resident& r) {
        const int64_t b = bucket(r.bad);
        auto& h = buckets_[b];
        h.push_back(r);
        std::push_heap(h.begin(), h.end());
        top_ = std::max(top_, b);
    }

    // The worst resident (the cache must not be empty).
    const Resident& worst() {
        while (buckets_[top_].empty()) --top_;
        return buckets_[top_].front();
    }

    void pop_worst() { pop_from(buckets_[top_]); }

    // After batch b every row next used in b has moved on: its bucket holds only stale entries.
    void retire(int64_t b) { std::vector<Resident>().swap(buckets_[b]); }

private:
    int64_t bucket(uint64_t bad) const {
        if (bad < kFarBase) return static_cast<int64_t>(bad);
        return bad == kNever ? n_ + 1 : n_;
    }
    static void pop_from(std::vector<Resident>& h) {
        std::pop_heap(h.begin(), h.end());
        h.pop_back();
    }

    int64_t n_;
    std::vector<std::vector<Resident>> buckets_;
    int64_t top_ = -1;
};

struct Miss {
    uint64_t bad;
    int64_t node;
    int32_t pos;  // position in n_id of its batch
    int32_t u;
    bool operator<(const Miss& o) const { return bad != o.bad ? bad < o.bad : node < o.node; }
};

struct PlanOut {
    std::vector<int64_t> ins_pos, ins_slot, ins_off, final_cache;
    int64_t hits = 0, misses = 0, gpu_hits = 0;
};

// Simulates the first `n_plan` batches; fills src/idx (one per access of those batches).
void simulate(const Trace& tr, const View<int64_t>& nodes, const View<int64_t>& offsets, int64_t n_plan,
              int64_t capacity, const View<int64_t>& init_cache, const Ranker& rank, uint8_t* src, int64_t* idx,
              PlanOut& out) {
    struct State { int32_t slot; int32_t gpu; };  // per local id: CPU slot (-1: not resident), GPU slot
    std::vector<State> st(tr.ids.size());
    for (int32_t u = 0; u < tr.ids.size(); ++u) st[u] = {-1, tr.gpu_slot[u]};
    std::vector<int32_t> cache(capacity, -1);  // slot -> local id
    Residents residents(offsets.size - 1);
    std::vector<int64_t> free_slots;  // popped from the back: lowest slot first

    // The initial cache holds local ids 0.. in slot order (build_trace mapped it first).
    for (int64_t s = capacity - 1; s >= 0; --s)
        if (init_cache[s] < 0) free_slots.push_back(s);
    int32_t u = 0;
    for (int64_t s = 0; s < capacity; ++s) {
        if (init_cache[s] < 0) continue;
        st[u].slot = static_cast<int32_t>(s);
        cache[s] = u;
        residents.push({rank(tr.first_use[u], init_cache[s]), init_cache[s], u, static_cast<int32_t>(s)});
        ++u;
    }

    std::vector<Miss> missed;
    out.ins_off.assign(1, 0);
    for (int64_t b = 0; b < n_plan; ++b) {
        missed.clear();
        int64_t k = 0;
        const int64_t start = offsets[b];
        const int64_t end = offsets[b + 1];
        for (int64_t t = start; t < end; ++t) {
            if (t + kPrefetchAhead < end) {  // the per-node state and frequency are random reads
                const int64_t ahead = t + kPrefetchAhead;
                __builtin_prefetch(&st[tr.local[ahead]]);
                if (rank.use_freq && tr.next_use[ahead] == kNoUse) __builtin_prefetch(&rank.freq[nodes[ahead]]);
            }
            State& x = st[tr.local[t]];
            if (x.gpu >= 0) {
                src[t] = 0;
                idx[t] = x.gpu;
                ++out.gpu_hits;
                continue;
            }
            const uint64_t bad = rank(tr.next_use[t], nodes[t]);
            if (x.slot >= 0) {
                src[t] = 1;
                idx[t] = x.slot;
                ++out.hits;
                residents.push({bad, nodes[t], tr.local[t], x.slot});
            } else {
                src[t] = 2;
                idx[t] = k++;
                if (bad != kNever && capacity > 0)
                    missed.push_back({bad, nodes[t], static_cast<int32_t>(t - start), tr.local[t]});
            }
        }
        out.misses += k;
        residents.retire(b);

        // Admit the best misses while they beat the worst resident (strictly) or a slot is free.
        // The worst resident only improves meanwhile, so misses no better than it now never get in.
        if (free_slots.empty() && !missed.empty()) {
            const uint64_t bar = residents.worst().bad;
            missed.erase(std::remove_if(missed.begin(), missed.end(), [bar](const Miss& m) { return m.bad >= bar; }),
                         missed.end());
        }
        std::sort(missed.begin(), missed.end());
        for (const Miss& m : missed) {
            int64_t s;
            if (!free_slots.empty()) {
                s = free_slots.back();
                free_slots.pop_back();
            } else {
                const Resident& worst = residents.worst();
                if (!(m.bad < worst.bad)) break;  // every later miss is worse still
                s = worst.slot;
                st[worst.u].slot = -1;
                residents.pop_worst();
            }
            st[m.u].slot = static_cast<int32_t>(s);
            cache[s] = m.u;
            residents.push({m.bad, m.node, m.u, static_cast<int32_t>(s)});
            out.ins_pos.push_back(m.pos);
            out.ins_slot.push_back(s);
        }
        out.ins_off.push_back(static_cast<int64_t>(out.ins_pos.size()));
    }
    out.final_cache.resize(capacity);
    for (int64_t s = 0; s < capacity; ++s) out.final_cache[s] = cache[s] < 0 ? -1 : tr.ids.node(cache[s]);
}

template <typename T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
    auto* heap_vec = new std::vector<T>(std::move(v));
    py::capsule owner(heap_vec, [](void* p) { delete static_cast<std::vector<T>*>(p); });
    return py::array_t<T>({static_cast<py::ssize_t>(heap_vec->size())}, {sizeof(T)}, heap_vec->data(), owner);
}

// Frequency: None, or int64 [N]; returns the view and its length (-1 for None).
View<int64_t> frequency_view(const py::object& frequency, int64_t& freq_len) {
    if (frequency.is_none()) { freq_len = -1; return {}; }
    View<int64_t> f = input<int64_t>(frequency, "frequency", "int64");
    freq_len = f.size;
    return f;
}

py::dict plan(const py::object& nodes_obj, const py::object& offsets_obj, int64_t n_plan, int64_t capacity,
              const py::object& init_obj, const py::object& gpu_obj, const py::object& freq_obj) {
    const auto nodes = input<int64_t>(nodes_obj, "nodes", "int64");
    const auto offsets = input<int64_t>(offsets_obj, "offsets", "int64");
    const auto init_cache = input<int64_t>(init_obj, "init_cache", "int64");
    const auto gpu_ids = input<int64_t>(gpu_obj, "gpu_ids", "int64");
    int64_t freq_len;
    const auto freq = frequency_view(freq_obj, freq_len);
    if (capacity < 0 || capacity >= std::numeric_limits<int32_t>::max())
        throw py::value_error("capacity: must be in [0, 2^31 - 1), got " + std::to_string(capacity));
    if (init_cache.size != capacity)
        throw py::value_error("init_cache: has " + std::to_string(init_cache.size) + " slots, capacity is " +
                              std::to_string(capacity));
    check_offsets(offsets, nodes.size);
    if (n_plan < 0 || n_plan > offsets.size - 1)
        throw py::value_error("n_plan: " + std::to_string(n_plan) + " is not in [0, number of batches]");
    const int64_t plan_end = offsets[n_plan];
    py::array_t<uint8_t> src(plan_end);
    py::array_t<int64_t> idx(plan_end);
    uint8_t* src_p = src.mutable_data();
    int64_t* idx_p = idx.mutable_data();
    PlanOut out;
    {
        py::gil_scoped_release release;
        check_sorted_unique(gpu_ids, "gpu_ids");
        std::vector<int64_t> resident;
        for (int64_t s = 0; s < capacity; ++s) {
            if (init_cache[s] >= 0) resident.push_back(init_cache[s]);
            else if (init_cache[s] != -1)
                throw std::invalid_argument("init_cache: slot " + std::to_string(s) + " holds " +
                                            std::to_string(init_cache[s]) + " (expected a node id or -1)");
        }
        Trace tr(capacity + nodes.size / 4);  // a guess at the distinct nodes; the table grows
        build_trace(tr, nodes, offsets, plan_end, gpu_ids, freq_len, resident);
        // The initial cache's nodes were mapped first: slot order gives local ids 0, 1, ...
        for (size_t r = 0; r < resident.size(); ++r) {
            bool fresh;
            if (tr.ids.get(resident[r], fresh) != static_cast<int32_t>(r))
                throw std::invalid_argument("init_cache: node " + std::to_string(resident[r]) +
                                            " is held by two slots");
            if (tr.gpu_slot[r] >= 0)
                throw std::invalid_argument("init_cache: node " + std::to_string(resident[r]) +
                                            " belongs to the GPU tier");
        }
        simulate(tr, nodes, offsets, n_plan, capacity, init_cache, Ranker{freq, freq_len >= 0}, src_p, idx_p, out);
    }
    py::dict d;
    d["src"] = src;
    d["idx"] = idx;
    d["insert_pos"] = to_numpy(std::move(out.ins_pos));
    d["insert_slot"] = to_numpy(std::move(out.ins_slot));
    d["insert_offsets"] = to_numpy(std::move(out.ins_off));
    d["final_cache"] = to_numpy(std::move(out.final_cache));
    d["hits"] = out.hits;
    d["misses"] = out.misses;
    d["gpu_hits"] = out.gpu_hits;
    return d;
}

// The (at most) `capacity` non-GPU nodes with the soonest first use, then the higher frequency,
// then the lower id, in that order.
py::array_t<int64_t> initial_fill(const py::object& nodes_obj, const py::object& offsets_obj, int64_t capacity,
                                  const py::object& gpu_obj, const py::object& freq_obj) {
    const auto nodes = input<int64_t>(nodes_obj, "nodes", "int64");
    const auto offsets = input<int64_t>(offsets_obj, "offsets", "int64");
    const auto gpu_ids = input<int64_t>(gpu_obj, "gpu_ids", "int64");
    int64_t freq_len;
    const auto freq = frequency_view(freq_obj, freq_len);
    if (capacity < 0) throw py::value_error("capacity: must be >= 0, got " + std::to_string(capacity));
    std::vector<int64_t> chosen;
    {
        py::gil_scoped_release release;
        check_offsets(offsets, nodes.size);
        check_sorted_unique(gpu_ids, "gpu_ids");
        Trace tr(nodes.size / 4);
        build_trace(tr, nodes, offsets, 0, gpu_ids, freq_len, {});
        struct Cand { int32_t first; int64_t neg_freq; int64_t node; };
        std::vector<Cand> cands;
        cands.reserve(tr.ids.size());
        for (int32_t u = 0; u < tr.ids.size(); ++u) {
            if (tr.gpu_slot[u] >= 0) continue;
            const int64_t node = tr.ids.node(u);
            cands.push_back({tr.first_use[u], freq_len >= 0 ? -freq[node] : 0, node});
        }
        auto better = [](const Cand& a, const Cand& b) {
            if (a.first != b.first) return a.first < b.first;
            if (a.neg_freq != b.neg_freq) return a.neg_freq < b.neg_freq;
            return a.node < b.node;
        };
        const size_t k = std::min<size_t>(static_cast<size_t>(capacity), cands.size());
        std::nth_element(cands.begin(), cands.begin() + k, cands.end(), better);
        std::sort(cands.begin(), cands.begin() + k, better);
        chosen.reserve(k);
        for (size_t i = 0; i < k; ++i) chosen.push_back(cands[i].node);
    }
    return to_numpy(std::move(chosen));
}

}  // namespace

void register_belady(py::module_& m) {
    m.def("belady_plan", &plan, py::arg("nodes"), py::arg("offsets"), py::arg("n_plan"), py::arg("capacity"),
          py::arg("init_cache"), py::arg("gpu_ids"), py::arg("frequency"),
          "Belady CPU-cache plan of the first n_plan batches of a concatenated trace (the rest is lookahead).\n"
          "nodes/offsets/init_cache/gpu_ids/frequency: int64 1-D C-contiguous (frequency may be None).\n"
          "Returns a dict: src (uint8), idx, insert_pos, insert_slot, insert_offsets, final_cache (int64),\n"
          "hits, misses, gpu_hits. Raises ValueError on bad input.");
    m.def("belady_initial_fill", &initial_fill, py::arg("nodes"), py::arg("offsets"), py::arg("capacity"),
          py::arg("gpu_ids"), py::arg("frequency"),
          "The <= capacity non-GPU nodes of the trace with the soonest first use (then higher frequency,\n"
          "then lower id), best first. Raises ValueError on bad input.");
}

}  // namespace diskflow
