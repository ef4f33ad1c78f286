// io_uring through raw system calls: ring setup and teardown, io_uring_enter, and the once-per-
// process probe. See uring.h for the shared-memory protocol.
#include "uring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)  // Linux 5.19; older kernel headers lack the name
#endif

namespace diskflow {
namespace {

// Submission entries of the probe's ring.
constexpr unsigned kProbeEntries = 4;
// The byte the probe writes into a pipe and reads back through the ring.
constexpr char kProbeByte = 'u';

long sys_io_uring_setup(unsigned entries, io_uring_params* p) { return syscall(__NR_io_uring_setup, entries, p); }

long sys_io_uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
    // No signal mask to install during the wait (sig = NULL, so its size is ignored).
    return syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, nullptr, 0);
}

void* map_ring(int fd, size_t bytes, off_t what) {
    // MAP_POPULATE: fault the ring pages in now rather than on the first submissions.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, what);
    return p == MAP_FAILED ? nullptr : p;
}

std::string errno_string(int err) {
    char buf[256];
    // GNU strerror_r may return a static string instead of filling buf.
    return std::string(strerror_r(err, buf, sizeof buf));
}

template <class T>
T* at(void* base, unsigned offset) {
    return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace

int IoUring::init(unsigned entries) {
    close();
    io_uring_params p{};
    p.flags = IORING_SETUP_COOP_TASKRUN;
    long fd = sys_io_uring_setup(entries, &p);
    if (fd < 0 && errno == EINVAL) {  // kernel older than 5.19: a plain ring
        p = io_uring_params{};
        fd = sys_io_uring_setup(entries, &p);
    }
    if (fd < 0) return -errno;
    ring_fd_ = static_cast<int>(fd);

    sq_ring_bytes_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_ring_bytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single_mmap = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;  // Linux >= 5.4
    if (single_mmap) sq_ring_bytes_ = cq_ring_bytes_ = std::max(sq_ring_bytes_, cq_ring_bytes_);
    sqes_bytes_ = p.sq_entries * sizeof(io_uring_sqe);
    sq_ring_ = map_ring(ring_fd_, sq_ring_bytes_, IORING_OFF_SQ_RING);
    if (sq_ring_ != nullptr) {
        cq_ring_ = single_mmap ? sq_ring_ : map_ring(ring_fd_, cq_ring_bytes_, IORING_OFF_CQ_RING);
    }
    if (cq_ring_ != nullptr) sqes_ = static_cast<io_uring_sqe*>(map_ring(ring_fd_, sqes_bytes_, IORING_OFF_SQES));
    if (sqes_ == nullptr) {  // one of the mappings failed (errno is mmap's)
        int e = errno;
        close();
        return -e;
    }

    sq_head_ = at<unsigned>(sq_ring_, p.sq_off.head);
    sq_tail_kernel_ = at<unsigned>(sq_ring_, p.sq_off.tail);
    sq_mask_ = *at<unsigned>(sq_ring_, p.sq_off.ring_mask);
    sq_entries_ = p.sq_entries;
    sq_tail_ = *sq_tail_kernel_;
    // SQE i always sits in slot i of the indirection array, set once (as liburing does).
    unsigned* array = at<unsigned>(sq_ring_, p.sq_off.array);
    for (unsigned i = 0; i < p.sq_entries; ++i) array[i] = i;
    cq_head_ = at<unsigned>(cq_ring_, p.cq_off.head);
    cq_tail_ = at<unsigned>(cq_ring_, p.cq_off.tail);
    cq_mask_ = *at<unsigned>(cq_ring_, p.cq_off.ring_mask);
    cqes_ = at<io_uring_cqe>(cq_ring_, p.cq_off.cqes);
    return 0;
}

void IoUring::close() {
    if (sqes_ != nullptr) munmap(sqes_, sqes_bytes_);
    if (cq_ring_ != nullptr && cq_ring_ != sq_ring_) munmap(cq_ring_, cq_ring_bytes_);
    if (sq_ring_ != nullptr) munmap(sq_ring_, sq_ring_bytes_);
    if (ring_fd_ >= 0) ::close(ring_fd_);
    ring_fd_ = -1;
    sq_ring_ = cq_ring_ = nullptr;
    sqes_ = nullptr;
    sq_ring_bytes_ = cq_ring_bytes_ = sqes_bytes_ = 0;
    sq_head_ = sq_tail_kernel_ = cq_head_ = cq_tail_ = nullptr;
    cqes_ = nullptr;
    sq_tail_ = sq_mask_ = sq_entries_ = cq_mask_ = 0;
}

int IoUring::enter(bool submit, unsigned wait_for) {
    const unsigned flags = wait_for > 0 ? IORING_ENTER_GETEVENTS : 0;
    for (;;) {
        // Counted afresh on each try: what the kernel consumed before an interruption is not resent.
        const unsigned to_submit = submit ? sq_pending() : 0;
        long rc = sys_io_uring_enter(ring_fd_, to_submit, wait_for, flags);
        if (rc >= 0) return static_cast<int>(rc);
        if (errno != EINTR) return -errno;
        // Interrupted by a signal while waiting. Retry; Python runs its handler when the reader
        // returns and takes the GIL again.
    }
}

int IoUring::submit_and_wait(unsigned wait_for) {
    // Publish the SQEs written since the last call: the release store orders their contents
    // before the new tail the kernel reads.
    __atomic_store_n(sq_tail_kernel_, sq_tail_, __ATOMIC_RELEASE);
    return enter(true, wait_for);
}

int IoUring::wait(unsigned wait_for) {
    int rc = enter(false, wait_for);
    return rc < 0 ? rc : 0;
}

const std::string& uring_unavailable(int* err) {
    static int probe_err = 0;
    static const std::string why = [] {
        IoUring ring;
        int rc = ring.init(kProbeEntries);
        if (rc < 0) {
            probe_err = -rc;
            return "io_uring_setup failed: " + errno_string(-rc);
        }
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) {
            probe_err = errno;
            return "the probe's pipe2 failed: " + errno_string(probe_err);
        }
        char got = 0;
        rc = ::write(fds[1], &kProbeByte, 1) == 1 ? 0 : -EIO;
        if (rc == 0 && !ring.queue_read(fds[0], &got, 1, 0, 0)) rc = -EBUSY;
        if (rc == 0) rc = ring.submit_and_wait(1);
        int res = -EIO;
        if (rc >= 0) ring.reap([&](uint64_t, int r) { res = r; });
        ::close(fds[0]);
        ::close(fds[1]);
        if (rc < 0) {
            probe_err = -rc;
            return "io_uring_enter failed: " + errno_string(-rc);
        }
        if (res != 1 || got != kProbeByte) {
            probe_err = res < 0 ? -res : EIO;
            return "IORING_OP_READ failed: " + (res < 0 ? errno_string(-res) : std::string("wrong data"));
        }
        return std::string();
    }();
    if (err != nullptr) *err = probe_err;
    return why;
}

}  // namespace diskflow
