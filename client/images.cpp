#include "client/images.hpp"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstring>

namespace vcuda::client {

namespace {

constexpr uint32_t fatbin_magic = 0xBA55ED50;
constexpr int32_t wrapper_magic = 0x466243B1;

struct fatbin_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t files_size;
};

struct fatbin_wrapper {
    int32_t magic;
    int32_t version;
    const void* data;
    const void* filename_or_fatbins;
};

size_t fatbin_size(const void* p) {
    fatbin_header h;
    std::memcpy(&h, p, sizeof h);
    return h.header_size + h.files_size;
}

size_t elf_size(const void* p) {
    Elf64_Ehdr e;
    std::memcpy(&e, p, sizeof e);
    size_t end = sizeof e;
    end = std::max<size_t>(end, e.e_shoff + size_t{e.e_shnum} * e.e_shentsize);
    end = std::max<size_t>(end, e.e_phoff + size_t{e.e_phnum} * e.e_phentsize);
    auto* base = static_cast<const char*>(p);
    for (unsigned i = 0; i < e.e_shnum; ++i) {
        Elf64_Shdr s;
        std::memcpy(&s, base + e.e_shoff + size_t{i} * e.e_shentsize, sizeof s);
        if (s.sh_type != SHT_NOBITS) end = std::max<size_t>(end, s.sh_offset + s.sh_size);
    }
    for (unsigned i = 0; i < e.e_phnum; ++i) {
        Elf64_Phdr ph;
        std::memcpy(&ph, base + e.e_phoff + size_t{i} * e.e_phentsize, sizeof ph);
        end = std::max<size_t>(end, ph.p_offset + ph.p_filesz);
    }
    return end;
}

bool raw_part(const void* p, std::span<const std::byte>& out) {
    uint32_t magic;
    std::memcpy(&magic, p, sizeof magic);
    auto* b = static_cast<const std::byte*>(p);
    if (magic == fatbin_magic)
        out = {b, fatbin_size(p)};
    else if (std::memcmp(p, ELFMAG, SELFMAG) == 0)
        out = {b, elf_size(p)};
    else
        out = {b, std::strlen(static_cast<const char*>(p)) + 1};  // PTX text
    return true;
}

}  // namespace

size_t image::total() const {
    size_t n = 0;
    for (auto& p : parts) n += p.size();
    return n;
}

uint64_t content_hash(std::span<const std::byte> bytes, uint64_t h) {
    for (auto b : bytes) {
        h ^= static_cast<uint8_t>(b);
        h *= 0x100000001b3ULL;
    }
    return h;
}

bool describe_image(const void* p, image& out) {
    if (!p) return false;
    out = {};
    int32_t magic;
    std::memcpy(&magic, p, sizeof magic);
    std::span<const std::byte> part;
    if (magic == wrapper_magic) {
        fatbin_wrapper w;
        std::memcpy(&w, p, sizeof w);
        if (!w.data) return false;
        raw_part(w.data, part);
        out.parts.push_back(part);
        if (w.version == 2 && w.filename_or_fatbins) {
            out.format = image_format::wrapper_v2;
            for (auto* list = static_cast<const void* const*>(w.filename_or_fatbins); *list; ++list) {
                raw_part(*list, part);
                out.parts.push_back(part);
            }
        } else {
            out.format = image_format::wrapper_v1;
        }
    } else {
        raw_part(p, part);
        out.parts.push_back(part);
    }
    uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<uint64_t>(out.format);
    for (auto& q : out.parts) {
        uint64_t n = q.size();
        h = content_hash({reinterpret_cast<const std::byte*>(&n), sizeof n}, h);
        h = content_hash(q, h);
    }
    out.hash = h;
    return true;
}

CUresult read_image_file(const char* path, std::vector<std::byte>& out) {
    out.clear();
    if (!path) return CUDA_ERROR_INVALID_VALUE;
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_FILE_NOT_FOUND;
    std::byte buf[1 << 16];
    for (ssize_t k; (k = ::read(fd, buf, sizeof buf)) != 0;) {
        if (k < 0) {
            if (errno == EINTR) continue;
            ::close(fd);
            return CUDA_ERROR_FILE_NOT_FOUND;
        }
        out.insert(out.end(), buf, buf + k);
    }
    ::close(fd);
    return CUDA_SUCCESS;
}

}  // namespace vcuda::client
