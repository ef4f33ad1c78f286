// Row copies between feature matrices: out[out_pos[i]] = src[src_rows[i]], one memcpy per row.
//
// Assembling a batch moves every row of it once: from the GPU/CPU tier or the staged disk rows
// into the batch's matrix, and planned inserts from the batch into the CPU tier. numpy's
// `out[pos] = src[idx]` does it in two passes (a gathered temporary, then a scatter), doubling the
// memory traffic and faulting in a fresh temporary for every batch; this is one pass, GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace diskflow {
namespace {

struct Matrix {
    char* data;
    int64_t rows;
    int64_t row_bytes;
};

Matrix matrix(const py::array& a, const char* name, bool writable) {
    if (a.ndim() != 2) throw py::value_error(std::string(name) + ": expected a 2-D array");
    if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(name) + ": expected a C-contiguous array");
    if (writable && !a.writeable()) throw py::value_error(std::string(name) + ": array is read-only");
    return {static_cast<char*>(const_cast<void*>(a.data())), static_cast<int64_t>(a.shape(0)),
            static_cast<int64_t>(a.shape(1)) * static_cast<int64_t>(a.itemsize())};
}

const int64_t* positions(const py::array& a, const char* name, int64_t& n) {
    if (a.ndim() != 1 || !(a.flags() & py::array::c_style) ||
        !py::detail::npy_api::get().PyArray_EquivTypes_(a.dtype().ptr(), py::dtype::of<int64_t>().ptr()))
        throw py::value_error(std::string(name) + ": expected a 1-D C-contiguous int64 array");
    n = static_cast<int64_t>(a.shape(0));
    return static_cast<const int64_t*>(a.data());
}

void copy_rows(py::array out, py::array out_pos, py::array src, py::array src_rows) {
    const Matrix o = matrix(out, "out", true);
    const Matrix s = matrix(src, "src", false);
    if (!out.dtype().is(src.dtype()) &&
        !py::detail::npy_api::get().PyArray_EquivTypes_(out.dtype().ptr(), src.dtype().ptr()))
        throw py::value_error("src: dtype differs from out's");
    if (o.row_bytes != s.row_bytes) throw py::value_error("src: row size differs from out's");
    int64_t n, m;
    const int64_t* op = positions(out_pos, "out_pos", n);
    const int64_t* sp = positions(src_rows, "src_rows", m);
    if (n != m) throw py::value_error("out_pos and src_rows differ in length");
    {
        py::gil_scoped_release release;
        for (int64_t i = 0; i < n; ++i)   // check everything first: a bad index changes nothing
            if (op[i] < 0 || op[i] >= o.rows || sp[i] < 0 || sp[i] >= s.rows)
                throw std::out_of_range("row " + std::to_string(i) + ": out_pos " + std::to_string(op[i]) +
                                        " (of " + std::to_string(o.rows) + ") / src_rows " + std::to_string(sp[i]) +
                                        " (of " + std::to_string(s.rows) + ") out of range");
        const size_t rb = static_cast<size_t>(o.row_bytes);
        constexpr int64_t kAhead = 8;
        for (int64_t i = 0; i < n; ++i) {
            if (i + kAhead < n) __builtin_prefetch(s.data + sp[i + kAhead] * o.row_bytes);
            std::memcpy(o.data + op[i] * o.row_bytes, s.data + sp[i] * o.row_bytes, rb);
        }
    }
}

}  // namespace

void register_rows(py::module_& m) {
    m.def("copy_rows", &copy_rows, py::arg("out"), py::arg("out_pos"), py::arg("src"), py::arg("src_rows"),
          "out[out_pos[i]] = src[src_rows[i]] for every i: 2-D C-contiguous matrices of one dtype and width,\n"
          "int64 positions; one memcpy per row, GIL released. Raises ValueError on mismatched arrays and\n"
          "IndexError (before copying anything) on a position out of range.");
}

}  // namespace diskflow
