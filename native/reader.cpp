// Direct-I/O reader engine (see reader.h for the backends, the discipline and the errors): the
// pread pool, the io_uring driver loop, request checks and read_rows' page merging. No Python here.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reader.h"
#include "uring.h"

namespace diskflow {
namespace {

inline bool aligned(int64_t v) { return (v & (kAlign - 1)) == 0; }
inline int64_t round_up(int64_t v) { return (v + kAlign - 1) & ~(kAlign - 1); }

// The direct-I/O alignment of an open file (offsets, lengths and addresses), as statx reports it
// (STATX_DIOALIGN, Linux 6.1+), within [kSector, kAlign]; kAlign where the kernel or the file
// system does not say. Only read_rows uses less than kAlign, and only when asked (set_unit_bytes).
int64_t dio_align(int fd) {
#ifdef STATX_DIOALIGN
    struct statx sx {};
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) != 0 &&
        sx.stx_dio_offset_align > 0) {
        int64_t a = std::max<int64_t>(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
        int64_t p = kSector;
        while (p < a && p < kAlign) p <<= 1;
        return p;
    }
#else
    (void)fd;
#endif
    return kAlign;
}

std::string errno_text(int err) {
    char buf[256];
    // GNU strerror_r may return a static string instead of filling buf.
    return std::string(strerror_r(err, buf, sizeof buf));
}

}  // namespace

// One read request as executed: whole bytes [offset, offset + length) of fd into dst; `need` is the
// number of leading bytes that must be read (< length only for read_rows' last page at end of file).
struct IoRequest {
    int fd;
    int32_t file;  // handle, for error messages
    bool direct;
    int64_t align;  // a direct read resumes only at a multiple of this (the request's unit)
    int64_t offset;
    int64_t length;
    int64_t need;
    uint8_t* dst;
};

// The first error of a batch of requests; later ones are ignored. Thread-safe.
class ErrorSlot {
 public:
    bool failed() const { return failed_.load(std::memory_order_relaxed); }

    void record_errno(const IoRequest& r, int err, int64_t at) {
        std::lock_guard<std::mutex> lk(mu_);
        if (set_) return;
        set_ = true;
        err_ = err;
        req_ = r;
        at_ = at;
        failed_.store(true, std::memory_order_relaxed);
    }

    void record_short(const IoRequest& r, int64_t got) {
        std::lock_guard<std::mutex> lk(mu_);
        if (set_) return;
        set_ = true;
        short_ = true;
        req_ = r;
        at_ = r.offset + got;
        failed_.store(true, std::memory_order_relaxed);
    }

    // Throws the recorded error, naming `path` and the offsets. Call once no request is in flight.
    void raise_if_failed(const std::vector<std::string>& paths) const {
        if (!set_) return;
        const std::string& path = req_.file >= 0 && static_cast<size_t>(req_.file) < paths.size()
                                      ? paths[req_.file] : std::string("?");
        std::string where = "request of " + std::to_string(req_.length) + " bytes at offset " +
                            std::to_string(req_.offset);
        if (short_) {
            throw IoError(EIO, path,
                            "short read at offset " + std::to_string(at_) + ": end of file before the " +
                                where + " was complete (" + std::to_string(at_ - req_.offset) +
                                " bytes read)",
                            true);
        }
        throw IoError(err_, path, errno_text(err_) + " reading at offset " + std::to_string(at_) + " (" +
                                        where + ")");
    }

 private:
    std::atomic<bool> failed_{false};
    std::mutex mu_;
    bool set_ = false;
    bool short_ = false;
    int err_ = 0;
    IoRequest req_{};
    int64_t at_ = 0;
};

namespace {

// After `done` bytes of a request were read, is the rest of it past the end of file? A direct read
// that stops at an unaligned position has met the end of file (and cannot be resumed there).
inline bool stopped_at_eof(const IoRequest& r, int64_t done) {
    return r.direct && ((r.offset + done) & (r.align - 1)) != 0;
}

// Reads one request to completion with pread, resubmitting short reads. Returns the bytes read.
int64_t pread_request(const IoRequest& r, ErrorSlot& err) {
    int64_t done = 0;
    while (done < r.length) {
        ssize_t n = ::pread(r.fd, r.dst + done, static_cast<size_t>(r.length - done), r.offset + done);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            err.record_errno(r, errno, r.offset + done);
            return done;
        }
        if (n == 0) break;  // end of file
        done += n;
        if (done < r.length && stopped_at_eof(r, done)) break;
    }
    if (done < r.need) err.record_short(r, done);
    return done;
}

}  // namespace

