// Host kernels of tests/programs/user_objects.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;

// uo_add(int* p, int v): *p += v
void uo_add(const launch& l) { *l.param<int*>(0) += l.param<int>(1); }

vcuda::soft::registrar r_uo_add("uo_add", {8, 4}, uo_add);
}  // namespace
