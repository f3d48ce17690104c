// Pinned host buffers a lane reuses for bulk copies: a buffer goes back to the pool with an event recorded
// after the copy that reads or writes it, and is taken again only once that event has completed.
// Never allocate-and-free per call. runs on: the lane's thread only.
#pragma once

#include <cstddef>
#include <vector>

#include "driver_table.hpp"

namespace vcuda::server {

// Records `event` on `stream` behind the copies issued there. An event can be recorded only on a stream of
// its own context: one missing or of another context than the current one is (re)made first, `ctx` noting its
// context. The driver's error when none could be made or recorded.
CUresult record_in_current_context(const driver_table& drv, CUevent& event, CUcontext& ctx, CUstream stream);

class staging_pool {
  public:
    static constexpr size_t buffer_size = 8u << 20;
    static constexpr size_t max_buffers = 4;

    explicit staging_pool(const driver_table& drv) : drv_(&drv) {}
    ~staging_pool();

    struct buffer {
        void* data = nullptr;
        CUevent done = nullptr;
        CUcontext ctx = nullptr;
        bool busy = false;     // handed out and not yet returned
        bool pending = false;  // returned, with `done` recorded behind a copy
        bool stale = false;    // registered in a context that is gone: registered again when next taken
    };

    // A free buffer (waits for the oldest copy when all are in flight); null if pinned memory is unavailable.
    buffer* take();
    // Returns the buffer once the copy issued on `stream` has finished with it.
    void give_back(buffer* b, CUstream stream);
    // The session's contexts were made anew (a suspended session resumed): the buffers' registrations and
    // events belonged to the old ones.
    void contexts_changed();

  private:
    const driver_table* drv_;
    std::vector<buffer> buffers_;
};

}  // namespace vcuda::server
