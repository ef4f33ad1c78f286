// Neighbor sampler engine over a CSC graph (PyG NeighborLoader semantics, homogeneous,
// disjoint=False). Plain C++ over raw pointers; bindings.cpp checks the arrays, keeps them alive
// and releases the GIL. See sampler.cpp for the algorithm and its determinism.
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
    // A narrow sample's n_id and edge_index, int32 (n_id and edge_index above are then null).
    std::unique_ptr<int32_t[]> n_id32;
    std::unique_ptr<int32_t[]> edge_index32;
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
    // has 2^31 nodes or more. `thin` (with `last_hop`): the nodes not expanded at the last hop draw
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

}  // namespace diskflow
