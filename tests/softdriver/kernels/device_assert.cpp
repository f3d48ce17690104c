// Host kernel of tests/programs/device_assert.cu. A failed device-side assert poisons the real driver's state
// in the process that launched it; here it ends that process (abort), as a driver crash does: the server in
// thread mode dies with every tenant's session, a worker under --isolation process takes only its own
// session.
#include <cstdio>
#include <cstdlib>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;

void device_assert_kernel(const launch& l) {
    auto bound = l.param<int>(0);
    if (l.threads() > 0 && bound < static_cast<int>(l.block.x)) {
        std::fprintf(stderr, "softdriver: device_assert_kernel: assert(threadIdx.x < %d) failed; aborting\n",
                     bound);
        std::abort();
    }
}

vcuda::soft::registrar r_device_assert("device_assert_kernel", {4}, device_assert_kernel);
}  // namespace
