// Direct-I/O reader engine: many read requests in flight, from files opened with O_DIRECT, into
// caller-provided memory. Plain C++ over raw pointers (no Python here; bindings.cpp binds it and
// releases the GIL around every call).
//
// Backends (picked per reader):
//   uring  io_uring through its system calls (uring.h; always compiled, no liburing), used when the
//          once-per-process probe and the reader's own io_uring_setup succeed at run time: one ring
//          per reader, `queue_depth` requests in flight, submitted and reaped by the calling thread.
//   pread  a pool of `threads` persistent threads, each issuing blocking pread(2) calls; `threads`
//          requests in flight. The fallback where io_uring is unavailable (probed, never assumed).
//
// Discipline (as DGL GraphBolt's direct-I/O reader): in O_DIRECT mode every offset, length and
// buffer address is a multiple of kAlign, checked before anything is submitted (read_rows' own
// requests: of its unit, never less than the file's direct-I/O alignment); requests are split
// at kMaxRequestBytes; a short read is resubmitted for the remainder, and a read that meets the end
// of file first is a short-read error; after the first error no new request is submitted, but those
// in flight are drained before the error is thrown. Where the file system refuses O_DIRECT (EINVAL
// on open, e.g. tmpfs) the file is opened buffered and `open` says why.
//
// `read_rows` reads fixed-size rows at arbitrary byte offsets (rows may straddle pages, repeat, or be
// unaligned): it reads each distinct unit the rows touch exactly once (a 4 KiB page, or down to a
// 512-byte sector: set_unit_bytes), adjacent units merged into one request of at most `merge_bytes`,
// into an aligned bounce buffer, then copies the rows out.
//
// Errors: IoError (an I/O failure: errno, path, offsets; `short_read` when the file ended first) and
// std::invalid_argument (a request the reader refuses: misaligned, out of bounds, bad handle, closed
// reader, bad settings). A reader serialises its calls with a mutex.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "constants.h"

namespace diskflow {

// An I/O failure: the errno, the path of the file ("" when none) and a message naming the offsets.
// `short_read`: the file ended before the requested bytes (errno EIO).
class IoError : public std::runtime_error {
 public:
    IoError(int err, std::string path, const std::string& message, bool short_read = false)
        : std::runtime_error(message), err_(err), path_(std::move(path)), short_read_(short_read) {}
    int err() const { return err_; }
    const std::string& path() const { return path_; }
    bool short_read() const { return short_read_; }

 private:
    int err_;
    std::string path_;
    bool short_read_;
};

// What `Reader::open` did: the file's handle, whether it is read with O_DIRECT, and why O_DIRECT
// was refused ("" when it was not).
struct OpenedFile {
    int handle;
    bool direct;
    std::string refused;
};

// The reader's counters since its creation or its last reset_counters().
struct ReaderCounters {
    int64_t bytes_requested = 0;  // bytes the callers asked for
    int64_t bytes_read = 0;       // bytes read from disk (whole units for read_rows)
    int64_t requests = 0;         // requests issued to the kernel, after splitting and merging
    double seconds = 0.0;         // time spent in read calls
};

class PreadPool;  // reader.cpp
class Uring;      // reader.cpp
struct IoRequest;
class ErrorSlot;

class Reader {
 public:
    // backend: "auto" (io_uring when usable, else pread: see fallback_reason()), "uring" (io_uring
    // or IoError), "pread". Throws std::invalid_argument on a bad setting.
    Reader(int queue_depth, int threads, const std::string& backend, bool direct);
    ~Reader();
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;

    const std::string& backend() const { return backend_; }
    // Why "auto" fell back to pread ("" when it did not).
    const std::string& fallback_reason() const { return fallback_reason_; }
    int queue_depth() const { return queue_depth_; }
    int threads() const { return threads_; }

    // Opens `path` for reading (O_DIRECT unless the reader is buffered or the file system refuses
    // it). Throws IoError naming the path (missing file, a directory...).
    OpenedFile open(const std::string& path);
    bool is_direct(int64_t handle);
    std::string path_of(int64_t handle);
    void close_file(int64_t handle);
    // Closes every file and frees the buffers; later calls throw std::invalid_argument.
    void close();

