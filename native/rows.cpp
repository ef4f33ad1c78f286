// Row copies between feature matrices (see rows.h). No Python here.
#include "rows.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace diskflow {

void copy_rows(RowMatrix o, const int64_t* op, RowMatrix s, const int64_t* sp, int64_t n) {
    if (o.row_bytes != s.row_bytes) throw std::invalid_argument("src: row size differs from out's");
    for (int64_t i = 0; i < n; ++i)  // check everything first: a bad index changes nothing
        if (op[i] < 0 || op[i] >= o.rows || sp[i] < 0 || sp[i] >= s.rows)
            throw std::out_of_range("row " + std::to_string(i) + ": out_pos " + std::to_string(op[i]) + " (of " +
                                    std::to_string(o.rows) + ") / src_rows " + std::to_string(sp[i]) + " (of " +
                                    std::to_string(s.rows) + ") out of range");
    const size_t rb = static_cast<size_t>(o.row_bytes);
    constexpr int64_t kAhead = 8;  // rows between a source row's prefetch and its copy
    for (int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) __builtin_prefetch(s.data + sp[i + kAhead] * o.row_bytes);
        std::memcpy(o.data + op[i] * o.row_bytes, s.data + sp[i] * o.row_bytes, rb);
    }
}

void gather_rows(RowMatrix o, RowMatrix s, const int64_t* sp, int64_t n) {
    if (o.row_bytes != s.row_bytes) throw std::invalid_argument("src: row size differs from out's");
    if (n > o.rows)
        throw std::out_of_range("out: " + std::to_string(o.rows) + " rows, " + std::to_string(n) + " to gather");
    for (int64_t i = 0; i < n; ++i)
        if (sp[i] < 0 || sp[i] >= s.rows)
            throw std::out_of_range("row " + std::to_string(i) + ": src_rows " + std::to_string(sp[i]) + " (of " +
                                    std::to_string(s.rows) + ") out of range");
    const size_t rb = static_cast<size_t>(o.row_bytes);
    constexpr int64_t kAhead = 8;
    for (int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) __builtin_prefetch(s.data + sp[i + kAhead] * s.row_bytes);
        std::memcpy(o.data + i * o.row_bytes, s.data + sp[i] * s.row_bytes, rb);
    }
}

}  // namespace diskflow
