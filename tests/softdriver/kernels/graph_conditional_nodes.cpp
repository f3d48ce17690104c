// Host kernels of tests/programs/graph_conditional_nodes.cu. cudaGraphSetConditional is the software driver's
// set_conditional (soft_kernel.hpp).
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;

// gcn_set(const unsigned* flag, cudaGraphConditionalHandle h): the condition is *flag
void gcn_set(const launch& l) {
    auto flag = l.param<const unsigned*>(0);
    auto h = l.param<uint64_t>(1);
    vcuda::soft::set_conditional(h, *flag);
}

// gcn_count_down(unsigned* left, cudaGraphConditionalHandle h): one step down; go on while steps are left
void gcn_count_down(const launch& l) {
    auto left = l.param<unsigned*>(0);
    auto h = l.param<uint64_t>(1);
    *left -= 1;
    vcuda::soft::set_conditional(h, *left > 0 ? 1u : 0u);
}

// gcn_add(unsigned* out, unsigned v): *out += v
void gcn_add(const launch& l) {
    auto out = l.param<unsigned*>(0);
    auto v = l.param<unsigned>(1);
    *out += v;
}

vcuda::soft::registrar r_gcn_set("gcn_set", {8, 8}, gcn_set);
vcuda::soft::registrar r_gcn_count_down("gcn_count_down", {8, 8}, gcn_count_down);
vcuda::soft::registrar r_gcn_add("gcn_add", {8, 4}, gcn_add);
}  // namespace
