// Multi-hop uniform neighbor sampling over a CSC graph, with the output of PyG's NeighborLoader
// for a homogeneous graph (disjoint=False):
//
//   n_id        seeds first, then the nodes discovered at hop 1, hop 2, ... (discovery order)
//   edge_index  [2, E] local ids, row 0 = sampled neighbour u (message source),
//               row 1 = the frontier node v it was sampled for; ordered by hop, frontier
//               position, sampled order
//   e_id        [E] each sampled edge's position in the CSC `indices` array (indptr[v] + the
//               offset drawn), column for column with edge_index (PyG's e_id), so a caller
//               can gather edge attributes stored in CSC order
//   counts      num_sampled_nodes [B, n_1..n_L], num_sampled_edges [e_1..e_L]
//
// At hop h the frontier is the set of nodes added at hop h-1 (hop 0: the seeds). A frontier
// node with deg <= fanout (or fanout -1) takes all its in-neighbours in CSC order; otherwise
// `fanout` distinct edge positions are drawn uniformly without replacement (Floyd's algorithm).
//
// Determinism: every frontier node draws from its own counter-based generator keyed by
// (seed, hop, global node id), so the output (e_id included) is a pure function of
// (graph, seeds, fanouts, seed), whatever the thread count. Each hop samples contiguous frontier
// chunks in parallel into per-chunk buffers and merges them serially in chunk order (the dedup
// that assigns local ids must see edges in order); the merge of chunk c overlaps with the
// sampling of later chunks. A chunk records each edge's position beside its neighbour as it
// draws it, into a buffer of its own that the call keeps; the merge only notes where the chunk's
// edges start, and the output e_id is copied from those buffers, in parallel, with the rest: the
// serial merge, which bounds the speed at many threads, does no more work for it.
// The dedup uses a scratch array of N entries owned by the sampler, reset through the batch's
// own node list, and a mutex makes concurrent calls on one object safe. The working buffers (the
// rows, the chunks' positions: 8 bytes per edge each, sized by the largest batches) are kept
// between calls, so a stream of batches allocates little beyond its outputs. The graph arrays
// are read in place. No Python here: bindings.cpp binds it, with the GIL released during all of it.
#include "sampler.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace diskflow {
namespace {

// Frontier nodes per work chunk at least: below this, a thread costs more than it saves.
constexpr int64_t kMinChunkNodes = 256;
// Chunks per thread at most: many, taken dynamically, so that uneven degrees balance out and the
// ordered merge starts early and finishes soon after the last chunk is sampled.
constexpr int64_t kChunksPerThread = 16;
// Up to this fanout Floyd's algorithm checks its picks by a linear scan (they sit in L1);
// above it, by a per-thread mark array indexed by edge offset.
constexpr int64_t kLinearScanMaxFanout = 32;
// Marks a node that is not (yet) in the batch, in the global -> local scratch array.
constexpr int32_t kAbsent = -1;
// Software prefetch distances (in frontier nodes, and in merged edges): the loops are bound by
// the latency of random reads of indptr, indices and the scratch array, so fetch ahead.
constexpr int64_t kPrefetchNodes = 8;
constexpr int64_t kPrefetchEdges = 16;
// Cache lines of a node's CSC range to prefetch at most.
constexpr int64_t kPrefetchLines = 4;
constexpr int64_t kCacheLine = 64;
// Output items (nodes + edges) per thread at least when writing the outputs in parallel.
constexpr int64_t kMinFinishItems = 1 << 16;

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;  // 2^64 / phi, the splitmix64 increment

// The splitmix64 finaliser: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// splitmix64: small, fast, passes BigCrush; one instance per (seed, hop, node).
class SplitMix64 {
 public:
    explicit SplitMix64(uint64_t state) : state_(state) {}

    uint64_t next() {
        state_ += kGolden;
        return mix64(state_);
    }

    // Uniform integer in [0, n) for n > 0, exactly (Lemire's multiply-then-reject method).
    uint64_t below(uint64_t n) {
        __uint128_t m = static_cast<__uint128_t>(next()) * n;
        uint64_t low = static_cast<uint64_t>(m);
        if (low < n) {
            const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
            while (low < threshold) {
                m = static_cast<__uint128_t>(next()) * n;
                low = static_cast<uint64_t>(m);
            }
        }
        return static_cast<uint64_t>(m >> 64);
    }

 private:
    uint64_t state_;
};

inline uint64_t hop_key(uint64_t seed, size_t hop) { return mix64(mix64(seed) + kGolden * (hop + 1)); }

// The generator of node v at the hop keyed `hkey`: independent of threads and batch contents.
inline SplitMix64 node_rng(uint64_t hkey, int64_t v) {
    return SplitMix64(mix64(hkey ^ mix64(static_cast<uint64_t>(v) + kGolden)));
}

// A growable array of a trivially copyable T that, unlike std::vector, does not zero what it
// grows into (the sampler overwrites every slot it uses).
template <typename T>
class PodBuffer {
 public:
    size_t size() const { return size_; }
    T* data() { return data_.get(); }
    const T* data() const { return data_.get(); }
    void clear() { size_ = 0; }
    void resize(size_t n) {
        if (n > capacity_) {
            const size_t capacity = std::max(n, 2 * capacity_);
            std::unique_ptr<T[]> grown(new T[capacity]);  // default-initialised: not zeroed
            if (size_) std::memcpy(grown.get(), data_.get(), size_ * sizeof(T));
            data_ = std::move(grown);
            capacity_ = capacity;
        }
        size_ = n;
    }
    // Hands the storage over to the caller (the buffer is left empty).
    std::unique_ptr<T[]> release() {
        size_ = capacity_ = 0;
        return std::move(data_);
    }