// A pool of persistent threads that run batches of pread requests, one batch at a time.
class PreadPool {
 public:
    explicit PreadPool(int threads) {
        for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
    }

    ~PreadPool() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        wake_.notify_all();
        for (auto& w : workers_) w.join();
    }

    // Runs all requests (until the first error) and returns the bytes read. A single request runs
    // on the calling thread: waking the pool would cost more than it saves.
    int64_t run(const std::vector<IoRequest>& reqs, ErrorSlot& err) {
        if (reqs.size() == 1) return pread_request(reqs[0], err);
        std::unique_lock<std::mutex> lk(mu_);
        reqs_ = &reqs;
        err_ = &err;
        next_.store(0);
        bytes_.store(0);
        busy_ = static_cast<int>(workers_.size());
        ++generation_;
        wake_.notify_all();
        done_.wait(lk, [this] { return busy_ == 0; });
        reqs_ = nullptr;
        err_ = nullptr;
        return bytes_.load();
    }

 private:
    void work() {
        uint64_t seen = 0;
        for (;;) {
            const std::vector<IoRequest>* reqs;
            ErrorSlot* err;
            {
                std::unique_lock<std::mutex> lk(mu_);
                wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
                if (stop_) return;
                seen = generation_;
                reqs = reqs_;
                err = err_;
            }
            int64_t bytes = 0;
            for (;;) {
                if (err->failed()) break;  // drain: finish what is running, start nothing new
                size_t i = next_.fetch_add(1);
                if (i >= reqs->size()) break;
                bytes += pread_request((*reqs)[i], *err);
            }
            bytes_.fetch_add(bytes);
            std::lock_guard<std::mutex> lk(mu_);
            if (--busy_ == 0) done_.notify_one();
        }
    }

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    bool stop_ = false;
    uint64_t generation_ = 0;
    int busy_ = 0;
    const std::vector<IoRequest>* reqs_ = nullptr;
    ErrorSlot* err_ = nullptr;
    std::atomic<size_t> next_{0};
    std::atomic<int64_t> bytes_{0};
};

// io_uring (uring.h: raw system calls, no liburing), driven by the calling thread: keeps up to
// `depth` reads in flight on one ring per reader.
class Uring {
 public:
    // Returns 0 or a negative errno (from io_uring_setup or mapping the rings).
    int init(unsigned depth) {
        depth_ = depth;
        return ring_.init(depth);
    }

    bool ok() const { return ring_.ok(); }

