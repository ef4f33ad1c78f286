// The Python binding of the native engine (pybind11): the one file that knows about Python.
//
// The engine files (reader, sampler, belady, count, rows, uring) are plain C++ over raw pointers. This file
//   * checks every array argument (dtype, dimensions, C-contiguity, writability) and hands the
//     engine raw pointers into the caller's memory, without copying;
//   * releases the GIL around every engine call that may take long (all of them but the trivial
//     getters), so loader, sampler and planner threads run beside the Python interpreter;
//   * wraps engine outputs as numpy arrays that own the engine's buffers (zero-copy);
//   * maps the engine's exceptions to Python's: IoError -> OSError(errno, message, path) or
//     ShortReadError (an OSError subclass); std::invalid_argument -> ValueError;
//     std::out_of_range -> IndexError; std::bad_alloc -> MemoryError (the last three by pybind11);
//   * exports the named constants of constants.h (read in Python through diskflow.native.constants).
//
// Use the kernels through their Python wrappers (diskflow.native: kernels.py, reader.py), never
// `_native` directly: the wrappers document and type them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "belady.h"
#include "constants.h"
#include "count.h"
#include "crc32.h"
#include "reader.h"
#include "route.h"
#include "rows.h"
#include "sampler.h"
#include "uring.h"

namespace py = pybind11;