 private:
    std::unique_ptr<T[]> data_;
    size_t size_ = 0, capacity_ = 0;
};

// What one chunk of the frontier sampled: per frontier node the number of edges, and the global
// ids of the sampled neighbours and the CSC positions of their edges, both in output order.
struct ChunkOut {
    int64_t begin = 0, end = 0;  // frontier positions [begin, end)
    PodBuffer<int64_t> counts;  // [end - begin]
    PodBuffer<int64_t> nbrs;
    // [nbrs.size()]: the position in `indices` each neighbour was read from; a buffer the call
    // keeps until it writes its output (the chunk itself is reused at the next hop)
    PodBuffer<int64_t>* eids = nullptr;
    int64_t bad_pos = -1;  // first edge position whose source id is out of range, or -1
};

// Per-thread scratch for Floyd's algorithm.
struct Scratch {
    std::vector<int64_t> picks;  // edge offsets picked for the current node
    std::vector<uint8_t> marks;  // marks[offset] = 1 while picked (large fanouts only)
};

// Draws k distinct offsets uniformly from [0, deg) into s.picks (Floyd's algorithm: for
// j = deg-k .. deg-1 draw t in [0, j]; take t unless already taken, else take j).
inline void floyd_sample(SplitMix64& rng, int64_t deg, int64_t k, Scratch& s) {
    s.picks.clear();
    if (k <= kLinearScanMaxFanout) {
        for (int64_t j = deg - k; j < deg; ++j) {
            const int64_t t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j) + 1));
            const bool taken = std::find(s.picks.begin(), s.picks.end(), t) != s.picks.end();
            s.picks.push_back(taken ? j : t);
        }
        return;
    }
    if (s.marks.size() < static_cast<size_t>(deg)) s.marks.resize(static_cast<size_t>(deg), 0);
    for (int64_t j = deg - k; j < deg; ++j) {
        const int64_t t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j) + 1));
        const int64_t pick = s.marks[t] ? j : t;
        s.marks[pick] = 1;
        s.picks.push_back(pick);
    }
    for (int64_t p : s.picks) s.marks[p] = 0;
}

// Samples the in-neighbours of frontier[out.begin .. out.end) into `out`.
template <typename Idx>
void sample_chunk(const int64_t* indptr, const Idx* indices, int64_t num_nodes, const int64_t* frontier,
                  int64_t fanout, uint64_t hkey, const uint8_t* stop, const uint8_t* skip, int64_t thin,
                  ChunkOut& out, Scratch& s) {
    out.counts.resize(static_cast<size_t>(out.end - out.begin));
    out.nbrs.clear();
    out.eids->clear();
    out.bad_pos = -1;
    int64_t* counts = out.counts.data() - out.begin;
    size_t e = 0;  // == out.nbrs.size()
    const uint64_t n = static_cast<uint64_t>(num_nodes);
    bool bad = false;
    for (int64_t i = out.begin; i < out.end; ++i) {
        // Two-stage prefetch: indptr of the node 2D ahead, then the CSC range of the node D ahead.
        if (i + 2 * kPrefetchNodes < out.end) __builtin_prefetch(indptr + frontier[i + 2 * kPrefetchNodes]);
        if (i + kPrefetchNodes < out.end) {
            const int64_t w = frontier[i + kPrefetchNodes];
            const char* first = reinterpret_cast<const char*>(indices + indptr[w]);
            const int64_t bytes = (indptr[w + 1] - indptr[w]) * static_cast<int64_t>(sizeof(Idx));
            for (int64_t b = 0; b < std::min(bytes, kPrefetchLines * kCacheLine); b += kCacheLine) {
                __builtin_prefetch(first + b);
            }
        }
        const int64_t v = frontier[i];
        const int64_t lo = indptr[v];
        const int64_t deg = indptr[v + 1] - lo;
        const bool skipped = skip != nullptr && skip[i];
        const int64_t f = skipped ? thin : fanout;  // a skipped node draws `thin` (0: none) at the last hop
        if ((stop != nullptr && stop[v]) || (skipped && thin == 0)) {
            counts[i] = 0;  // not expanded (sample's `stop`: by global id, or by local id at the last hop)
        } else if (f < 0 || deg <= f) {
            out.nbrs.resize(e + static_cast<size_t>(deg));
            out.eids->resize(e + static_cast<size_t>(deg));
            int64_t* nbrs = out.nbrs.data();
            int64_t* eids = out.eids->data();
            for (int64_t p = lo; p < lo + deg; ++p) {
                const int64_t u = static_cast<int64_t>(indices[p]);
                bad |= static_cast<uint64_t>(u) >= n;
                eids[e] = p;
                nbrs[e++] = u;
            }
            counts[i] = deg;
        } else {
            SplitMix64 rng = node_rng(hkey, v);
            floyd_sample(rng, deg, f, s);
            out.nbrs.resize(e + static_cast<size_t>(f));
            out.eids->resize(e + static_cast<size_t>(f));
            int64_t* nbrs = out.nbrs.data();
            int64_t* eids = out.eids->data();
            for (int64_t off : s.picks) {
                const int64_t u = static_cast<int64_t>(indices[lo + off]);
                bad |= static_cast<uint64_t>(u) >= n;
                eids[e] = lo + off;
                nbrs[e++] = u;
            }
            counts[i] = f;
        }
        if (bad && out.bad_pos < 0) {  // locate the faulty edge (rare: only on corrupt graphs)
            for (int64_t p = lo; p < lo + deg; ++p) {
                if (static_cast<uint64_t>(static_cast<int64_t>(indices[p])) >= n) {
                    out.bad_pos = p;
                    break;
                }
            }
        }
    }
}