    int64_t run(const std::vector<IoRequest>& reqs, ErrorSlot& err) {
        struct Slot {
            size_t req;
            int64_t done;  // bytes of the request read so far
        };
        std::vector<Slot> slots(depth_);
        std::vector<unsigned> free_slots(depth_);
        for (unsigned s = 0; s < depth_; ++s) free_slots[s] = depth_ - 1 - s;
        size_t next = 0;
        unsigned inflight = 0;  // queued or submitted, not yet completed
        int64_t bytes = 0;

        auto release = [&](unsigned s) {
            free_slots.push_back(s);
            --inflight;
        };
        // Queues the rest of slot s's request (offsets stay 64-bit up to the SQE's __u64 field).
        // The ring always has room: at most depth_ <= sq_entries requests are in flight, and a slot
        // is requeued only after its completion; were it full, the request fails (EBUSY), never hangs.
        auto queue = [&](unsigned s) {
            const IoRequest& r = reqs[slots[s].req];
            const int64_t done = slots[s].done;
            if (!ring_.queue_read(r.fd, r.dst + done, static_cast<uint32_t>(r.length - done),
                                  static_cast<uint64_t>(r.offset + done), s)) {
                err.record_errno(r, EBUSY, r.offset + done);
                release(s);
            }
        };
        auto complete = [&](uint64_t user_data, int res) {
            const unsigned s = static_cast<unsigned>(user_data);
            const IoRequest& r = reqs[slots[s].req];
            if (res == -EINTR || res == -EAGAIN) {
                queue(s);  // retry as is
            } else if (res < 0) {
                err.record_errno(r, -res, r.offset + slots[s].done);
                release(s);
            } else {
                slots[s].done += res;
                bytes += res;
                bool more = res > 0 && slots[s].done < r.length && !stopped_at_eof(r, slots[s].done);
                if (more && !err.failed()) {
                    queue(s);  // short read: the remainder
                } else {
                    if (slots[s].done < r.need) err.record_short(r, slots[s].done);
                    release(s);
                }
            }
        };

        for (;;) {
            // After the first error nothing new is queued; what is in flight is drained.
            while (!err.failed() && next < reqs.size() && inflight < depth_) {
                if (reqs[next].length == 0) {
                    ++next;
                    continue;
                }
                unsigned s = free_slots.back();
                free_slots.pop_back();
                slots[s] = {next++, 0};
                ++inflight;
                queue(s);
            }
            if (inflight == 0) break;
            int rc = ring_.submit_and_wait(1);
            if (rc < 0 && rc != -EAGAIN && rc != -EBUSY) {
                // The ring itself failed: wait for what the kernel took, then start a fresh ring.
                const IoRequest& r = reqs[next - 1];
                err.record_errno(r, -rc, r.offset);
                inflight -= std::min(inflight, ring_.sq_pending());  // never submitted
                while (inflight > 0 && ring_.wait(1) == 0) {
                    inflight -= std::min(inflight, ring_.reap([](uint64_t, int) {}));
                }
                init(depth_);
                return bytes;
            }
            ring_.reap(complete);  // EAGAIN, EBUSY: completions to reap first, then submit again
        }
        return bytes;
    }

 private:
    IoUring ring_;
    unsigned depth_ = 0;
};

namespace {

std::string misaligned(const std::string& path, int64_t offset, int64_t length, const uint8_t* p) {
    char addr[32];
    std::snprintf(addr, sizeof addr, "%p", static_cast<const void*>(p));
    return path + ": misaligned O_DIRECT request at offset " + std::to_string(offset) + ", length " +
           std::to_string(length) + ", buffer address " + addr + " (each must be a multiple of " +
           std::to_string(kAlign) + "; allocate buffers with aligned_empty(), or open with direct=False)";
}

}  // namespace

Reader::Reader(int queue_depth, int threads, const std::string& backend, bool direct)
    : queue_depth_(queue_depth), threads_(threads), direct_(direct) {
    if (queue_depth < 1) throw std::invalid_argument("queue_depth must be >= 1, got " + std::to_string(queue_depth));
    if (threads < 1) throw std::invalid_argument("threads must be >= 1, got " + std::to_string(threads));
    if (backend != "auto" && backend != "uring" && backend != "pread") {
        throw std::invalid_argument("backend must be 'auto', 'uring' or 'pread', got '" + backend + "'");
    }
    if (backend == "pread") {
        backend_ = "pread";
        return;
    }
    int probe_err = 0;
    std::string why = uring_unavailable(&probe_err);
    int rc = -probe_err;
    if (why.empty()) {
        uring_ = std::make_unique<Uring>();
        rc = uring_->init(static_cast<unsigned>(queue_depth));
        if (rc < 0) {
            why = "io_uring_setup(" + std::to_string(queue_depth) + " entries) failed: " + errno_text(-rc);
            uring_.reset();
        }
    }
    if (rc == 0) {
        backend_ = "uring";
    } else if (backend == "uring") {
        throw IoError(-rc, "", "backend 'uring' unavailable: " + why);
    } else {
        backend_ = "pread";
        fallback_reason_ = why;
    }
}

Reader::~Reader() { close_all(); }