    // Request i: bytes [offsets[i], offsets[i] + lengths[i]) of file handles[i] into
    // out[out_offsets[i] ...]; `out` holds `out_bytes` bytes. All four arrays hold `n` entries.
    void read(const int64_t* handles, const int64_t* offsets, const int64_t* lengths, const int64_t* out_offsets,
              int64_t n, uint8_t* out, int64_t out_bytes);

    // Rows of `row_bytes` bytes at the `n` byte offsets `row_offsets` of file `handle` into out
    // [n, row_bytes] (`out_bytes` must be n x row_bytes). No alignment is required.
    void read_rows(int64_t handle, const int64_t* row_offsets, int64_t n, int64_t row_bytes, uint8_t* out,
                   int64_t out_bytes);

    ReaderCounters counters();
    void reset_counters();

    // read_rows' request size limit and bounce buffer (defaults: kDefaultMergeBytes,
    // kDefaultBounceBytes). merge_bytes: a multiple of kAlign in [kAlign, kMaxRequestBytes].
    void set_merge_bytes(int64_t merge_bytes, int64_t bounce_bytes);
    int64_t merge_bytes();
    int64_t bounce_bytes();

    // read_rows reads through runs of at most `gap_bytes` untouched bytes between touched pages (a
    // multiple of kAlign, default 0: only adjacent pages merge): fewer, larger requests for more bytes,
    // the better trade where a device's request rate, not its bandwidth, is the limit.
    void set_gap_bytes(int64_t gap_bytes);
    int64_t gap_bytes();

    // read_rows' unit (default kAlign): the granularity of its requests, a power of two in [kSector,
    // kAlign]. A direct file is read in units of at least its own direct-I/O alignment (statx), so a
    // smaller unit takes effect only where the device allows it (512-byte logical blocks): fewer
    // bytes per row of a sparse read, as GNNDrive's sector-sized requests. unit_of: a file's unit.
    void set_unit_bytes(int64_t unit_bytes);
    int64_t unit_bytes();
    int64_t unit_of(int64_t handle);

 private:
    struct OpenFile {
        int fd = -1;
        bool direct = false;
        int64_t dio_align = kAlign;  // its direct-I/O alignment (kSector for a buffered file)
        std::string path;
    };

    void check_open_reader() const;
    // The open file of a handle, or std::invalid_argument. Call with mu_ held.
    OpenFile& file(int64_t handle);
    // read_rows' unit for a file: unit_bytes_, or the file's direct-I/O alignment where larger. Call with mu_ held.
    int64_t unit_for(const OpenFile& f) const { return std::max(unit_bytes_, f.dio_align); }
    int64_t execute(const std::vector<IoRequest>& reqs, ErrorSlot& err);
    uint8_t* bounce_buffer(int64_t nbytes);
    void release_bounce();
    void account(int64_t requested, int64_t got, int64_t requests, std::chrono::steady_clock::time_point t0);
    void close_all();

    int queue_depth_;
    int threads_;
    bool direct_;
    std::string backend_;
    std::string fallback_reason_;
    int64_t merge_bytes_ = kDefaultMergeBytes;
    int64_t bounce_capacity_ = kDefaultBounceBytes;
    int64_t gap_bytes_ = 0;
    int64_t unit_bytes_ = kAlign;

    std::mutex mu_;  // everything below
    bool closed_ = false;
    std::vector<OpenFile> files_;
    std::vector<std::string> paths_;
    std::unique_ptr<PreadPool> pool_;
    std::unique_ptr<Uring> uring_;  // null with the pread backend
    uint8_t* bounce_ = nullptr;
    int64_t bounce_size_ = 0;

    std::mutex stats_mu_;  // the counters
    ReaderCounters stats_;
};

// A zero-filled, kAlign-aligned anonymous mapping of at least `nbytes` (>= 0) bytes, for O_DIRECT
// destinations; `*mapped` receives its length, to hand back to free_aligned. Throws
// std::invalid_argument on a negative size and std::bad_alloc when the mapping fails.
void* alloc_aligned(int64_t nbytes, size_t* mapped);
void free_aligned(void* p, size_t mapped);

}  // namespace diskflow