// Starts workers 1 .. n_threads-1 (the caller is worker 0); if the system refuses a thread, the
// work goes on with those started (every task is taken from a shared counter).
template <typename Worker>
void spawn_workers(std::vector<std::thread>& pool, int n_threads, Worker& worker) {
    pool.reserve(static_cast<size_t>(n_threads - 1));
    for (int w = 1; w < n_threads; ++w) {
        try {
            pool.emplace_back(worker, w);
        } catch (const std::system_error&) {
            break;
        }
    }
}

// Runs fn(task, worker) for task in [0, n_tasks) on up to n_threads threads (the caller's
// included); tasks are taken in order from a shared counter. Rethrows a worker's exception.
template <typename F>
void run_parallel(int64_t n_tasks, int n_threads, F&& fn) {
    if (n_threads <= 1 || n_tasks <= 1) {
        for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
        return;
    }
    std::atomic<int64_t> next{0};
    std::exception_ptr error;
    std::mutex error_mu;
    auto worker = [&](int w) {
        try {
            for (int64_t t; (t = next.fetch_add(1)) < n_tasks;) fn(t, w);
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mu);
            if (!error) error = std::current_exception();
            next.store(n_tasks);
        }
    };
    std::vector<std::thread> pool;
    spawn_workers(pool, n_threads, worker);
    worker(0);
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
}

// Runs produce(task, worker) for task in [0, n_tasks) on up to n_threads threads (the caller's
// included) and consume(task) on the calling thread in task order, each as soon as its task is
// produced, so the serial, ordered consumer overlaps with the parallel producers (the caller
// produces too while it waits, and sleeps when nothing is left to take, so that a busy machine's
// cores go to the producers). Rethrows the first exception, after joining the threads.
template <typename Produce, typename Consume>
void run_ordered(int64_t n_tasks, int n_threads, Produce&& produce, Consume&& consume) {
    if (n_threads <= 1 || n_tasks <= 1) {
        for (int64_t t = 0; t < n_tasks; ++t) {
            produce(t, 0);
            consume(t);
        }
        return;
    }
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    std::unique_ptr<std::atomic<bool>[]> ready(new std::atomic<bool>[n_tasks]);
    for (int64_t t = 0; t < n_tasks; ++t) ready[t].store(false, std::memory_order_relaxed);
    std::exception_ptr error;
    std::mutex error_mu;
    std::mutex wake_mu;  // with `wake`: the caller sleeps until the task it consumes next is ready
    std::condition_variable wake;
    auto notify = [&] {
        { std::lock_guard<std::mutex> lock(wake_mu); }  // orders the store before a sleeping check
        wake.notify_one();
    };
    auto fail = [&] {
        {
            std::lock_guard<std::mutex> lock(error_mu);
            if (!error) error = std::current_exception();
            failed.store(true);
            next.store(n_tasks);
        }
        notify();
    };
    auto produce_next = [&](int w) {  // false when no task is left to take
        const int64_t t = next.fetch_add(1);
        if (t >= n_tasks) return false;
        produce(t, w);
        ready[t].store(true, std::memory_order_release);
        if (w != 0) notify();
        return true;
    };
    auto worker = [&](int w) {
        try {
            while (produce_next(w)) {
            }
        } catch (...) {
            fail();
        }
    };
    std::vector<std::thread> pool;
    spawn_workers(pool, n_threads, worker);
    try {
        for (int64_t t = 0; t < n_tasks && !failed.load(); ++t) {
            while (!ready[t].load(std::memory_order_acquire) && !failed.load()) {
                if (produce_next(0)) continue;
                std::unique_lock<std::mutex> lock(wake_mu);
                wake.wait(lock, [&] { return ready[t].load(std::memory_order_acquire) || failed.load(); });
            }
            if (failed.load()) break;
            consume(t);
        }
    } catch (...) {
        fail();
    }
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
}