OpenedFile Reader::open(const std::string& path) {
    std::lock_guard<std::mutex> lk(mu_);
    check_open_reader();
    bool direct = direct_;
    std::string refused;
    int fd = -1;
    if (direct) {
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (fd < 0 && errno == EINVAL) {
            refused = "the file system refuses O_DIRECT (" + errno_text(EINVAL) + ")";
            direct = false;
        }
    }
    if (!direct) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        throw IoError(e, path, errno_text(e) + " (opening for reading)");
    }
    struct stat st {};
    int e = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (e != 0) {
        ::close(fd);
        throw IoError(e, path, errno_text(e) + " (opening for reading: not a regular file)");
    }
    files_.push_back({fd, direct, direct ? dio_align(fd) : kSector, path});
    paths_.push_back(path);
    return {static_cast<int>(files_.size() - 1), direct, refused};
}

bool Reader::is_direct(int64_t handle) {
    std::lock_guard<std::mutex> lk(mu_);
    return file(handle).direct;
}

std::string Reader::path_of(int64_t handle) {
    std::lock_guard<std::mutex> lk(mu_);
    return file(handle).path;
}

void Reader::close_file(int64_t handle) {
    std::lock_guard<std::mutex> lk(mu_);
    OpenFile& f = file(handle);
    ::close(f.fd);
    f.fd = -1;
}

void Reader::close() {
    std::lock_guard<std::mutex> lk(mu_);
    close_all();
    closed_ = true;
}

void Reader::read(const int64_t* h, const int64_t* off, const int64_t* len, const int64_t* dst, int64_t n,
                  uint8_t* out, int64_t out_bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<IoRequest> reqs;
    reqs.reserve(static_cast<size_t>(n));
    int64_t requested = 0;
    for (int64_t i = 0; i < n; ++i) {
        const OpenFile& f = file(h[i]);
        if (off[i] < 0 || len[i] < 0 || dst[i] < 0 || dst[i] > out_bytes || len[i] > out_bytes - dst[i]) {
            throw std::invalid_argument(f.path + ": request " + std::to_string(i) + " (offset " +
                                        std::to_string(off[i]) + ", length " + std::to_string(len[i]) +
                                        ", out_offset " + std::to_string(dst[i]) +
                                        ") is negative or does not fit the output buffer of " +
                                        std::to_string(out_bytes) + " bytes");
        }
        uint8_t* p = out + dst[i];
        if (f.direct &&
            !(aligned(off[i]) && aligned(len[i]) && aligned(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p))))) {
            throw std::invalid_argument(misaligned(f.path, off[i], len[i], p));
        }
        requested += len[i];
        for (int64_t o = 0; o < len[i]; o += kMaxRequestBytes) {
            int64_t l = std::min(kMaxRequestBytes, len[i] - o);
            reqs.push_back({f.fd, static_cast<int32_t>(h[i]), f.direct, kAlign, off[i] + o, l, l, p + o});
        }
    }
    ErrorSlot err;
    int64_t got = execute(reqs, err);
    account(requested, got, static_cast<int64_t>(reqs.size()), t0);
    err.raise_if_failed(paths_);
}

