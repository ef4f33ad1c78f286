// Neighbor sampler over a CSC graph (PyG NeighborLoader semantics, homogeneous, disjoint=False).
// See sampler.cpp for the algorithm; this header only exposes the pybind11 registration.
#pragma once

#include <pybind11/pybind11.h>

namespace diskflow {

// Adds the class `NeighborSampler` to the extension module.
void register_sampler(pybind11::module_& m);

}  // namespace diskflow