// The sampled subgraph, in the sampler's growable buffers.
struct Sample {
    PodBuffer<int64_t> n_id;
    PodBuffer<int64_t> edge_index;  // [2, E] row-major
    PodBuffer<int64_t> e_id;        // [E] CSC positions
    PodBuffer<int32_t> n_id32;      // narrow samples: n_id and edge_index as int32 instead
    PodBuffer<int32_t> edge_index32;
    PodBuffer<int32_t> e_id32;      // narrow samples of a graph whose edge positions fit int32: e_id
    std::vector<int64_t> num_sampled_nodes;
    std::vector<int64_t> num_sampled_edges;
};

}  // namespace

struct NeighborSampler::Impl {
    Impl(const int64_t* indptr, int64_t num_nodes, const void* indices, bool indices64, int64_t num_edges,
         std::vector<int64_t> fanouts, int num_threads)
        : indptr_ptr_(indptr), indices_ptr_(indices), indices64_(indices64), num_nodes_(num_nodes),
          num_edges_(num_edges), fanouts_(std::move(fanouts)), num_threads_(num_threads) {
        if (num_nodes_ < 0) throw std::invalid_argument("indptr must have N+1 >= 1 entries, got 0");
        if (fanouts_.empty()) throw std::invalid_argument("fanouts must name at least one hop, got []");
        for (size_t h = 0; h < fanouts_.size(); ++h) {
            if (fanouts_[h] < -1) {
                throw std::invalid_argument("fanouts[" + std::to_string(h) + "] = " + std::to_string(fanouts_[h]) +
                                            " must be >= 0, or -1 for all neighbours");
            }
        }
        if (num_threads_ < 1) {
            throw std::invalid_argument("num_threads must be >= 1, got " + std::to_string(num_threads_));
        }
        check_indptr();
    }

    SampledSubgraph sample(const int64_t* seed_ptr, int64_t batch, uint64_t seed, const int64_t* stop = nullptr,
                           int64_t n_stop = 0, bool last_hop = false, bool narrow = false, int64_t thin = 0) {
        if (thin < 0) throw std::invalid_argument("thin must be >= 0, got " + std::to_string(thin));
        const int64_t int32_ids = static_cast<int64_t>(std::numeric_limits<int32_t>::max()) + 1;  // 2^31
        if (narrow && num_nodes_ > int32_ids)
            throw std::invalid_argument("narrow: a graph of " + std::to_string(num_nodes_) +
                                        " nodes has ids past int32");
        // e_id is narrowed with the rest only when every edge position fits int32 (E <= 2^31);
        // past that it stays int64 rather than refuse a graph whose node ids fit.
        const bool narrow_eid = narrow && num_edges_ <= int32_ids;
        Sample out;
        {
            std::lock_guard<std::mutex> lock(mu_);
            StopMarks marks{stop_, stop, n_stop};
            if (n_stop > 0) {
                if (stop_.size() != static_cast<size_t>(num_nodes_)) stop_.assign(num_nodes_, 0);
                marks.set(num_nodes_);
            }
            stop_on_ = n_stop > 0;
            last_hop_ = stop_on_ && last_hop;
            thin_ = thin;
            narrow_ = narrow;
            narrow_eid_ = narrow_eid;
            if (indices64_) {
                run(static_cast<const int64_t*>(indices_ptr_), seed_ptr, batch, seed, out);
            } else {
                run(static_cast<const int32_t*>(indices_ptr_), seed_ptr, batch, seed, out);
            }
        }
        SampledSubgraph g;
        if (narrow) {
            g.num_nodes = static_cast<int64_t>(out.n_id32.size());
            g.num_edges = static_cast<int64_t>(out.edge_index32.size() / 2);
            g.n_id32 = out.n_id32.release();
            g.edge_index32 = out.edge_index32.release();
        } else {
            g.num_nodes = static_cast<int64_t>(out.n_id.size());
            g.num_edges = static_cast<int64_t>(out.edge_index.size() / 2);
            g.n_id = out.n_id.release();
            g.edge_index = out.edge_index.release();
        }
        g.e_id_narrow = narrow_eid;
        if (narrow_eid) g.e_id32 = out.e_id32.release();
        else g.e_id = out.e_id.release();
        g.num_sampled_nodes = std::move(out.num_sampled_nodes);
        g.num_sampled_edges = std::move(out.num_sampled_edges);
        return g;
    }

    // indptr[0] == 0, non-decreasing, indptr[N] == len(indices): one pass.
    void check_indptr() const {
        const int64_t* p = indptr_ptr_;
        if (p[0] != 0) throw std::invalid_argument("indptr[0] must be 0, got " + std::to_string(p[0]));
        int64_t bad = -1;
        for (int64_t i = 0; i < num_nodes_; ++i) {
            if (p[i + 1] < p[i]) {
                bad = i;
                break;
            }
        }
        if (bad >= 0) {
            throw std::invalid_argument("indptr is not non-decreasing: indptr[" + std::to_string(bad + 1) + "] = " +
                                  std::to_string(p[bad + 1]) + " < indptr[" + std::to_string(bad) + "] = " +
                                  std::to_string(p[bad]));
        }
        if (p[num_nodes_] != num_edges_) {
            throw std::invalid_argument("indptr[-1] = " + std::to_string(p[num_nodes_]) +
                                  " does not match len(indices) = " + std::to_string(num_edges_));
        }
    }