void Reader::read_rows(int64_t handle, const int64_t* offs, int64_t n, int64_t row_bytes, uint8_t* out,
                       int64_t out_bytes) {
    if (row_bytes <= 0) throw std::invalid_argument("read_rows: row_bytes must be > 0, got " + std::to_string(row_bytes));
    if (out_bytes != n * row_bytes) {
        throw std::invalid_argument("read_rows: out holds " + std::to_string(out_bytes) + " bytes, expected " +
                                    std::to_string(n) + " rows x " + std::to_string(row_bytes) + " bytes");
    }
    std::lock_guard<std::mutex> lk(mu_);
    auto t0 = std::chrono::steady_clock::now();
    const OpenFile& f = file(handle);
    for (int64_t i = 0; i < n; ++i) {
        if (offs[i] < 0) {
            throw std::invalid_argument(f.path + ": read_rows: negative row offset " + std::to_string(offs[i]) +
                                        " (row " + std::to_string(i) + ")");
        }
    }
    // Rows by offset (stable: equal offsets keep their order).
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    if (!std::is_sorted(offs, offs + n)) {
        std::stable_sort(order.begin(), order.end(), [offs](int64_t a, int64_t b) { return offs[a] < offs[b]; });
    }
    // Runs of touched units (4 KiB pages, or smaller where set_unit_bytes allows and the file's
    // direct-I/O alignment permits), cut into chunks of at most merge_bytes.
    const int64_t unit = unit_for(f);
    int shift = 0;
    while ((int64_t{1} << shift) < unit) ++shift;
    const int64_t gap_units = gap_bytes_ >> shift;
    struct Chunk {
        int64_t first;  // in units
        int64_t units;
        int64_t need;  // bytes of the chunk that rows use (the rest may lie past the end of file)
    };
    std::vector<Chunk> chunks;
    const int64_t max_units = std::max<int64_t>(1, merge_bytes_ >> shift);
    auto flush = [&](int64_t first, int64_t last, int64_t end_byte) {
        for (int64_t s = first; s <= last; s += max_units) {
            int64_t e = std::min(last, s + max_units - 1);
            int64_t need = e == last ? end_byte - (s << shift) : (e - s + 1) << shift;
            chunks.push_back({s, e - s + 1, need});
        }
    };
    int64_t run_first = -1, run_last = -1, run_end = 0;
    for (int64_t k = 0; k < n; ++k) {
        int64_t o = offs[order[k]];
        int64_t fp = o >> shift, lp = (o + row_bytes - 1) >> shift;
        if (run_first >= 0 && fp <= run_last + 1 + gap_units) {
            run_last = std::max(run_last, lp);
            run_end = std::max(run_end, o + row_bytes);
        } else {
            if (run_first >= 0) flush(run_first, run_last, run_end);
            run_first = fp;
            run_last = lp;
            run_end = o + row_bytes;
        }
    }
    if (run_first >= 0) flush(run_first, run_last, run_end);

    // Rounds of chunks that fit the bounce buffer: read, then copy the rows' bytes out.
    ErrorSlot err;
    int64_t got = 0, issued = 0;
    size_t c = 0;
    int64_t lo = 0;  // first sorted row that may still intersect the current chunk
    while (c < chunks.size() && !err.failed()) {
        int64_t total = 0;
        size_t c_end = c;
        while (c_end < chunks.size() &&
               (c_end == c || total + (chunks[c_end].units << shift) <= bounce_capacity_)) {
            total += chunks[c_end++].units << shift;
        }
        uint8_t* bounce = bounce_buffer(total);
        std::vector<IoRequest> reqs;
        int64_t pos = 0;
        for (size_t k = c; k < c_end; ++k) {
            int64_t len = chunks[k].units << shift;
            reqs.push_back({f.fd, static_cast<int32_t>(handle), f.direct, unit, chunks[k].first << shift, len,
                            chunks[k].need, bounce + pos});
            pos += len;
        }
        got += execute(reqs, err);
        issued += static_cast<int64_t>(reqs.size());
        if (err.failed()) break;
        pos = 0;
        for (size_t k = c; k < c_end; ++k) {
            const int64_t cs = chunks[k].first << shift;
            const int64_t ce = cs + (chunks[k].units << shift);
            while (lo < n && offs[order[lo]] + row_bytes <= cs) ++lo;
            for (int64_t j = lo; j < n && offs[order[j]] < ce; ++j) {
                const int64_t ro = offs[order[j]];
                const int64_t s = std::max(ro, cs), e = std::min(ro + row_bytes, ce);
                std::memcpy(out + order[j] * row_bytes + (s - ro), bounce + pos + (s - cs), static_cast<size_t>(e - s));
            }
            pos += ce - cs;
        }
        c = c_end;
    }
    account(n * row_bytes, got, issued, t0);
    err.raise_if_failed(paths_);
}

ReaderCounters Reader::counters() {
    std::lock_guard<std::mutex> lk(stats_mu_);
    return stats_;
}

void Reader::reset_counters() {
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_ = ReaderCounters{};
}

void Reader::set_merge_bytes(int64_t merge_bytes, int64_t bounce_bytes) {
    if (merge_bytes < kAlign || merge_bytes > kMaxRequestBytes || !aligned(merge_bytes)) {
        throw std::invalid_argument("merge_bytes must be a multiple of " + std::to_string(kAlign) + " in [" +
                                    std::to_string(kAlign) + ", " + std::to_string(kMaxRequestBytes >> 20) +
                                    " MiB], got " + std::to_string(merge_bytes));
    }
    if (bounce_bytes < merge_bytes) {
        throw std::invalid_argument("bounce_bytes must be >= merge_bytes, got " + std::to_string(bounce_bytes));
    }
    std::lock_guard<std::mutex> lk(mu_);
    merge_bytes_ = merge_bytes;
    bounce_capacity_ = round_up(bounce_bytes);
}

