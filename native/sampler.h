// Neighbor sampler engine over a CSC graph (PyG NeighborLoader semantics, homogeneous,
// disjoint=False). Plain C++ over raw pointers; bindings.cpp checks the arrays, keeps them alive
// and releases the GIL. See sampler.cpp for the algorithm and its determinism. Like PyG's
// samplers it reports which edges it sampled (e_id: their positions in the CSC `indices`), so a
// batch can carry edge attributes aligned with its edge_index.
//
// Errors: std::invalid_argument naming the offending entry (an inconsistent indptr, a seed out of
// range or repeated, a corrupt indices entry, bad fanouts or thread count).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace diskflow {

// One sampled subgraph. The arrays are handed over to the caller (zero-copy into numpy).
struct SampledSubgraph {
    std::unique_ptr<int64_t[]> n_id;        // [num_nodes]: seeds first, then discovery order
    int64_t num_nodes = 0;
    std::unique_ptr<int64_t[]> edge_index;  // [2, num_edges] row-major, local ids
    int64_t num_edges = 0;
    // [num_edges]: the position in the graph's `indices` of each sampled edge (indptr[v] + the
    // offset drawn for frontier node v), column for column with edge_index: indices[e_id[j]] is
    // n_id[edge_index[0][j]] and e_id[j] lies in [indptr[v], indptr[v + 1]) for v =
    // n_id[edge_index[1][j]]. A pure function of (graph, seeds, fanouts, seed), like the rest.
    std::unique_ptr<int64_t[]> e_id;
    // A narrow sample's n_id and edge_index, int32 (n_id and edge_index above are then null).
    std::unique_ptr<int32_t[]> n_id32;
    std::unique_ptr<int32_t[]> edge_index32;
    // A narrow sample's e_id, int32, when every edge position fits (the graph has at most 2^31
    // edges; e_id is then null). A narrow sample of a larger graph keeps e_id, int64.
    std::unique_ptr<int32_t[]> e_id32;
    bool e_id_narrow = false;  // e_id is in e_id32 (both pointers are null when there are no edges)
    std::vector<int64_t> num_sampled_nodes;  // [batch, n_1 .. n_L]
    std::vector<int64_t> num_sampled_edges;  // [e_1 .. e_L]
};

class NeighborSampler {
 public:
    // indptr: int64 [num_nodes + 1]; indices: int32 (`indices64` false) or int64 [num_edges]. Both
    // are referenced, not copied: they must outlive the sampler, unchanged. Checks indptr (one pass).
    NeighborSampler(const int64_t* indptr, int64_t num_nodes, const void* indices, bool indices64,
                    int64_t num_edges, std::vector<int64_t> fanouts, int num_threads);
    ~NeighborSampler();
    NeighborSampler(const NeighborSampler&) = delete;
    NeighborSampler& operator=(const NeighborSampler&) = delete;

    // The subgraph around `batch` unique seeds; a pure function of (graph, seeds, fanouts, seed).
    // Calls on one object are serialised (a mutex); each is parallel inside.
    SampledSubgraph sample(const int64_t* seeds, int64_t batch, uint64_t seed);
    // The same, except that the `n_stop` nodes of `stop` (any order; repeats allowed) are never
    // expanded when they join a frontier after the seeds': they keep their place in n_id and the
    // edges to the nodes that sampled them, but no neighbours are drawn for them. Every other
    // node draws what it draws without `stop` (draws are a function of (seed, hop, node)).
    // With `last_hop`, the stop nodes, and the nodes that only stop nodes or such nodes drew when they
    // joined the batch, are expanded as usual except at the last hop: every node's embeddings below
    // the last layer are then exactly those of the unstopped sample, for every node that is neither.
    // `narrow`: n_id and edge_index as int32 (n_id32, edge_index32), half the bytes to write and for a
    // caller storing int32 ids to keep, with no conversion pass; std::invalid_argument when the graph
    // has more than 2^31 nodes. e_id too (e_id32) when the graph has at most 2^31 edges; past that,
    // e_id stays int64 rather than the call refuse a graph whose node ids fit int32. `thin` (with `last_hop`): the nodes not expanded at the last hop draw
    // min(thin, fanout) neighbours there instead of none (0: none), so a model's gradient through them
    // sees a neighbour's features rather than none at all.
    SampledSubgraph sample(const int64_t* seeds, int64_t batch, uint64_t seed, const int64_t* stop, int64_t n_stop,
                           bool last_hop = false, bool narrow = false, int64_t thin = 0);

    int64_t num_nodes() const;
    int64_t num_edges() const;
    const std::vector<int64_t>& fanouts() const;
    int num_threads() const;

 private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// What `sample_ranges` drew: per range its count, then the drawn neighbours and their positions in
// `indices`, range after range (each range's draws in the order the generator made them).
struct RangeDraws {
    std::unique_ptr<int64_t[]> counts;  // [n]
    std::unique_ptr<int64_t[]> nbrs;    // [total]: indices[pos[j]]
    std::unique_ptr<int64_t[]> pos;     // [total]
    int64_t total = 0;
};

// One hop of a typed (per edge type) sample: range i, [starts[i], ends[i]) of `indices`, draws
// min(fanout, its length) distinct positions (all of them when fanout < 0) with the generator of node
// keys[i] at (seed, salt), as the multi-hop sampler draws a node's neighbours at one hop; a pure
// function of (range, key, fanout, seed, salt), whatever the threads. std::invalid_argument for a range
// outside [0, num_indices).
RangeDraws sample_ranges(const int64_t* starts, const int64_t* ends, const int64_t* keys, int64_t n,
                         const void* indices, bool indices64, int64_t num_indices, int64_t fanout, uint64_t seed,
                         uint64_t salt, int num_threads);

}  // namespace diskflow