    // Marks the stop nodes for one call and clears them again however the call ends.
    struct StopMarks {
        std::vector<uint8_t>& marks;
        const int64_t* ids;
        int64_t n;
        int64_t set_count = 0;
        void set(int64_t num_nodes) {
            for (; set_count < n; ++set_count) {
                const int64_t v = ids[set_count];
                if (v < 0 || v >= num_nodes) {
                    throw std::invalid_argument("stop[" + std::to_string(set_count) + "] = " + std::to_string(v) +
                                                " is out of range [0, " + std::to_string(num_nodes) + ")");
                }
                marks[v] = 1;
            }
        }
        ~StopMarks() {
            for (int64_t i = 0; i < set_count; ++i) marks[ids[i]] = 0;
        }
    };

    // Resets the scratch entries of every node placed in the batch when `run` fails (on success
    // `finish` resets them, in parallel).
    struct ScratchReset {
        std::vector<int32_t>& local;
        const PodBuffer<int64_t>& n_id;
        bool done = false;
        ~ScratchReset() {
            if (done) return;
            for (size_t i = 0; i < n_id.size(); ++i) local[n_id.data()[i]] = kAbsent;
        }
    };

    template <typename Idx>
    void run(const Idx* indices, const int64_t* seeds, int64_t batch, uint64_t seed, Sample& out) {
        if (local_.size() != static_cast<size_t>(num_nodes_)) local_.assign(num_nodes_, kAbsent);
        if (scratch_.size() < static_cast<size_t>(num_threads_)) scratch_.resize(num_threads_);
        PodBuffer<int64_t>& n_id = n_id_;  // reused across calls; the output gets an exact copy
        n_id.clear();
        ScratchReset reset{local_, n_id};
        for (int64_t b = 0; b < batch; ++b) {
            const int64_t s = seeds[b];
            if (s < 0 || s >= num_nodes_) {
                throw std::invalid_argument("seeds[" + std::to_string(b) + "] = " + std::to_string(s) +
                                      " is out of range [0, " + std::to_string(num_nodes_) + ")");
            }
            if (local_[s] != kAbsent) {
                throw std::invalid_argument("seeds[" + std::to_string(b) + "] = " + std::to_string(s) +
                                      " duplicates seeds[" + std::to_string(local_[s]) + "]; seeds must be unique");
            }
            if (b >= std::numeric_limits<int32_t>::max()) throw std::invalid_argument("batch of more than 2^31-1 seeds");
            local_[s] = static_cast<int32_t>(b);
            n_id.resize(b + 1);
            n_id.data()[b] = s;
        }
        out.num_sampled_nodes.push_back(batch);
        rows_.clear();
        eid_start_.clear();
        if (last_hop_) taint_.assign(static_cast<size_t>(batch), 0);  // seeds are never tainted
        int64_t fs = 0, fe = batch;  // the frontier: n_id[fs, fe)
        for (size_t h = 0; h < fanouts_.size(); ++h) {
            const int64_t edges_before = static_cast<int64_t>(rows_.size());
            out_count_.resize(fe);  // edges sampled for each frontier node, by local id
            if (fe > fs && fanouts_[h] != 0) {
                sample_hop(indices, h, fanouts_[h], hop_key(seed, h), fs, fe, n_id);
            } else {
                std::fill(out_count_.data() + fs, out_count_.data() + fe, 0);
            }
            out.num_sampled_nodes.push_back(static_cast<int64_t>(n_id.size()) - fe);
            out.num_sampled_edges.push_back(static_cast<int64_t>(rows_.size()) - edges_before);
            fs = fe;
            fe = static_cast<int64_t>(n_id.size());
        }
        finish(fs, out);
        reset.done = true;
    }

    // Writes the outputs and resets the scratch array, in parallel slices: n_id (a copy),
    // edge_index = [rows; cols], cols being each expanded node's local id repeated once per edge
    // (frontiers are consecutive ranges of local ids, hop after hop, so nodes [0, expanded)), and
    // e_id, the chunks' positions gathered (sliced as the rows are).
    void finish(int64_t expanded, Sample& out) {
        if (!narrow_) finish_into(expanded, out.n_id, out.edge_index, out.e_id);
        else if (narrow_eid_) finish_into(expanded, out.n_id32, out.edge_index32, out.e_id32);
        else finish_into(expanded, out.n_id32, out.edge_index32, out.e_id);
    }

