// The software test driver's kernel registry: host implementations of the test programs' kernels, found by
// the kernel's (mangled) name when a program loads its image and launches. A test stand-in only: it never
// ships as a feature. Each registration also gives the parameter sizes, from which the driver answers
// cuFuncGetParamInfo / cuKernelGetParamInfo exactly as the real driver would for that kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

namespace vcuda::soft {

struct dim {
    unsigned x = 1, y = 1, z = 1;
};

// What a host kernel sees of its launch. The kernel loops over grid and block itself.
struct launch {
    dim grid, block;
    unsigned shared_bytes = 0;
    void* const* params = nullptr;  // params[i] points at parameter i, as in cuLaunchKernel's kernelParams

    template <class T>
    T param(size_t i) const {
        return *static_cast<const T*>(params[i]);
    }
    size_t threads() const { return size_t{grid.x} * grid.y * grid.z * block.x * block.y * block.z; }
};

using kernel_fn = void (*)(const launch&);

struct kernel_entry {
    std::string_view name;            // the symbol name in the image (mangled for C++ kernels)
    std::vector<size_t> param_sizes;  // in bytes, in order; offsets follow the C ABI alignment rules
    kernel_fn fn;
};

// A __device__ variable of a test program (found by cuModuleGetGlobal / cuLibraryGetGlobal).
struct global_entry {
    std::string_view name;
    size_t size;
};

void register_kernel(kernel_entry e);
void register_global(global_entry e);
const kernel_entry* find_kernel(std::string_view name);
const global_entry* find_global(std::string_view name);

// Texture and surface objects for host kernels (soft_array.cpp). tex_read: the `n`-byte element at integer
// coordinates (x in elements; point filtering, as tex2D at x + 0.5 or tex1Dfetch at x), clamped to the
// edge, zeros outside with border addressing. surf_write / surf_read: x in bytes, as surf2Dwrite; outside
// the array they do nothing and answer false (the GPU would trap). False also for an unknown object or a
// size that is not the element's.
bool tex_read(uint64_t object, long x, long y, long z, void* out, size_t n);
// The same at mipmap level `level` of a texture over a mipmapped array (tex2DLod with point filtering).
bool tex_read_level(uint64_t object, unsigned level, long x, long y, long z, void* out, size_t n);
bool surf_write(uint64_t object, long x_bytes, long y, long z, const void* in, size_t n);
bool surf_read(uint64_t object, long x_bytes, long y, long z, void* out, size_t n);

// For a host kernel whose device code names a variable itself (a __managed__ or __device__ one, not through a
// parameter): that variable of the running kernel's module or library, nullptr when it was never looked up
// there (cudart looks up each __managed__ variable when it loads the module).
void* kernel_global(std::string_view name);

// cudaGraphSetConditional for host kernels (soft_graph.cpp): sets conditional handle `handle`, which the
// kernel took by value, to `value`; false for an unknown handle.
bool set_conditional(uint64_t handle, unsigned value);

struct registrar {
    registrar(std::string_view name, std::initializer_list<size_t> sizes, kernel_fn fn) {
        register_kernel({name, std::vector<size_t>(sizes), fn});
    }
    registrar(std::string_view name, size_t global_size) { register_global({name, global_size}); }
};

}  // namespace vcuda::soft

// Registration is a static object beside the host kernel:
//   static void vec_add(const vcuda::soft::launch& l) { ... }
//   static vcuda::soft::registrar vec_add_reg("vec_add", {8, 8, 8, 4}, vec_add);
//   static vcuda::soft::registrar table_reg("table", size_t{256});   // a __device__ variable
