// Device-to-host copies the client leaves under way when the call returns, as the real driver leaves a copy
// into pinned memory (client/deferred_copies.hpp): the GPU writes into pages of this store, registered with
// the driver so that the copy is asynchronous, followed on its stream by a callback that marks it done; the
// client collects the bytes of completed copies when the application observes completion (a synchronize, a
// query that answers ready, a host function's turn). Collecting and waiting make no driver call: the client's
// host-function thread collects while the GPU may wait for that very host function, and a driver call then
// could wait for the GPU (cuMemHostRegister on another lane does, holding what cuEventQuery needs: NVIDIA's
// simpleCallback sample hung so over TCP). Bounded per session by common/deferred_copy_limits.hpp, refused
// copies counted too (the client keeps under the bounds; a copy beyond them is refused). runs on: the
// session's lane threads. locks: one mutex of its own, never held across a driver wait.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/deferred_copy_limits.hpp"
#include "driver_table.hpp"

namespace vcuda::server {

// A copy's end as its stream's callback reports it (the driver's thread writes, lanes read).
struct copy_done {
    std::atomic<bool> reached{false};
    std::atomic<int> status{CUDA_SUCCESS};
};

class deferred_copies {
  public:
    // A copy that finished (its bytes, or the driver's error in `status`), kept until collected: after a
    // suspend or a move, when its pages and event are gone.
    struct landed {
        uint64_t ticket = 0;
        CUresult status = CUDA_SUCCESS;
        std::vector<std::byte> bytes;
    };

    deferred_copies() = default;
    deferred_copies(const deferred_copies&) = delete;
    deferred_copies& operator=(const deferred_copies&) = delete;
    ~deferred_copies();

    // Enqueues the copy of n bytes at `src` on `stream` under the client's `ticket` (unused so far), in the
    // current context. INVALID_VALUE for a ticket in use or a size beyond the bounds.
    CUresult start(const driver_table& drv, uint64_t ticket, CUdeviceptr src, size_t n, CUstream stream);
    // A copy refused before it started: answered to the client's next collect as failed, so that it stops
    // waiting for it.
    void refused(uint64_t ticket, CUresult why);
    // Whether `ticket` is still under way (false when it finished, was collected, or never was).
    bool under_way(uint64_t ticket);
    // Every finished copy, in ticket order, appended to `out` as {ticket, size, status} (3 x uint64) and then
    // its bytes when status is 0; they leave the store.
    void collect(std::vector<std::byte>& out);
    // Before a suspend or a move, the session's work drained: every copy becomes a landed one.
    void land_all(const driver_table& drv);
    // The landed copies, for a move's state; and a moved session's, on the receiving side.
    std::vector<landed> landed_copies();
    void add_landed(std::vector<landed> copies);
    // At the session's end.
    void clear(const driver_table& drv);

  private:
    struct in_flight {
        void* pages = nullptr;
        size_t size = 0, mapped = 0;
        bool registered = false;
        std::shared_ptr<copy_done> done;  // set by the stream's callback after the copy
    };
    struct copy {
        enum class phase { starting, flying, landed } at = phase::starting;
        size_t charged = 0;  // of bytes_
        in_flight flight;    // flying
        landed result;       // landed
    };
    // Pages for a copy of n bytes: free registered pages of its size class, else new ones, registered while
    // the session's registered pages stay under max_registered, else pageable (the driver then ends the copy
    // before it returns: slower, still right).
    in_flight pages_for(const driver_table& drv, size_t n);
    // The size class of n bytes: its pages are 4 KiB << class.
    static size_t size_class(size_t n);
    // A landed copy kept for the next collect (mu_ held), unless its ticket is 0 or in use.
    void keep_landed(landed l);
    // Gives pages back (mu_ held): registered ones to the free lists. Registrations
    // are undone only in land_all(), with the session's work drained: cuMemHostUnregister waits for the GPU,
    // which may be waiting for a host function of this client's, whose thread may be collecting copies now.
    void release(in_flight& f);
    // A finished copy's bytes out of its pages, with its status (mu_ held).
    void land(copy& c, CUresult status);
    // A flying copy whose callback has come is landed (mu_ held); false while it is still under way.
    bool land_if_reached(copy& c);

    std::mutex mu_;
    std::map<uint64_t, copy> copies_;  // by ticket
    size_t bytes_ = 0;                 // of the copies in the store
    // Registered pages not in use, by size class (4 KiB << k); the bytes registered, in use or not.
    static constexpr size_t classes = 12;  // up to 8 MiB, max_copy
    static constexpr size_t max_registered = 2 * deferred_copy::max_bytes;
    std::vector<in_flight> free_[classes];
    size_t registered_ = 0;
};

}  // namespace vcuda::server