    // finish's work for output ids of type T and edge positions of type E (int64, or int32 for a
    // narrow sample: converted as copied).
    template <typename T, typename E>
    void finish_into(int64_t expanded, PodBuffer<T>& n_id_out, PodBuffer<T>& edge_index, PodBuffer<E>& e_id) {
        const int64_t n_nodes = static_cast<int64_t>(n_id_.size());
        const int64_t n_edges = static_cast<int64_t>(rows_.size());
        n_id_out.resize(static_cast<size_t>(n_nodes));
        edge_index.resize(static_cast<size_t>(2 * n_edges));
        e_id.resize(static_cast<size_t>(n_edges));
        const int64_t n_tasks =
            std::max<int64_t>(1, std::min<int64_t>(num_threads_, (n_nodes + n_edges) / kMinFinishItems));
        std::vector<int64_t> col_start(static_cast<size_t>(n_tasks) + 1, 0);  // first edge of each slice
        for (int64_t t = 0, i = 0, e = 0; t < n_tasks; ++t) {
            for (const int64_t stop = expanded * (t + 1) / n_tasks; i < stop; ++i) e += out_count_.data()[i];
            col_start[t + 1] = e;
        }
        T* rows = edge_index.data();
        T* cols = rows + n_edges;
        run_parallel(n_tasks, num_threads_, [&](int64_t t, int) {
            const int64_t e0 = n_edges * t / n_tasks, e1 = n_edges * (t + 1) / n_tasks;
            std::copy(rows_.data() + e0, rows_.data() + e1, rows + e0);
            copy_eids(e0, e1, e_id.data());
            T* col = cols + col_start[t];
            for (int64_t i = expanded * t / n_tasks; i < expanded * (t + 1) / n_tasks; ++i) {
                col = std::fill_n(col, out_count_.data()[i], static_cast<T>(i));
            }
            const int64_t v0 = n_nodes * t / n_tasks, v1 = n_nodes * (t + 1) / n_tasks;
            std::copy(n_id_.data() + v0, n_id_.data() + v1, n_id_out.data() + v0);
            for (int64_t i = v0; i < v1; ++i) local_[n_id_.data()[i]] = kAbsent;
        });
    }

    // Copies e_id[e0, e1) from the chunks' position buffers (chunk p holds the edges from
    // eid_start_[p]; e0 < e1 <= the edge count).
    template <typename E>
    void copy_eids(int64_t e0, int64_t e1, E* e_id) const {
        size_t p = static_cast<size_t>(std::upper_bound(eid_start_.begin(), eid_start_.end(), e0) -
                                       eid_start_.begin()) - 1;  // the last chunk starting at or before e0
        for (int64_t e = e0; e < e1; ++p) {
            const int64_t first = eid_start_[p];
            const int64_t last = std::min(e1, first + static_cast<int64_t>(eid_parts_[p].size()));
            std::copy(eid_parts_[p].data() + (e - first), eid_parts_[p].data() + (last - first), e_id + e);
            e = last;
        }
    }

    // One hop: the frontier's chunks are sampled in parallel and merged serially, in order, as
    // they complete (the merge overlaps with the sampling of later chunks).
    template <typename Idx>
    void sample_hop(const Idx* indices, size_t hop, int64_t fanout, uint64_t hkey, int64_t fs, int64_t fe,
                    PodBuffer<int64_t>& n_id) {
        const int64_t width = fe - fs;
        const int64_t max_chunks = static_cast<int64_t>(num_threads_) * kChunksPerThread;
        const int64_t n_chunks = std::max<int64_t>(1, std::min(max_chunks, width / kMinChunkNodes));
        if (chunks_.size() < static_cast<size_t>(n_chunks)) chunks_.resize(n_chunks);
        const size_t first_part = eid_start_.size();  // the chunks of earlier hops, all merged
        if (eid_parts_.size() < first_part + n_chunks) eid_parts_.resize(first_part + n_chunks);
        for (int64_t c = 0; c < n_chunks; ++c) {
            chunks_[c].begin = fs + width * c / n_chunks;
            chunks_[c].end = fs + width * (c + 1) / n_chunks;
            chunks_[c].eids = &eid_parts_[first_part + c];
        }
        // Stop nodes: by global id at every hop after the seeds' (their subtrees pruned), or, with
        // `last_hop`, by local id at the last hop only, together with the nodes only they reached.
        const bool last = hop + 1 == fanouts_.size();
        const uint8_t* stop = stop_on_ && !last_hop_ && hop > 0 ? stop_.data() : nullptr;
        const uint8_t* skip = last_hop_ && last ? taint_.data() : nullptr;
        const bool track = last_hop_ && !last;
        // The samplers read the frontier while the merge grows n_id: give them their own copy.
        frontier_.resize(static_cast<size_t>(width));
        std::memcpy(frontier_.data(), n_id.data() + fs, static_cast<size_t>(width) * sizeof(int64_t));
        const int64_t* frontier = frontier_.data() - fs;  // indexed by local id
        const int n_threads = static_cast<int>(std::min<int64_t>(num_threads_, n_chunks));
        run_ordered(
            n_chunks, n_threads,
            [&](int64_t c, int w) {
                sample_chunk(indptr_ptr_, indices, num_nodes_, frontier, fanout, hkey, stop, skip,
                             fanout < 0 ? thin_ : std::min(thin_, fanout), chunks_[c], scratch_[w]);
            },
            [&](int64_t c) {
                const size_t first_edge = rows_.size();
                merge_chunk(indices, hop, chunks_[c], n_id);
                if (track) track_taint(chunks_[c], first_edge, fe, n_id);
            });
    }

