// Access counting: how often each node id occurs in a superbatch's samples, and the sum of two
// such counts. Plain C++ over raw pointers; bindings.cpp checks the arrays and releases the GIL.
//
// Counts travel as sparse (ids ascending, counts) pairs so a tree of pairwise merges reduces them
// without any task holding a dense array per superbatch. numpy builds them with a dense bincount
// over all N nodes, a flatnonzero and two gathers (and merges by scattering into a fresh dense
// array): several passes over N and a fresh N-sized array per call. Here a count is one pass over
// the accesses into a per-thread scratch array (reused, so its pages are faulted in once) and one
// scan of it; a merge is one linear pass over the two sorted runs.
#pragma once

#include <cstdint>
#include <vector>

namespace diskflow {

// (ids ascending, counts) of `nodes[0..n)`, every id in [0, num_nodes). std::invalid_argument
// names the first id out of range.
void count_ids(const int64_t* nodes, int64_t n, int64_t num_nodes, std::vector<int64_t>& ids,
               std::vector<int64_t>& counts);

// Throws std::invalid_argument naming `name` and the first id of `nodes[0..n)` outside [0, num_nodes).
template <typename Id>
void check_ids(const Id* nodes, int64_t n, int64_t num_nodes, const char* name);

// Adds one to out[v] for every v in `nodes[0..n)` (int32 or int64 ids, checked by `check_ids`
// beforehand): a superbatch's dense counts, one pass over its accesses with no copy or widening of
// the ids. Each id is checked again as it is counted (the caller's arrays are not locked while
// the GIL is released); std::overflow_error where a count would pass the largest value of `Out`
// (uint8, uint16 or int32: a superbatch of B batches of unique ids counts at most B per node, so a
// narrow array is a quarter of an int32 one to fault in, fill and add). After either error `out`
// holds the counts up to that access: discard it.
template <typename Id, typename Out>
void count_dense(const Id* nodes, int64_t n, int64_t num_nodes, Out* out);

// The sum of two sparse counts (each with ids strictly ascending, checked): ids ascending.
void merge_count_pairs(const int64_t* ids_a, const int64_t* counts_a, int64_t na, const int64_t* ids_b,
                       const int64_t* counts_b, int64_t nb, std::vector<int64_t>& ids, std::vector<int64_t>& counts);

}  // namespace diskflow