void Reader::set_gap_bytes(int64_t gap_bytes) {
    if (gap_bytes < 0 || gap_bytes > kMaxRequestBytes || !aligned(gap_bytes)) {
        throw std::invalid_argument("gap_bytes must be a multiple of " + std::to_string(kAlign) + " in [0, " +
                                    std::to_string(kMaxRequestBytes >> 20) + " MiB], got " + std::to_string(gap_bytes));
    }
    std::lock_guard<std::mutex> lk(mu_);
    gap_bytes_ = gap_bytes;
}

int64_t Reader::gap_bytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return gap_bytes_;
}

void Reader::set_unit_bytes(int64_t unit_bytes) {
    if (unit_bytes < kSector || unit_bytes > kAlign || (unit_bytes & (unit_bytes - 1)) != 0) {
        throw std::invalid_argument("unit_bytes must be a power of two in [" + std::to_string(kSector) + ", " +
                                    std::to_string(kAlign) + "], got " + std::to_string(unit_bytes));
    }
    std::lock_guard<std::mutex> lk(mu_);
    unit_bytes_ = unit_bytes;
}

int64_t Reader::unit_bytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return unit_bytes_;
}

int64_t Reader::unit_of(int64_t handle) {
    std::lock_guard<std::mutex> lk(mu_);
    return unit_for(file(handle));
}

int64_t Reader::merge_bytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return merge_bytes_;
}

int64_t Reader::bounce_bytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return bounce_capacity_;
}

void Reader::check_open_reader() const {
    if (closed_) throw std::invalid_argument("the reader is closed");
}

Reader::OpenFile& Reader::file(int64_t handle) {
    check_open_reader();
    if (handle < 0 || handle >= static_cast<int64_t>(files_.size()) || files_[handle].fd < 0) {
        throw std::invalid_argument("bad handle " + std::to_string(handle) + ": not a file open in this reader");
    }
    return files_[handle];
}

int64_t Reader::execute(const std::vector<IoRequest>& reqs, ErrorSlot& err) {
    if (reqs.empty()) return 0;
    if (uring_ && uring_->ok()) return uring_->run(reqs, err);
    if (!pool_) pool_ = std::make_unique<PreadPool>(threads_);
    return pool_->run(reqs, err);
}

// The bounce buffer, grown to at least `nbytes` (page-aligned: it is an anonymous mapping).
uint8_t* Reader::bounce_buffer(int64_t nbytes) {
    if (nbytes > bounce_size_) {
        release_bounce();
        void* p = mmap(nullptr, static_cast<size_t>(nbytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        bounce_ = static_cast<uint8_t*>(p);
        bounce_size_ = nbytes;
    }
    return bounce_;
}

void Reader::release_bounce() {
    if (bounce_ != nullptr) munmap(bounce_, static_cast<size_t>(bounce_size_));
    bounce_ = nullptr;
    bounce_size_ = 0;
}

void Reader::account(int64_t requested, int64_t got, int64_t requests, std::chrono::steady_clock::time_point t0) {
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.bytes_requested += requested;
    stats_.bytes_read += got;
    stats_.requests += requests;
    stats_.seconds += dt;
}

void Reader::close_all() {
    for (auto& f : files_) {
        if (f.fd >= 0) ::close(f.fd);
        f.fd = -1;
    }
    release_bounce();
    pool_.reset();
    uring_.reset();
}

void* alloc_aligned(int64_t nbytes, size_t* mapped) {
    if (nbytes < 0) throw std::invalid_argument("aligned_empty: nbytes must be >= 0, got " + std::to_string(nbytes));
    const size_t size = static_cast<size_t>(std::max<int64_t>(round_up(nbytes), kAlign));
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    *mapped = size;
    return p;
}

void free_aligned(void* p, size_t mapped) { munmap(p, mapped); }

}  // namespace diskflow