    // Assigns local ids to a chunk's new neighbours (discovery order), appends its edges' rows and
    // notes where its edges (and so its positions) start.
    template <typename Idx>
    void merge_chunk(const Idx* indices, size_t hop, const ChunkOut& ch, PodBuffer<int64_t>& n_id) {
        if (ch.bad_pos >= 0) {
            throw std::invalid_argument("indices[" + std::to_string(ch.bad_pos) + "] = " +
                                  std::to_string(static_cast<int64_t>(indices[ch.bad_pos])) + " is out of range [0, " +
                                  std::to_string(num_nodes_) + ") (hop " + std::to_string(hop) + ")");
        }
        std::copy_n(ch.counts.data(), ch.counts.size(), out_count_.data() + ch.begin);
        const int64_t n_nbrs = static_cast<int64_t>(ch.nbrs.size());
        // Each edge adds at most one node: refuse a batch whose local ids could overflow int32.
        size_t n = n_id.size();
        if (n + static_cast<size_t>(n_nbrs) >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
            throw std::invalid_argument("a batch could reach 2^31-1 nodes; use smaller batches or fanouts");
        }
        size_t e = rows_.size();
        rows_.resize(e + static_cast<size_t>(n_nbrs));
        eid_start_.push_back(static_cast<int64_t>(e));
        n_id.resize(n + static_cast<size_t>(n_nbrs));  // an upper bound, trimmed below
        int64_t* rows = rows_.data();
        int64_t* ids = n_id.data();
        int32_t* local = local_.data();
        const int64_t* nbr = ch.nbrs.data();
        for (int64_t j = 0; j < n_nbrs; ++j, ++e) {
            if (j + kPrefetchEdges < n_nbrs) __builtin_prefetch(local + nbr[j + kPrefetchEdges]);
            // Branch-free (new or known is unpredictable): always write the next id slot; it only
            // counts, and survives, when u is new.
            const int64_t u = nbr[j];
            const int32_t known = local[u];
            const bool fresh = known == kAbsent;
            const int32_t id = fresh ? static_cast<int32_t>(n) : known;
            local[u] = id;
            ids[n] = u;
            n += fresh;
            rows[e] = id;
        }
        n_id.resize(n);
    }

    // With `last_hop`: a node discovered at this hop (local id >= hop_start) is tainted if it is a
    // stop node or if every frontier node that drew it is tainted; tainted nodes are not expanded at
    // the last hop. New nodes start tainted (the identity of the AND over their finders).
    void track_taint(const ChunkOut& ch, size_t first_edge, int64_t hop_start, const PodBuffer<int64_t>& n_id) {
        taint_.resize(n_id.size(), 1);
        uint8_t* taint = taint_.data();
        const uint8_t* stop = stop_.data();
        const int64_t* ids = n_id.data();
        const int64_t* rows = rows_.data();
        size_t e = first_edge;
        for (int64_t i = ch.begin; i < ch.end; ++i) {
            const uint8_t finder = taint[i];
            for (int64_t c = 0, k = ch.counts.data()[i - ch.begin]; c < k; ++c, ++e) {
                const int64_t id = rows[e];
                if (id >= hop_start) taint[id] &= static_cast<uint8_t>(finder | stop[ids[id]]);
            }
        }
    }

    const int64_t* indptr_ptr_ = nullptr;  // the caller's arrays, referenced (not copied)
    const void* indices_ptr_ = nullptr;
    bool indices64_ = false;
    int64_t num_nodes_ = 0, num_edges_ = 0;
    std::vector<int64_t> fanouts_;
    int num_threads_ = 1;

    std::mutex mu_;  // guards everything below: one sample() at a time per object
    std::vector<int32_t> local_;  // global id -> local id in the current batch, kAbsent otherwise
    std::vector<uint8_t> stop_;   // 1 for the current call's stop nodes (sized on first use)
    bool stop_on_ = false;
    bool last_hop_ = false;       // stop nodes and the nodes only they reach: not expanded at the last hop
    std::vector<uint8_t> taint_;  // with last_hop_: 1 for those nodes, by local id
    int64_t thin_ = 0;            // with last_hop_: neighbours those nodes draw at the last hop (0: none)
    bool narrow_ = false;         // this call's n_id and edge_index as int32
    bool narrow_eid_ = false;     // and its e_id too (narrow_, and every edge position fits int32)
    std::vector<ChunkOut> chunks_;
    std::vector<Scratch> scratch_;
    PodBuffer<int64_t> n_id_;       // the batch's nodes, by local id
    PodBuffer<int64_t> frontier_;   // the current hop's frontier (global ids)
    PodBuffer<int64_t> rows_;       // row 0 of edge_index (local ids of sampled neighbours)
    // The positions each chunk of the current call drew (chunk after chunk, hop after hop), and the
    // first edge of each: e_id, in pieces, until finish gathers it.
    std::vector<PodBuffer<int64_t>> eid_parts_;
    std::vector<int64_t> eid_start_;
    PodBuffer<int64_t> out_count_;  // edges sampled for each frontier node, by local id
};

