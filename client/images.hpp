// Sizing of code images passed to the driver as bare pointers (../shared/reference/driver-interface.md §3):
// fatbin = header size + files size; ELF = the end of its tables and contents; PTX = strlen + 1; a fatbin
// wrapper points at a fatbin (v1) or also at a NULL-terminated list of more fatbins (v2, prelinked).
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace vcuda::client {

enum class image_format : uint64_t { raw = 0, wrapper_v1 = 1, wrapper_v2 = 2 };

struct image {
    image_format format = image_format::raw;
    std::vector<std::span<const std::byte>> parts;  // the image itself, or the wrapper's fatbins in order
    uint64_t hash = 0;                              // over every part's bytes and sizes
    size_t total() const;
};

// Returns false when `p` is not an image vcuda can size.
bool describe_image(const void* p, image& out);

// 64-bit FNV-1a, for content-addressed image caching.
// The whole file at `path` (on this machine: the application's paths are the client's), for the calls that
// take an image by file name (cuModuleLoad, cuLibraryLoadFromFile, cuLinkAddFile). CUDA_ERROR_FILE_NOT_FOUND
// when it cannot be read.
CUresult read_image_file(const char* path, std::vector<std::byte>& out);

uint64_t content_hash(std::span<const std::byte> bytes, uint64_t seed = 0xcbf29ce484222325ULL);

}  // namespace vcuda::client
