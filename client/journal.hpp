// The journal of the vGPU mirror: the calls that made what is alive now (handles, device allocations), with
// their arguments, in the order they succeeded. The call that ends a thing takes its entry out, so the
// journal holds as many entries as there are live things, however long the program runs. Which calls make and
// end handles comes from the spec's op signatures (client_ops.hpp journals them; state::forget ends what the
// mirror forgets); module loads and device allocations are journaled by their hand-written calls. Nothing
// reads it yet: it is the order a replay onto another server after a failover would follow, and no such
// replay exists (a lost server fails every later call with the documented CUresult; moves and resumes rebuild
// from the server's own tables, server/session_image.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "ops.hpp"

namespace vcuda::client {

struct journal_entry {
    op operation;
    std::vector<uint64_t> args;
    uint64_t made = 0;  // the handle or device address it made
};

class journal {
  public:
    // `made` was made by a call of `o` with `args`; a repeat for something journaled already (a cached
    // answer) is no second making.
    void made(op o, std::span<const uint64_t> args, uint64_t made);
    void ended(uint64_t made);
    std::vector<journal_entry> entries() const;

  private:
    mutable std::mutex mu_;
    std::map<uint64_t, journal_entry> entries_;  // by the order the calls succeeded in
    std::unordered_map<uint64_t, uint64_t> at_;  // made -> its key in entries_
    uint64_t next_ = 0;
};

}  // namespace vcuda::client
