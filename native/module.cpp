// Python binding of the native kernels (pybind11). Each kernel lives in its own file;
// this file only registers them.
#include <pybind11/pybind11.h>

#include "sampler.h"

namespace py = pybind11;

namespace diskflow {
void register_belady(pybind11::module_& m);  // belady.cpp: Belady CPU-cache planner
void register_reader(pybind11::module_& m);  // reader.cpp: direct-I/O reader (O_DIRECT, io_uring / pread)
void register_rows(pybind11::module_& m);    // rows.cpp: row copies between feature matrices
}  // namespace diskflow

PYBIND11_MODULE(_native, m) {
    m.doc() = "diskflow native kernels (C++17): neighbor sampling, direct I/O, gathers, Belady";
    diskflow::register_sampler(m);
    diskflow::register_belady(m);
    diskflow::register_reader(m);
    diskflow::register_rows(m);
}
