// A minimal io_uring driver over the kernel's own interface (linux/io_uring.h and two system
// calls), so that every build has io_uring without liburing: io_uring_setup(2) creates the ring,
// the submission ring, completion ring and SQE array are mmap(2)ed from its file descriptor, and
// io_uring_enter(2) submits queued entries and waits for completions.
//
// Shared-memory protocol (the kernel is the other party):
//   submission: we write SQEs and advance the SQ tail with a release store; the kernel advances
//               the SQ head as it consumes them (we load it with acquire).
//   completion: the kernel writes CQEs and advances the CQ tail (we load it with acquire); we
//               advance the CQ head with a release store once the CQEs are read.
// The ring is not thread-safe: one thread at a time drives it (the reader holds its lock).
#pragma once

#include <linux/io_uring.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace diskflow {

class IoUring {
 public:
    IoUring() = default;
    IoUring(const IoUring&) = delete;
    IoUring& operator=(const IoUring&) = delete;
    ~IoUring() { close(); }

    // Creates a ring of at least `entries` submission entries (the kernel rounds up to a power of
    // two). Asks for IORING_SETUP_COOP_TASKRUN first (Linux >= 5.19: completions wait for this thread
    // to enter the kernel instead of interrupting it), then retries without it on EINVAL.
    // Returns 0, or a negative errno (the ring is then closed).
    int init(unsigned entries);

    // Unmaps the rings and closes the ring's file descriptor (the kernel cancels what is still in
    // flight: callers drain their requests first). Idempotent.
    void close();

    bool ok() const { return ring_fd_ >= 0; }
    unsigned sq_entries() const { return sq_entries_; }

    // Queues a read of `len` bytes at byte `offset` of `fd` into `dst` in the next free SQE; the
    // kernel sees it at the next submit_and_wait(). Returns false when the submission ring is full.
    bool queue_read(int fd, void* dst, uint32_t len, uint64_t offset, uint64_t user_data) {
        const unsigned head = __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
        if (sq_tail_ - head >= sq_entries_) return false;
        io_uring_sqe* sqe = &sqes_[sq_tail_ & sq_mask_];
        std::memset(sqe, 0, sizeof *sqe);
        sqe->opcode = IORING_OP_READ;
        sqe->fd = fd;
        sqe->off = offset;
        sqe->addr = reinterpret_cast<uintptr_t>(dst);
        sqe->len = len;
        sqe->user_data = user_data;
        ++sq_tail_;  // published to the kernel by submit_and_wait()
        return true;
    }

    // Entries queued but not yet consumed by the kernel.
    unsigned sq_pending() const { return sq_tail_ - __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE); }

    // Submits every queued entry and, when `wait_for` > 0, waits until at least `wait_for`
    // completions are available (IORING_ENTER_GETEVENTS). Retried on EINTR. Returns the number of
    // entries the kernel consumed, or a negative errno (EAGAIN and EBUSY are transient: reap
    // completions and call again).
    int submit_and_wait(unsigned wait_for);

    // Waits (submitting nothing) until at least `wait_for` completions are available. Retried on
    // EINTR. Returns 0 or a negative errno.
    int wait(unsigned wait_for);

    // Calls f(user_data, res) for every completion available now, in order, then hands their slots
    // back to the kernel. `f` may queue new reads. Returns the number of completions seen.
    template <class F>
    unsigned reap(F&& f) {
        unsigned head = *cq_head_;  // only this side writes the head
        const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
        const unsigned seen = tail - head;
        for (; head != tail; ++head) {
            const io_uring_cqe& cqe = cqes_[head & cq_mask_];
            f(cqe.user_data, cqe.res);
        }
        if (seen != 0) __atomic_store_n(cq_head_, tail, __ATOMIC_RELEASE);
        return seen;
    }

 private:
    // io_uring_enter(2): submits the pending entries when `submit`, waits for `wait_for` completions.
    int enter(bool submit, unsigned wait_for);

    int ring_fd_ = -1;
    // Mappings: the submission ring, the completion ring (the same mapping when the kernel has
    // IORING_FEAT_SINGLE_MMAP) and the SQE array.
    void* sq_ring_ = nullptr;
    size_t sq_ring_bytes_ = 0;
    void* cq_ring_ = nullptr;
    size_t cq_ring_bytes_ = 0;
    io_uring_sqe* sqes_ = nullptr;
    size_t sqes_bytes_ = 0;

    unsigned* sq_head_ = nullptr;  // kernel-written
    unsigned* sq_tail_kernel_ = nullptr;  // written by us (release)
    unsigned sq_tail_ = 0;  // our tail, ahead of *sq_tail_kernel_ by the entries queued since the last submit
    unsigned sq_mask_ = 0;
    unsigned sq_entries_ = 0;
    unsigned* cq_head_ = nullptr;  // written by us (release)
    unsigned* cq_tail_ = nullptr;  // kernel-written
    unsigned cq_mask_ = 0;
    io_uring_cqe* cqes_ = nullptr;
};

// Whether io_uring works in this process: kernel support, not disabled (kernel.io_uring_disabled),
// not filtered (seccomp), IORING_OP_READ known (Linux >= 5.6). Probed once per process by creating a
// small ring and reading one byte from a pipe through it. Returns "" when usable, else why not;
// `err` receives the errno of the refusal (0 when usable).
const std::string& uring_unavailable(int* err = nullptr);

}  // namespace diskflow