NeighborSampler::NeighborSampler(const int64_t* indptr, int64_t num_nodes, const void* indices, bool indices64,
                                 int64_t num_edges, std::vector<int64_t> fanouts, int num_threads)
    : impl_(std::make_unique<Impl>(indptr, num_nodes, indices, indices64, num_edges, std::move(fanouts),
                                   num_threads)) {}

NeighborSampler::~NeighborSampler() = default;

SampledSubgraph NeighborSampler::sample(const int64_t* seeds, int64_t batch, uint64_t seed) {
    return impl_->sample(seeds, batch, seed);
}

SampledSubgraph NeighborSampler::sample(const int64_t* seeds, int64_t batch, uint64_t seed, const int64_t* stop,
                                        int64_t n_stop, bool last_hop, bool narrow, int64_t thin) {
    return impl_->sample(seeds, batch, seed, stop, n_stop, last_hop, narrow, thin);
}

int64_t NeighborSampler::num_nodes() const { return impl_->num_nodes_; }
int64_t NeighborSampler::num_edges() const { return impl_->num_edges_; }
const std::vector<int64_t>& NeighborSampler::fanouts() const { return impl_->fanouts_; }
int NeighborSampler::num_threads() const { return impl_->num_threads_; }

namespace {

template <typename Idx>
void draw_range_chunk(const int64_t* starts, const int64_t* ends, const int64_t* keys, const Idx* indices,
                      int64_t begin, int64_t end, int64_t fanout, uint64_t hkey, const int64_t* offsets,
                      int64_t* nbrs, int64_t* pos, Scratch& s) {
    for (int64_t i = begin; i < end; ++i) {
        const int64_t lo = starts[i];
        const int64_t deg = ends[i] - lo;
        int64_t e = offsets[i];
        if (fanout < 0 || deg <= fanout) {
            for (int64_t p = lo; p < lo + deg; ++p) {
                pos[e] = p;
                nbrs[e++] = static_cast<int64_t>(indices[p]);
            }
        } else {
            SplitMix64 rng = node_rng(hkey, keys[i]);
            floyd_sample(rng, deg, fanout, s);
            for (int64_t off : s.picks) {
                pos[e] = lo + off;
                nbrs[e++] = static_cast<int64_t>(indices[lo + off]);
            }
        }
    }
}

}  // namespace

RangeDraws sample_ranges(const int64_t* starts, const int64_t* ends, const int64_t* keys, int64_t n,
                         const void* indices, bool indices64, int64_t num_indices, int64_t fanout, uint64_t seed,
                         uint64_t salt, int num_threads) {
    RangeDraws out;
    out.counts.reset(new int64_t[static_cast<size_t>(std::max<int64_t>(n, 1))]);
    std::vector<int64_t> offsets(static_cast<size_t>(n) + 1, 0);
    for (int64_t i = 0; i < n; ++i) {
        if (starts[i] < 0 || ends[i] < starts[i] || ends[i] > num_indices)
            throw std::invalid_argument("sample_ranges: range " + std::to_string(i) + " [" + std::to_string(starts[i]) +
                                        ", " + std::to_string(ends[i]) + ") is not within the " +
                                        std::to_string(num_indices) + " indices");
        const int64_t deg = ends[i] - starts[i];
        const int64_t c = (fanout < 0 || deg <= fanout) ? deg : fanout;
        out.counts[i] = c;
        offsets[i + 1] = offsets[i] + c;
    }
    out.total = offsets[n];
    out.nbrs.reset(new int64_t[static_cast<size_t>(std::max<int64_t>(out.total, 1))]);
    out.pos.reset(new int64_t[static_cast<size_t>(std::max<int64_t>(out.total, 1))]);
    const uint64_t hkey = mix64(mix64(seed) + kGolden * (salt + 1));
    constexpr int64_t kChunk = 4096;
    const int64_t n_tasks = (n + kChunk - 1) / kChunk;
    const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, n_tasks)));
    std::vector<Scratch> scratch(static_cast<size_t>(threads));
    run_parallel(n_tasks, threads, [&](int64_t t, int w) {
        const int64_t b = t * kChunk, e = std::min(n, b + kChunk);
        if (indices64)
            draw_range_chunk(starts, ends, keys, static_cast<const int64_t*>(indices), b, e, fanout, hkey,
                             offsets.data(), out.nbrs.get(), out.pos.get(), scratch[static_cast<size_t>(w)]);
        else
            draw_range_chunk(starts, ends, keys, static_cast<const int32_t*>(indices), b, e, fanout, hkey,
                             offsets.data(), out.nbrs.get(), out.pos.get(), scratch[static_cast<size_t>(w)]);
    });
    return out;
}

}  // namespace diskflow
