// Host kernels of tests/programs/device_printf.cu: they print to the server's stdout, as the real driver does
// when it flushes a kernel's printf buffer.
#include <cstdio>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;

// dp_say(int k, float v), one thread
void say(const launch& l) {
    std::printf("kernel %d thread %d says %.2f\n", l.param<int>(0), 0, l.param<float>(1));
}

// dp_count_lines(int n), one thread
void count_lines(const launch& l) {
    int n = l.param<int>(0);
    for (int i = 0; i < n; ++i) std::printf("line %d of %d\n", i, n);
}

vcuda::soft::registrar r_say("dp_say", {4, 4}, say);
vcuda::soft::registrar r_lines("dp_count_lines", {4}, count_lines);
}  // namespace
