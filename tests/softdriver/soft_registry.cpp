// The kernel registry of the software test driver (soft_kernel.hpp): host kernels and __device__ variables
// by name. Its functions are exported with default visibility, so that kernels registered from kernels/*.cpp
// (inside this library) and from a test binary that dlopens the library (through dlsym) land in one table.
// locks: its own mutex; registration happens at static-initialisation time, before any driver call.

// The registry API is part of the library's interface: declare it visible before anything else includes it.
#pragma GCC visibility push(default)
#include "soft_kernel.hpp"
#pragma GCC visibility pop

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

// Names are copied: an entry's string_view points at storage owned here, stable for the process.
struct stored_kernel {
    std::string name;
    kernel_entry entry;
};
struct stored_global {
    std::string name;
    global_entry entry;
};

struct registry {
    std::mutex mu;
    std::map<std::string, std::unique_ptr<stored_kernel>, std::less<>> kernels;
    std::map<std::string, std::unique_ptr<stored_global>, std::less<>> globals;
};

registry& the_registry() {
    static registry r;  // constructed on first use: safe from other translation units' static initialisers
    return r;
}

}  // namespace

// The first registration of a name wins: a later one would change a kernel under handles already handed out.
void register_kernel(kernel_entry e) {
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    std::string name(e.name);
    if (name.empty() || e.fn == nullptr) return;
    if (r.kernels.count(name) != 0) {
        std::fprintf(stderr, "vcuda softdriver: kernel '%s' registered twice; keeping the first\n",
                     name.c_str());
        return;
    }
    auto stored = std::make_unique<stored_kernel>();
    stored->name = name;
    stored->entry = std::move(e);
    stored->entry.name = stored->name;
    r.kernels.emplace(std::move(name), std::move(stored));
}

void register_global(global_entry e) {
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    std::string name(e.name);
    if (name.empty() || r.globals.count(name) != 0) return;
    auto stored = std::make_unique<stored_global>();
    stored->name = name;
    stored->entry = e;
    stored->entry.name = stored->name;
    r.globals.emplace(std::move(name), std::move(stored));
}

const kernel_entry* find_kernel(std::string_view name) {
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    auto it = r.kernels.find(name);
    return it == r.kernels.end() ? nullptr : &it->second->entry;
}

const global_entry* find_global(std::string_view name) {
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    auto it = r.globals.find(name);
    return it == r.globals.end() ? nullptr : &it->second->entry;
}

std::vector<const kernel_entry*> registered_kernels() {
    registry& r = the_registry();
    std::lock_guard lk(r.mu);
    std::vector<const kernel_entry*> out;
    out.reserve(r.kernels.size());
    for (auto& [name, k] : r.kernels) out.push_back(&k->entry);
    return out;
}

// The parameter block layout: parameters in order, each aligned to min(size, 8) rounded down to a power of
// two. The registry knows only sizes, so this is the natural alignment of scalars and pointers; a kernel
// whose struct parameter is less aligned than that must say so through its registered sizes.
std::vector<size_t> param_offsets(const kernel_entry& k) {
    std::vector<size_t> out;
    out.reserve(k.param_sizes.size());
    size_t offset = 0;
    for (size_t size : k.param_sizes) {
        size_t align = size < 8 ? size : 8;
        if (align == 0) align = 1;
        while ((align & (align - 1)) != 0) align &= align - 1;  // round down to a power of two
        offset = round_up(offset, align);
        out.push_back(offset);
        offset += size;
    }
    return out;
}

}  // namespace vcuda::soft
