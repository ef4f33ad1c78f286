// Belady CPU-cache planner engine (Ginex §3.4, batch-granular, with bypass): plain C++ over raw
// arrays; bindings.cpp checks the numpy arrays, allocates the outputs and releases the GIL. See
// belady.cpp for the model and the algorithm.
//
// A trace is a concatenation of batches: `nodes` holds every batch's node ids (unique within a
// batch), `offsets` [B + 1] cuts it into batches. The first `n_plan` batches are planned, the rest
// is lookahead. Per planned access the plan says where the row is read from (src: 0 GPU tier,
// 1 CPU cache, 2 miss) and at which index (idx: GPU slot, CPU slot, or the miss's rank in its
// batch); per batch, which missed rows are inserted into which CPU slots.
//
// Errors: std::invalid_argument naming the input and the offending entry.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace diskflow {

// A read-only view of a 1-D array.
template <typename T>
struct View {
    const T* data = nullptr;
    int64_t size = 0;
    const T& operator[](int64_t i) const { return data[i]; }
};

// Per-node access counts, int32 or int64 as the caller holds them (a round's counts fit int32 in
// practice, and an int64 copy of them costs an allocation of 8 bytes a node on the way to the plan).
struct Frequency {
    const int32_t* c32 = nullptr;
    const int64_t* c64 = nullptr;
    int64_t size = 0;
    int64_t operator[](int64_t i) const { return c32 != nullptr ? c32[i] : c64[i]; }
    const void* address(int64_t i) const {
        return c32 != nullptr ? static_cast<const void*>(c32 + i) : static_cast<const void*>(c64 + i);
    }
};

// first_use / next_use entry of a node with no use inside the window.
constexpr int32_t kBeladyNoUse = std::numeric_limits<int32_t>::max();

// A window trace's batch indices (each access's next use, each node's first use), in the narrowest
// type that holds the window's batch indices and "none" (the type's largest value): uint8 below 255
// batches, uint16 below 65535, else int32 (`batch_index_width`). At a few batches a window, a byte
// instead of four is most of what a trace allocates, zeroes and ships (first uses: one per node).
template <class T>
inline int32_t batch_index(T v) {   // an entry as a batch index, kBeladyNoUse for none
    return v == std::numeric_limits<T>::max() ? kBeladyNoUse : static_cast<int32_t>(v);
}

struct BatchIndices {
    const void* data = nullptr;
    int64_t size = 0;
    int width = 4;   // bytes per entry: 1, 2 or 4
    int32_t operator[](int64_t i) const {   // kBeladyNoUse for none
        if (width == 1) return batch_index(static_cast<const uint8_t*>(data)[i]);
        if (width == 2) return batch_index(static_cast<const uint16_t*>(data)[i]);
        return batch_index(static_cast<const int32_t*>(data)[i]);
    }
    const void* address(int64_t i) const { return static_cast<const char*>(data) + i * width; }
};

// Bytes per next_use / first_use entry for a window of `n_window` batches (1, 2 or 4).
inline int batch_index_width(int64_t n_window) {
    return n_window < std::numeric_limits<uint8_t>::max() ? 1 : n_window < std::numeric_limits<uint16_t>::max() ? 2 : 4;
}

// What a plan holds besides its per-access src/idx (which are written to caller memory).
struct BeladyPlan {
    std::vector<int64_t> ins_pos;      // per insert: position of the missed row in its batch
    std::vector<int64_t> ins_slot;     // per insert: the CPU slot it goes to
    std::vector<int64_t> ins_off;      // [n_plan + 1]: the inserts of batch b are [ins_off[b], ins_off[b+1])
    std::vector<int64_t> final_cache;  // [capacity]: node per slot after the last planned batch, -1 empty
    int64_t hits = 0, misses = 0, gpu_hits = 0;
};

// The accesses of the first `n_plan` batches: the length of a plan's src/idx. Checks `offsets`
// against the trace's `total` accesses and `n_plan` against the number of batches.
int64_t belady_planned_accesses(View<int64_t> offsets, int64_t total, int64_t n_plan);

// The plan of the first `n_plan` batches with a CPU cache of `capacity` slots starting as
// `init_cache` (node per slot, -1 empty), never caching the sorted unique `gpu_ids`. `frequency`
// (per-node access counts [N], or nullptr) breaks ties between rows with no use in the window.
// `src`, `idx`: belady_planned_accesses(offsets, nodes.size, n_plan) entries each.
void belady_plan(View<int64_t> nodes, View<int64_t> offsets, int64_t n_plan, int64_t capacity,
                 View<int64_t> init_cache, View<int64_t> gpu_ids, const Frequency* frequency, uint8_t* src,
                 int64_t* idx, BeladyPlan& out);

// The window trace of the node-indexed planner (belady_simulate), independent of the cache, so it
// can be built ahead: next use per planned access (`next_use`, planned accesses) and first use per
// node (`first_use`, num_nodes entries), both of `batch_index_width(offsets.size - 1)` bytes (see
// BatchIndices), and GPU slot per planned access (`gpu_slot`, planned accesses; not written when
// gpu_ids is empty).
void belady_trace(View<int64_t> nodes, View<int64_t> offsets, int64_t n_plan, View<int64_t> gpu_ids,
                  int64_t num_nodes, void* next_use, void* first_use, int32_t* gpu_slot);

// belady_plan's result for the planned batches (`nodes`/`offsets`: those batches only) of a window
// of `n_window` batches traced by belady_trace; `frequency` is required. `src`, `idx`: nodes.size
// entries each.
void belady_simulate(View<int64_t> nodes, View<int64_t> offsets, int64_t n_window, int64_t capacity,
                     View<int64_t> init_cache, View<int64_t> gpu_ids, Frequency frequency, BatchIndices next_use,
                     BatchIndices first_use, View<int32_t> gpu_slot, uint8_t* src, int64_t* idx, BeladyPlan& out);

// Frees the scratch a simulation left for the next one in this process (one idle workspace: per-node
// slot and held arrays, the cache and the residents' buckets; 255 MB on the prepare benchmark's 8.4M
// nodes), and returns its bytes. A simulation under way keeps its own; the next one allocates anew.
int64_t belady_release_workspace();

// The (at most) `capacity` non-GPU nodes of the trace with the soonest first use (then the higher
// frequency, then the lower id), best first.
std::vector<int64_t> belady_initial_fill(View<int64_t> nodes, View<int64_t> offsets, int64_t capacity,
                                         View<int64_t> gpu_ids, const Frequency* frequency);

}  // namespace diskflow