namespace diskflow {
namespace {

// ---------------------------------------------------------------------------------------------
// Array checks: zero-copy views of the caller's arrays, or ValueError naming the argument.

template <typename T>
const char* dtype_name();
template <>
const char* dtype_name<int64_t>() { return "int64"; }
template <>
const char* dtype_name<int32_t>() { return "int32"; }
template <>
const char* dtype_name<uint8_t>() { return "uint8"; }

// Whether `a` has dtype T. Equivalent, not identical: an array that crossed a pickle (a Dask
// worker) carries an equal dtype object of its own.
template <typename T>
bool has_dtype(const py::array& a) {
    return py::detail::npy_api::get().PyArray_EquivTypes_(a.dtype().ptr(), py::dtype::of<T>().ptr());
}

std::string dtype_str(const py::array& a) { return py::str(py::object(a.dtype())).cast<std::string>(); }

// `obj` as a numpy array; `expected` says of what, for the error.
py::array as_array(const py::object& obj, const char* name, const std::string& expected) {
    if (!py::isinstance<py::array>(obj)) {
        throw py::value_error(std::string(name) + ": expected a numpy array of " + expected + ", got " +
                              std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
    }
    return py::reinterpret_borrow<py::array>(obj);
}

// The array must have `ndim` dimensions and be C-contiguous.
void check_layout(const py::array& a, const char* name, py::ssize_t ndim) {
    if (a.ndim() != ndim) {
        throw py::value_error(std::string(name) + ": expected a " + std::to_string(ndim) + "-D array, got " +
                              std::to_string(a.ndim()) + " dimensions");
    }
    if (!(a.flags() & py::array::c_style)) {
        throw py::value_error(std::string(name) +
                              ": expected a C-contiguous array (pass np.ascontiguousarray(...))");
    }
}

// A 1-D C-contiguous array of exactly dtype T, viewed in place.
template <typename T>
View<T> input(const py::object& obj, const char* name) {
    py::array a = as_array(obj, name, dtype_name<T>());
    if (!has_dtype<T>(a)) {
        throw py::value_error(std::string(name) + ": expected dtype " + dtype_name<T>() + ", got " + dtype_str(a));
    }
    check_layout(a, name, 1);
    return View<T>{static_cast<const T*>(a.data()), static_cast<int64_t>(a.shape(0))};
}

// As `input`, for an argument that may be None (then `*present` is false and the view empty).
template <typename T>
View<T> optional_input(const py::object& obj, const char* name, bool* present) {
    *present = !obj.is_none();
    return *present ? input<T>(obj, name) : View<T>{};
}

// Per-node access counts: a 1-D C-contiguous int32 or int64 array, viewed in place (None where
// `present` is given and the argument is None).
Frequency frequency_input(const py::object& obj, const char* name, bool* present = nullptr) {
    if (present != nullptr) {
        *present = !obj.is_none();
        if (!*present) return Frequency{};
    }
    py::array a = as_array(obj, name, "int32 or int64 counts");
    check_layout(a, name, 1);
    if (has_dtype<int32_t>(a)) return Frequency{static_cast<const int32_t*>(a.data()), nullptr, static_cast<int64_t>(a.shape(0))};
    if (has_dtype<int64_t>(a)) return Frequency{nullptr, static_cast<const int64_t*>(a.data()), static_cast<int64_t>(a.shape(0))};
    throw py::value_error(std::string(name) + ": expected dtype int32 or int64, got " + dtype_str(a));
}

// A 2-D C-contiguous matrix as rows of bytes (any dtype); `writable` for destinations.
RowMatrix matrix(const py::object& obj, const char* name, bool writable) {
    py::array a = as_array(obj, name, "rows");
    check_layout(a, name, 2);
    if (writable && !a.writeable()) throw py::value_error(std::string(name) + ": the array is read-only");
    return {static_cast<char*>(const_cast<void*>(a.data())), static_cast<int64_t>(a.shape(0)),
            static_cast<int64_t>(a.shape(1)) * static_cast<int64_t>(a.itemsize())};
}

// The raw pointer and size of a writable, C-contiguous uint8 buffer (numpy array, memoryview...).
struct OutBuffer {
    py::buffer_info info;
    uint8_t* ptr;
    int64_t nbytes;
};

OutBuffer out_buffer(const py::buffer& out, const char* what) {
    py::buffer_info info = out.request(true);  // writable, or BufferError
    if (info.itemsize != 1 || (info.format != "B" && info.format != "b" && info.format != "c")) {
        throw py::value_error(std::string(what) + ": expected a uint8 buffer, got format '" + info.format + "'");
    }
    int64_t expect = 1;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
        if (info.shape[d] > 1 && info.strides[d] != expect) {
            throw py::value_error(std::string(what) + ": the buffer must be C-contiguous");
        }
        expect *= info.shape[d];
    }
    auto* ptr = static_cast<uint8_t*>(info.ptr);
    int64_t nbytes = info.size;
    return OutBuffer{std::move(info), ptr, nbytes};
}

// Integer request arrays of the reader: any integer array, converted to int64 when it is not.
using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// ---------------------------------------------------------------------------------------------
// Engine outputs as numpy arrays that own the engine's buffers (no copy).

template <typename T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
    auto* heap_vec = new std::vector<T>(std::move(v));
    py::capsule owner(heap_vec, [](void* p) { delete static_cast<std::vector<T>*>(p); });
    return py::array_t<T>({static_cast<py::ssize_t>(heap_vec->size())}, {sizeof(T)}, heap_vec->data(), owner);
}

template <typename T>
py::array_t<T> to_numpy(std::unique_ptr<T[]> data, std::vector<py::ssize_t> shape) {
    if (!data) return py::array_t<T>(std::move(shape));  // empty
    T* raw = data.release();
    py::capsule owner(raw, [](void* p) { delete[] static_cast<T*>(p); });
    return py::array_t<T>(std::move(shape), raw, owner);
}

// ---------------------------------------------------------------------------------------------
// Exceptions.

// Python type of short-read errors (an OSError subclass), created at module initialisation.
PyObject* g_short_read_error = nullptr;

void register_exceptions(py::module_& m) {
    g_short_read_error = PyErr_NewExceptionWithDoc(
        "diskflow.native._native.ShortReadError",
        "A read met the end of the file before the requested length (an OSError, errno EIO).", PyExc_OSError,
        nullptr);
    if (g_short_read_error == nullptr) throw py::error_already_set();
    m.attr("ShortReadError") = py::handle(g_short_read_error);

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const IoError& e) {
            PyObject* type = e.short_read() ? g_short_read_error : PyExc_OSError;
            py::tuple args = e.path().empty() ? py::tuple(py::make_tuple(e.err(), e.what()))
                                              : py::tuple(py::make_tuple(e.err(), e.what(), e.path()));
            PyErr_SetObject(type, args.ptr());
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Constants (constants.h), read in Python through diskflow.native.constants.

void register_constants(py::module_& m) {
    m.attr("ALIGN") = kAlign;
    m.attr("SECTOR") = kSector;
    m.attr("MAX_REQUEST_BYTES") = kMaxRequestBytes;
    m.attr("DEFAULT_QUEUE_DEPTH") = kDefaultQueueDepth;
    m.attr("DEFAULT_THREADS") = kDefaultThreads;
    m.attr("DEFAULT_MERGE_BYTES") = kDefaultMergeBytes;
    m.attr("DEFAULT_BOUNCE_BYTES") = kDefaultBounceBytes;
    m.attr("BELADY_NO_USE") = kBeladyNoUse;
}

// ---------------------------------------------------------------------------------------------
// Direct-I/O reader (reader.h).

using Release = py::call_guard<py::gil_scoped_release>;

void reader_read(Reader& r, const I64Array& handles, const I64Array& offsets, const I64Array& lengths,
                 const py::buffer& out, const I64Array& out_offsets) {
    const int64_t n = offsets.size();
    if (handles.size() != n || lengths.size() != n || out_offsets.size() != n) {
        throw py::value_error("read: handles, offsets, lengths and out_offsets must have the same length (" +
                              std::to_string(handles.size()) + ", " + std::to_string(n) + ", " +
                              std::to_string(lengths.size()) + ", " + std::to_string(out_offsets.size()) + ")");
    }
    OutBuffer buf = out_buffer(out, "read: out");
    py::gil_scoped_release release;
    r.read(handles.data(), offsets.data(), lengths.data(), out_offsets.data(), n, buf.ptr, buf.nbytes);
}

void reader_read_rows(Reader& r, int64_t handle, const I64Array& row_offsets, int64_t row_bytes,
                      const py::buffer& out) {
    OutBuffer buf = out_buffer(out, "read_rows: out");
    py::gil_scoped_release release;
    r.read_rows(handle, row_offsets.data(), row_offsets.size(), row_bytes, buf.ptr, buf.nbytes);
}

py::dict reader_counters(Reader& r) {
    ReaderCounters c = r.counters();
    py::dict d;
    d["bytes_requested"] = static_cast<double>(c.bytes_requested);
    d["bytes_read"] = static_cast<double>(c.bytes_read);
    d["requests"] = static_cast<double>(c.requests);
    d["seconds"] = c.seconds;
    return d;
}

// A kAlign-aligned, zero-filled uint8 array of `nbytes` (an anonymous mapping, unmapped with the array).
py::array aligned_empty(int64_t nbytes) {
    size_t mapped = 0;
    void* p = alloc_aligned(nbytes, &mapped);
    auto* owner = new std::pair<void*, size_t>(p, mapped);
    py::capsule free_when_done(owner, [](void* o) {
        auto* m = static_cast<std::pair<void*, size_t>*>(o);
        free_aligned(m->first, m->second);
        delete m;
    });
    return py::array(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(nbytes)}, {py::ssize_t{1}},
                     static_cast<uint8_t*>(p), free_when_done);
}

void register_reader(py::module_& m) {
    py::class_<Reader>(m, "DirectReader", "Direct-I/O reader (use diskflow.native.reader.DirectReader).")
        .def(py::init([](int queue_depth, int threads, const std::string& backend, bool direct, int64_t merge_bytes,
                         int64_t bounce_bytes) {
                 py::gil_scoped_release release;  // the io_uring probe and ring setup are system calls
                 auto r = std::make_unique<Reader>(queue_depth, threads, backend, direct);
                 r->set_merge_bytes(merge_bytes, bounce_bytes);
                 return r;
             }),
             py::arg("queue_depth") = kDefaultQueueDepth, py::arg("threads") = kDefaultThreads,
             py::arg("backend") = "auto", py::arg("direct") = true, py::arg("merge_bytes") = kDefaultMergeBytes,
             py::arg("bounce_bytes") = kDefaultBounceBytes)
        .def_property_readonly("backend", &Reader::backend)
        .def_property_readonly("fallback_reason", &Reader::fallback_reason)
        .def_property_readonly("queue_depth", &Reader::queue_depth)
        .def_property_readonly("threads", &Reader::threads)
        .def_property_readonly("merge_bytes",
                               [](Reader& r) {
                                   py::gil_scoped_release release;  // waits for the reader's lock
                                   return r.merge_bytes();
                               })
        .def_property_readonly("bounce_bytes",
                               [](Reader& r) {
                                   py::gil_scoped_release release;
                                   return r.bounce_bytes();
                               })
        .def(
            "open",
            [](Reader& r, const std::string& path) {
                OpenedFile f = r.open(path);
                return std::make_tuple(f.handle, f.direct, f.refused);
            },
            py::arg("path"), Release(), "(handle, direct, why O_DIRECT was refused or '')")
        .def("is_direct", &Reader::is_direct, py::arg("handle"), Release())
        .def("path_of", &Reader::path_of, py::arg("handle"), Release())
        .def("close_file", &Reader::close_file, py::arg("handle"), Release())
        .def("read", &reader_read, py::arg("handles"), py::arg("offsets"), py::arg("lengths"), py::arg("out"),
             py::arg("out_offsets"))
        .def("read_rows", &reader_read_rows, py::arg("handle"), py::arg("row_offsets"), py::arg("row_bytes"),
             py::arg("out"))
        .def("set_merge_bytes", &Reader::set_merge_bytes, py::arg("merge_bytes"), py::arg("bounce_bytes"), Release())
        .def("set_gap_bytes", &Reader::set_gap_bytes, py::arg("gap_bytes"), Release())
        .def_property_readonly("gap_bytes", [](Reader& r) { return r.gap_bytes(); })
        .def("set_unit_bytes", &Reader::set_unit_bytes, py::arg("unit_bytes"), Release())
        .def_property_readonly("unit_bytes",
                               [](Reader& r) {
                                   py::gil_scoped_release release;
                                   return r.unit_bytes();
                               })
        .def("unit_of", &Reader::unit_of, py::arg("handle"), Release())
        .def("counters", &reader_counters)
        .def("reset_counters", &Reader::reset_counters)
        .def("close", &Reader::close, Release());
    m.def("aligned_empty", &aligned_empty, py::arg("nbytes"), "A 4096-aligned uint8 array of nbytes bytes.");
    m.def(
        "uring_unavailable", [] { return uring_unavailable(); }, Release(),
        "'' when io_uring is usable in this process (probed once), else why not.");
}

// ---------------------------------------------------------------------------------------------
// Neighbor sampler (sampler.h).

// The engine and the caller's graph arrays it reads in place, kept alive as long as it lives.
struct PySampler {
    py::array indptr, indices;
    std::unique_ptr<NeighborSampler> engine;
};

std::unique_ptr<PySampler> make_sampler(py::array indptr, py::array indices, std::vector<int64_t> fanouts,
                                        int num_threads) {
    if (!has_dtype<int64_t>(indptr)) throw py::value_error("indptr: expected dtype int64, got " + dtype_str(indptr));
    check_layout(indptr, "indptr", 1);
    if (indptr.size() < 1) throw py::value_error("indptr: must have N+1 >= 1 entries, got 0");
    const bool indices64 = has_dtype<int64_t>(indices);
    if (!indices64 && !has_dtype<int32_t>(indices)) {
        throw py::value_error("indices: expected dtype int32 or int64, got " + dtype_str(indices));
    }
    check_layout(indices, "indices", 1);
    auto s = std::make_unique<PySampler>();
    const auto* indptr_ptr = static_cast<const int64_t*>(indptr.data());
    const int64_t num_nodes = static_cast<int64_t>(indptr.size()) - 1;
    const void* indices_ptr = indices.data();
    const int64_t num_edges = static_cast<int64_t>(indices.size());
    s->indptr = std::move(indptr);
    s->indices = std::move(indices);
    {
        py::gil_scoped_release release;  // the constructor checks indptr in one pass
        s->engine = std::make_unique<NeighborSampler>(indptr_ptr, num_nodes, indices_ptr, indices64, num_edges,
                                                      std::move(fanouts), num_threads);
    }
    return s;
}

py::tuple sampler_sample(PySampler& s, const py::array& seeds, uint64_t seed, const py::object& stop,
                         bool last_hop, bool narrow, int64_t thin) {
    if (!has_dtype<int64_t>(seeds)) throw py::value_error("seeds: expected dtype int64, got " + dtype_str(seeds));
    check_layout(seeds, "seeds", 1);
    py::array stop_ids;
    if (!stop.is_none()) {
        if (!py::isinstance<py::array>(stop)) throw py::value_error("stop: expected a numpy int64 array or None");
        stop_ids = py::reinterpret_borrow<py::array>(stop);
        if (!has_dtype<int64_t>(stop_ids)) throw py::value_error("stop: expected dtype int64, got " + dtype_str(stop_ids));
        check_layout(stop_ids, "stop", 1);
    }
    const int64_t* stop_ptr = stop.is_none() ? nullptr : static_cast<const int64_t*>(stop_ids.data());
    const int64_t n_stop = stop.is_none() ? 0 : static_cast<int64_t>(stop_ids.size());
    SampledSubgraph g;
    {
        py::gil_scoped_release release;
        g = s.engine->sample(static_cast<const int64_t*>(seeds.data()), static_cast<int64_t>(seeds.size()), seed,
                             stop_ptr, n_stop, last_hop, narrow, thin);
    }
    const std::vector<py::ssize_t> nodes{static_cast<py::ssize_t>(g.num_nodes)};
    const std::vector<py::ssize_t> edges{2, static_cast<py::ssize_t>(g.num_edges)};
    const std::vector<py::ssize_t> e_ids{static_cast<py::ssize_t>(g.num_edges)};
    // int32 when the engine narrowed it (a narrow sample of a graph of at most 2^31 edges), else int64
    const py::array e_id = g.e_id_narrow ? py::array(to_numpy(std::move(g.e_id32), e_ids))
                                         : py::array(to_numpy(std::move(g.e_id), e_ids));
    if (narrow)
        return py::make_tuple(to_numpy(std::move(g.n_id32), nodes), to_numpy(std::move(g.edge_index32), edges),
                              e_id, py::cast(g.num_sampled_nodes), py::cast(g.num_sampled_edges));
    return py::make_tuple(to_numpy(std::move(g.n_id), nodes), to_numpy(std::move(g.edge_index), edges), e_id,
                          py::cast(g.num_sampled_nodes), py::cast(g.num_sampled_edges));
}

py::tuple sample_ranges_py(const py::array& starts, const py::array& ends, const py::array& keys,
                           const py::array& indices, int64_t fanout, uint64_t seed, uint64_t salt, int num_threads) {
    for (const auto& [a, name] : {std::pair<const py::array*, const char*>{&starts, "starts"}, {&ends, "ends"},
                                  {&keys, "keys"}}) {
        if (!has_dtype<int64_t>(*a)) throw py::value_error(std::string(name) + ": expected dtype int64, got " + dtype_str(*a));
        check_layout(*a, name, 1);
    }
    if (ends.size() != starts.size() || keys.size() != starts.size())
        throw py::value_error("sample_ranges: starts, ends and keys differ in length");
    const bool wide = has_dtype<int64_t>(indices);
    if (!wide && !has_dtype<int32_t>(indices))
        throw py::value_error("indices: expected dtype int32 or int64, got " + dtype_str(indices));
    check_layout(indices, "indices", 1);
    const int64_t n = static_cast<int64_t>(starts.size());
    RangeDraws d;
    {
        py::gil_scoped_release release;
        d = sample_ranges(static_cast<const int64_t*>(starts.data()), static_cast<const int64_t*>(ends.data()),
                          static_cast<const int64_t*>(keys.data()), n, indices.data(), wide,
                          static_cast<int64_t>(indices.size()), fanout, seed, salt, std::max(1, num_threads));
    }
    return py::make_tuple(to_numpy(std::move(d.counts), {static_cast<py::ssize_t>(n)}),
                          to_numpy(std::move(d.nbrs), {static_cast<py::ssize_t>(d.total)}),
                          to_numpy(std::move(d.pos), {static_cast<py::ssize_t>(d.total)}));
}

void register_sampler(py::module_& m) {
    m.def("sample_ranges", &sample_ranges_py, py::arg("starts"), py::arg("ends"), py::arg("keys"), py::arg("indices"),
          py::arg("fanout"), py::arg("seed"), py::arg("salt"), py::arg("num_threads") = 1,
          "One hop of a typed sample over CSC ranges: (counts [n], neighbours, positions); GIL released.");
    py::class_<PySampler>(m, "NeighborSampler", R"doc(
Uniform multi-hop neighbor sampler over a CSC graph (PyG NeighborLoader semantics).

Args:
    indptr: int64 [N+1], C-contiguous; referenced, not copied.
    indices: int32 or int64 [E], C-contiguous; source node of every in-edge, grouped by destination.
    fanouts: per hop, neighbours to sample per frontier node (-1 = all).
    num_threads: worker threads per hop (the output does not depend on it).
)doc")
        .def(py::init(&make_sampler), py::arg("indptr"), py::arg("indices"), py::arg("fanouts"),
             py::arg("num_threads") = 1)
        .def("sample", &sampler_sample, py::arg("seeds"), py::arg("seed"), py::arg("stop") = py::none(),
             py::arg("last_hop") = false, py::arg("narrow") = false, py::arg("thin") = 0, R"doc(
Sample the subgraph around unique int64 `seeds`; deterministic in `seed`. `stop` (int64 node ids,
optional): nodes that are not expanded when they join a frontier after the seeds'. With `last_hop`,
they and the nodes only they (or such nodes) drew are expanded as usual except at the last hop,
where they draw min(`thin`, fanout) neighbours each (0: none).
With `narrow`, n_id and edge_index are int32 (ValueError for a graph of more than 2^31 nodes), and
e_id too when the graph has at most 2^31 edges (int64 otherwise).

Returns:
    (n_id int64 [n], edge_index int64 [2, e], e_id int64 [e] (each edge's position in `indices`,
    column for column with edge_index), num_sampled_nodes list, num_sampled_edges list)
)doc")
        .def_property_readonly("num_nodes", [](const PySampler& s) { return s.engine->num_nodes(); })
        .def_property_readonly("num_edges", [](const PySampler& s) { return s.engine->num_edges(); })
        .def_property_readonly("fanouts", [](const PySampler& s) { return s.engine->fanouts(); })
        .def_property_readonly("num_threads", [](const PySampler& s) { return s.engine->num_threads(); });
}

// ---------------------------------------------------------------------------------------------
// Belady planner (belady.h).

py::dict plan_dict(py::array_t<uint8_t>&& src, py::array_t<int64_t>&& idx, BeladyPlan& out) {
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

py::dict belady_plan_py(const py::object& nodes_obj, const py::object& offsets_obj, int64_t n_plan, int64_t capacity,
                        const py::object& init_obj, const py::object& gpu_obj, const py::object& freq_obj) {
    const auto nodes = input<int64_t>(nodes_obj, "nodes");
    const auto offsets = input<int64_t>(offsets_obj, "offsets");
    const auto init_cache = input<int64_t>(init_obj, "init_cache");
    const auto gpu_ids = input<int64_t>(gpu_obj, "gpu_ids");
    bool has_freq;
    const auto freq = frequency_input(freq_obj, "frequency", &has_freq);
    const int64_t plan_end = belady_planned_accesses(offsets, nodes.size, n_plan);
    py::array_t<uint8_t> src(plan_end);
    py::array_t<int64_t> idx(plan_end);
    uint8_t* src_p = src.mutable_data();
    int64_t* idx_p = idx.mutable_data();
    BeladyPlan out;
    {
        py::gil_scoped_release release;
        belady_plan(nodes, offsets, n_plan, capacity, init_cache, gpu_ids, has_freq ? &freq : nullptr, src_p, idx_p,
                    out);
    }
    return plan_dict(std::move(src), std::move(idx), out);
}

// A trace's next or first uses: a 1-D C-contiguous uint8, uint16 or int32 array (see BatchIndices), in place.
BatchIndices batch_indices_input(const py::object& obj, const char* name) {
    py::array a = as_array(obj, name, "uint8, uint16 or int32 batch indices");
    check_layout(a, name, 1);
    const int width = has_dtype<uint8_t>(a) ? 1 : has_dtype<uint16_t>(a) ? 2 : has_dtype<int32_t>(a) ? 4 : 0;
    if (width == 0) throw py::value_error(std::string(name) + ": expected dtype uint8, uint16 or int32, got " + dtype_str(a));
    return BatchIndices{a.data(), static_cast<int64_t>(a.shape(0)), width};
}

// A 1-D array of `n` entries of `width` bytes (1: uint8, 2: uint16, 4: int32).
py::array batch_indices_array(int width, int64_t n) {
    if (width == 1) return py::array_t<uint8_t>(n);
    if (width == 2) return py::array_t<uint16_t>(n);
    return py::array_t<int32_t>(n);
}

py::dict belady_trace_py(const py::object& nodes_obj, const py::object& offsets_obj, int64_t n_plan,
                         const py::object& gpu_obj, int64_t num_nodes) {
    const auto nodes = input<int64_t>(nodes_obj, "nodes");
    const auto offsets = input<int64_t>(offsets_obj, "offsets");
    const auto gpu_ids = input<int64_t>(gpu_obj, "gpu_ids");
    const int64_t plan_end = belady_planned_accesses(offsets, nodes.size, n_plan);
    const int width = batch_index_width(offsets.size - 1);
    py::array next_use = batch_indices_array(width, plan_end);
    py::array first_use = batch_indices_array(width, std::max<int64_t>(num_nodes, 0));  // negative: the engine says so
    py::array_t<int32_t> gpu_slot(gpu_ids.size ? plan_end : 0);
    void* nu = next_use.mutable_data();
    void* fu = first_use.mutable_data();
    int32_t* gs = gpu_slot.mutable_data();
    {
        py::gil_scoped_release release;
        belady_trace(nodes, offsets, n_plan, gpu_ids, num_nodes, nu, fu, gs);
    }
    py::dict d;
    d["next_use"] = next_use;
    d["first_use"] = first_use;
    d["gpu_slot"] = gpu_slot;
    return d;
}

py::dict belady_simulate_py(const py::object& nodes_obj, const py::object& offsets_obj, int64_t n_window,
                            int64_t capacity, const py::object& init_obj, const py::object& gpu_obj,
                            const py::object& freq_obj, const py::object& next_obj, const py::object& first_obj,
                            const py::object& gslot_obj) {
    const auto nodes = input<int64_t>(nodes_obj, "nodes");
    const auto offsets = input<int64_t>(offsets_obj, "offsets");
    const auto init_cache = input<int64_t>(init_obj, "init_cache");
    const auto gpu_ids = input<int64_t>(gpu_obj, "gpu_ids");
    const auto freq = frequency_input(freq_obj, "frequency");
    const BatchIndices next_use = batch_indices_input(next_obj, "next_use");
    const BatchIndices first_use = batch_indices_input(first_obj, "first_use");
    const auto gpu_slot = input<int32_t>(gslot_obj, "gpu_slot");
    py::array_t<uint8_t> src(nodes.size);
    py::array_t<int64_t> idx(nodes.size);
    uint8_t* src_p = src.mutable_data();
    int64_t* idx_p = idx.mutable_data();
    BeladyPlan out;
    {
        py::gil_scoped_release release;
        belady_simulate(nodes, offsets, n_window, capacity, init_cache, gpu_ids, freq, next_use, first_use, gpu_slot,
                        src_p, idx_p, out);
    }
    return plan_dict(std::move(src), std::move(idx), out);
}

py::array_t<int64_t> belady_initial_fill_py(const py::object& nodes_obj, const py::object& offsets_obj,
                                            int64_t capacity, const py::object& gpu_obj, const py::object& freq_obj) {
    const auto nodes = input<int64_t>(nodes_obj, "nodes");
    const auto offsets = input<int64_t>(offsets_obj, "offsets");
    const auto gpu_ids = input<int64_t>(gpu_obj, "gpu_ids");
    bool has_freq;
    const auto freq = frequency_input(freq_obj, "frequency", &has_freq);
    std::vector<int64_t> chosen;
    {
        py::gil_scoped_release release;
        chosen = belady_initial_fill(nodes, offsets, capacity, gpu_ids, has_freq ? &freq : nullptr);
    }
    return to_numpy(std::move(chosen));
}

void register_belady(py::module_& m) {
    m.def("belady_plan", &belady_plan_py, py::arg("nodes"), py::arg("offsets"), py::arg("n_plan"),
          py::arg("capacity"), py::arg("init_cache"), py::arg("gpu_ids"), py::arg("frequency"),
          "Belady CPU-cache plan of the first n_plan batches of a concatenated trace (the rest is lookahead).\n"
          "nodes/offsets/init_cache/gpu_ids: int64 1-D C-contiguous; frequency: int32 or int64 (may be None).\n"
          "Returns a dict: src (uint8), idx, insert_pos, insert_slot, insert_offsets, final_cache (int64),\n"
          "hits, misses, gpu_hits. Raises ValueError on bad input.");
    m.def("belady_trace", &belady_trace_py, py::arg("nodes"), py::arg("offsets"), py::arg("n_plan"),
          py::arg("gpu_ids"), py::arg("num_nodes"),
          "The window trace of the dense planner: next_use (int32 per access of the first n_plan batches),\n"
          "first_use (int32 [num_nodes], BELADY_NO_USE = unused) and gpu_slot (int32 per planned access,\n"
          "empty without a GPU tier). Raises ValueError on bad input.");
    m.def("belady_simulate", &belady_simulate_py, py::arg("nodes"), py::arg("offsets"), py::arg("n_window"),
          py::arg("capacity"), py::arg("init_cache"), py::arg("gpu_ids"), py::arg("frequency"), py::arg("next_use"),
          py::arg("first_use"), py::arg("gpu_slot"),
          "belady_plan's result for the planned batches (nodes/offsets) of a window traced by belady_trace;\n"
          "n_window: batches of the whole window. Raises ValueError on bad input.");
    m.def("belady_release_workspace", &belady_release_workspace, Release(),
          "Frees the scratch the last Belady simulation left for the next one in this process; its bytes.");
    m.def("belady_initial_fill", &belady_initial_fill_py, py::arg("nodes"), py::arg("offsets"), py::arg("capacity"),
          py::arg("gpu_ids"), py::arg("frequency"),
          "The <= capacity non-GPU nodes of the trace with the soonest first use (then higher frequency,\n"
          "then lower id), best first. Raises ValueError on bad input.");
}

// ---------------------------------------------------------------------------------------------
// Row copies (rows.h).

void check_same_dtype(const py::object& out, const py::object& src) {
    const py::array out_a = py::reinterpret_borrow<py::array>(out), src_a = py::reinterpret_borrow<py::array>(src);
    if (!out_a.dtype().is(src_a.dtype()) &&
        !py::detail::npy_api::get().PyArray_EquivTypes_(out_a.dtype().ptr(), src_a.dtype().ptr())) {
        throw py::value_error("src: dtype " + dtype_str(src_a) + " differs from out's " + dtype_str(out_a));
    }
}

void copy_rows_py(const py::object& out, const py::object& out_pos, const py::object& src,
                  const py::object& src_rows) {
    const RowMatrix o = matrix(out, "out", true);
    const RowMatrix s = matrix(src, "src", false);
    check_same_dtype(out, src);
    const auto op = input<int64_t>(out_pos, "out_pos");
    const auto sp = input<int64_t>(src_rows, "src_rows");
    if (op.size != sp.size) {
        throw py::value_error("out_pos and src_rows differ in length (" + std::to_string(op.size) + " and " +
                              std::to_string(sp.size) + ")");
    }
    py::gil_scoped_release release;
    copy_rows(o, op.data, s, sp.data, op.size);
}

void gather_rows_py(const py::object& out, const py::object& src, const py::object& src_rows) {
    const RowMatrix o = matrix(out, "out", true);
    const RowMatrix s = matrix(src, "src", false);
    check_same_dtype(out, src);
    const auto sp = input<int64_t>(src_rows, "src_rows");
    py::gil_scoped_release release;
    gather_rows(o, s, sp.data, sp.size);
}

uint32_t gather_rows_crc_py(const py::object& out, const py::object& src, const py::object& src_rows, uint32_t crc) {
    const RowMatrix o = matrix(out, "out", true);
    const RowMatrix s = matrix(src, "src", false);
    check_same_dtype(out, src);
    const auto sp = input<int64_t>(src_rows, "src_rows");
    py::gil_scoped_release release;
    return gather_rows_crc(o, s, sp.data, sp.size, crc);
}

uint32_t crc32_py(const py::buffer& data, uint32_t value) {
    const py::buffer_info info = data.request();
    if (!PyBuffer_IsContiguous(info.view(), 'C')) throw py::value_error("data: expected a contiguous buffer");
    const auto* p = static_cast<const uint8_t*>(info.ptr);
    const size_t n = static_cast<size_t>(info.size * info.itemsize);
    py::gil_scoped_release release;
    return crc32_update(value, p, n);
}

py::array_t<uint32_t> crc32_blocks_py(const py::buffer& data, int64_t block) {
    const py::buffer_info info = data.request();
    if (!PyBuffer_IsContiguous(info.view(), 'C')) throw py::value_error("data: expected a contiguous buffer");
    if (block <= 0) throw py::value_error("block: must be > 0");
    const auto* p = static_cast<const uint8_t*>(info.ptr);
    const size_t n = static_cast<size_t>(info.size * info.itemsize);
    const size_t b = static_cast<size_t>(block);
    py::array_t<uint32_t> out(static_cast<py::ssize_t>((n + b - 1) / b));
    uint32_t* o = out.mutable_data();
    {
        py::gil_scoped_release release;
        crc32_blocks(p, n, b, o);
    }
    return out;
}

void register_rows(py::module_& m) {
    m.def("gather_rows_crc", &gather_rows_crc_py, py::arg("out"), py::arg("src"), py::arg("src_rows"), py::arg("crc"),
          "gather_rows, returning the running crc32 (zlib's, after `crc`) of the rows written: each row is\n"
          "checksummed from the source while in cache and streamed past the cache where 16-byte aligned.");
    m.def("crc32", &crc32_py, py::arg("data"), py::arg("value") = 0,
          "zlib's crc32(data, value) of a contiguous buffer, natively (PCLMULQDQ folding where the CPU has it).");
    m.def("crc32_combine", &crc32_combine, py::arg("crc1"), py::arg("crc2"), py::arg("len2"),
          "zlib's crc32_combine: the crc32 of A then B from crc32(A), crc32(B) and len(B).");
    m.def("crc32_zeros", &crc32_zeros, py::arg("value"), py::arg("n"),
          "The running crc32 after `value` of n zero bytes.");
    m.def("crc32_blocks", &crc32_blocks_py, py::arg("data"), py::arg("block"),
          "uint32 crc32 of every `block` bytes of a contiguous buffer (the last block may be short).");
    m.def("crc32_folds", &crc32_folds, "Whether crc32 folds with PCLMULQDQ on this CPU (else a table).");
    m.def("gather_rows", &gather_rows_py, py::arg("out"), py::arg("src"), py::arg("src_rows"),
          "out[i] = src[src_rows[i]] for i < len(src_rows): 2-D C-contiguous matrices of one dtype and width,\n"
          "int64 rows; one memcpy per row, GIL released. Raises ValueError on mismatched arrays and\n"
          "IndexError (before copying anything) on a row out of range or too small an `out`.");
    m.def("copy_rows", &copy_rows_py, py::arg("out"), py::arg("out_pos"), py::arg("src"), py::arg("src_rows"),
          "out[out_pos[i]] = src[src_rows[i]] for every i: 2-D C-contiguous matrices of one dtype and width,\n"
          "int64 positions; one memcpy per row, GIL released. Raises ValueError on mismatched arrays and\n"
          "IndexError (before copying anything) on a position out of range.");
}

// ---------------------------------------------------------------------------------------------
// Access counting (count.h).

py::tuple count_ids_py(const py::object& nodes_obj, int64_t num_nodes) {
    const auto nodes = input<int64_t>(nodes_obj, "nodes");
    std::vector<int64_t> ids, counts;
    {
        py::gil_scoped_release release;
        count_ids(nodes.data, nodes.size, num_nodes, ids, counts);
    }
    return py::make_tuple(to_numpy(std::move(ids)), to_numpy(std::move(counts)));
}

// out[v] += occurrences of v in each array of `arrays` (int32 or int64 each): every array is checked
// (dtype, layout, ids, no overlap with `out`) before any is counted; counting releases the GIL.
struct DenseIds { const void* data; int64_t size; bool wide; };

template <typename Out>
void count_into(const DenseIds& v, int64_t n, Out* out) {
    if (v.wide) count_dense(static_cast<const int64_t*>(v.data), v.size, n, out);
    else count_dense(static_cast<const int32_t*>(v.data), v.size, n, out);
}

void count_dense_py(const py::list& arrays, const py::object& out_obj) {
    py::array out = as_array(out_obj, "out", "uint8, uint16 or int32");
    const int out_bytes = has_dtype<uint8_t>(out) ? 1 : has_dtype<uint16_t>(out) ? 2 : has_dtype<int32_t>(out) ? 4 : 0;
    if (!out_bytes) throw py::value_error("out: expected dtype uint8, uint16 or int32, got " + dtype_str(out));
    check_layout(out, "out", 1);
    if (!out.writeable()) throw py::value_error("out: expected a writable array");
    const int64_t n = static_cast<int64_t>(out.shape(0));
    const auto* o_lo = static_cast<const char*>(out.data());
    const char* o_hi = o_lo + n * static_cast<int64_t>(out_bytes);
    using Ids = DenseIds;
    std::vector<Ids> ids;
    for (size_t i = 0; i < arrays.size(); ++i) {
        const std::string name = "arrays[" + std::to_string(i) + "]";
        py::array a = as_array(arrays[i], name.c_str(), "int32 or int64");
        const bool wide = has_dtype<int64_t>(a);
        if (!wide && !has_dtype<int32_t>(a))
            throw py::value_error(name + ": expected dtype int32 or int64, got " + dtype_str(a));
        check_layout(a, name.c_str(), 1);
        const auto* lo = static_cast<const char*>(a.data());
        const char* hi = lo + a.nbytes();
        if (a.size() && n && lo < o_hi && o_lo < hi) throw py::value_error(name + ": shares memory with out");
        const int64_t size = static_cast<int64_t>(a.size());
        if (wide) check_ids(static_cast<const int64_t*>(a.data()), size, n, name.c_str());
        else check_ids(static_cast<const int32_t*>(a.data()), size, n, name.c_str());
        ids.push_back({a.data(), size, wide});
    }
    void* o = out.mutable_data();
    py::gil_scoped_release release;
    for (const Ids& v : ids) {
        if (out_bytes == 1) count_into(v, n, static_cast<uint8_t*>(o));
        else if (out_bytes == 2) count_into(v, n, static_cast<uint16_t*>(o));
        else count_into(v, n, static_cast<int32_t*>(o));
    }
}

py::tuple merge_counts_py(const py::object& ia, const py::object& ca, const py::object& ib, const py::object& cb) {
    const auto ids_a = input<int64_t>(ia, "ids_a"), counts_a = input<int64_t>(ca, "counts_a");
    const auto ids_b = input<int64_t>(ib, "ids_b"), counts_b = input<int64_t>(cb, "counts_b");
    if (ids_a.size != counts_a.size || ids_b.size != counts_b.size)
        throw py::value_error("merge_counts: ids and counts differ in length");
    std::vector<int64_t> ids, counts;
    {
        py::gil_scoped_release release;
        merge_count_pairs(ids_a.data, counts_a.data, ids_a.size, ids_b.data, counts_b.data, ids_b.size, ids, counts);
    }
    return py::make_tuple(to_numpy(std::move(ids)), to_numpy(std::move(counts)));
}

void register_count(py::module_& m) {
    m.def("count_ids", &count_ids_py, py::arg("nodes"), py::arg("num_nodes"),
          "(ids ascending, counts) of the int64 node ids in `nodes`, all in [0, num_nodes); GIL released.\n"
          "Raises ValueError on an id out of range.");
    m.def("count_dense", &count_dense_py, py::arg("arrays"), py::arg("out"),
          "out[v] += occurrences of v in each 1-D int32 or int64 array of `arrays` (a list), every id in\n"
          "[0, len(out)); `out` uint8, uint16 or int32, C-contiguous, sharing no memory with the arrays. Every\n"
          "array is checked before any is counted (ValueError naming arrays[i]; out untouched); GIL released\n"
          "while counting. Raises OverflowError where a count would pass out's largest value (out is then\n"
          "partly counted: discard it).");
    m.def("merge_counts", &merge_counts_py, py::arg("ids_a"), py::arg("counts_a"), py::arg("ids_b"),
          py::arg("counts_b"),
          "The sum of two sparse counts (int64 ids strictly ascending, int64 counts): ids ascending.\n"
          "GIL released. Raises ValueError on unsorted or negative ids.");
}

// ---------------------------------------------------------------------------------------------
// Routing (route.h).

py::tuple route_batch_py(const py::object& n_id_obj, const py::object& src_obj, const py::object& idx_obj,
                         const py::object& in_cache_obj, const py::object& row_obj, int64_t shard_rows,
                         int64_t num_shards) {
    py::array n_id = as_array(n_id_obj, "n_id", "int32 or int64");
    const bool wide = has_dtype<int64_t>(n_id);
    if (!wide && !has_dtype<int32_t>(n_id))
        throw py::value_error("n_id: expected dtype int32 or int64, got " + dtype_str(n_id));
    check_layout(n_id, "n_id", 1);
    const auto src = input<uint8_t>(src_obj, "src");
    const auto idx = input<int64_t>(idx_obj, "idx");
    const int64_t n = static_cast<int64_t>(n_id.shape(0));
    if (src.size != n || idx.size != n) throw py::value_error("src, idx: one entry per n_id entry expected");
    bool has_cache = false, has_row = false;
    const auto in_cache = optional_input<uint8_t>(in_cache_obj, "in_cache", &has_cache);
    const auto row = optional_input<int64_t>(row_obj, "row", &has_row);
    if (has_cache != has_row) throw py::value_error("in_cache, row: give both or neither");
    if (in_cache.size != row.size) throw py::value_error("in_cache, row: one entry per miss each");
    RoutedBatch out;
    {
        py::gil_scoped_release release;
        const uint8_t* ic = has_cache ? in_cache.data : nullptr;
        if (wide)
            route_batch(static_cast<const int64_t*>(n_id.data()), src.data, idx.data, n, ic, row.data, row.size,
                        shard_rows, num_shards, out);
        else
            route_batch(static_cast<const int32_t*>(n_id.data()), src.data, idx.data, n, ic, row.data, row.size,
                        shard_rows, num_shards, out);
    }
    return py::make_tuple(to_numpy(std::move(out.src)), to_numpy(std::move(out.idx)), to_numpy(std::move(out.counts)),
                          to_numpy(std::move(out.ids)));
}

void register_route(py::module_& m) {
    m.def("route_batch", &route_batch_py, py::arg("n_id"), py::arg("src"), py::arg("idx"), py::arg("in_cache"),
          py::arg("row"), py::arg("shard_rows"), py::arg("num_shards"),
          "One batch's plan (uint8 src, int64 idx; misses numbered 0..m-1) in the packed index's form:\n"
          "(src, idx, counts per shard, packed ids in packed order). `in_cache` (uint8) and `row` (int64), one\n"
          "per miss, place misses in the disk cache or rank them among the packed rows; None: all packed.\n"
          "GIL released. Raises ValueError naming the fault.");
}

}  // namespace
}  // namespace diskflow

PYBIND11_MODULE(_native, m) {
    m.doc() = "diskflow native kernels (C++17): neighbor sampling, direct I/O, row copies, access counts, Belady";
    diskflow::register_exceptions(m);
    diskflow::register_constants(m);
    diskflow::register_sampler(m);
    diskflow::register_belady(m);
    diskflow::register_reader(m);
    diskflow::register_rows(m);
    diskflow::register_count(m);
    diskflow::register_route(m);
}
