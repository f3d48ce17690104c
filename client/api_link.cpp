// The linker (cuLinkCreate / AddData / AddFile / Complete / Destroy). A link state is a server handle: inputs
// are compiled and linked by the real driver there as they arrive, so errors come at the call that caused
// them, as with the driver. The log buffers named at cuLinkCreate are the caller's; the driver writes its
// logs at every later call, so each add and the completion answer them again. The linked image stays here,
// owned by the link state, until cuLinkDestroy (as the driver keeps it).

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/entry_point.hpp"
#include "client/images.hpp"
#include "client/jit.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"
#include "common/log.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

struct link_record {
    jit_call options;  // the caller's cuLinkCreate options, answered after each call
    std::vector<std::byte> image;
};

std::mutex links_mu;
std::unordered_map<uint64_t, link_record>& links() {
    static auto* m = new std::unordered_map<uint64_t, link_record>;  // never destroyed: used until exit
    return *m;
}

// The record of a link state; its options are answered from `rp` (outs[first...], blobs 0-1).
bool answer_link(uint64_t id, const call_reply& rp, size_t first) {
    std::lock_guard lock(links_mu);
    auto it = links().find(id);
    return it != links().end() && it->second.options.answer(rp, first);
}

bool known_link(uint64_t id) {
    std::lock_guard lock(links_mu);
    return links().count(id) != 0;
}

std::span<const std::byte> text(const char* s) {
    return {reinterpret_cast<const std::byte*>(s), s ? std::strlen(s) : 0};
}

CUresult link_create(unsigned n, CUjit_option* o, void** v, CUlinkState* out) {
    VCUDA_REQUIRE_INIT();
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    link_record rec;
    if (CUresult rc = rec.options.take(n, o, v, "cuLinkCreate"); rc != CUDA_SUCCESS) return rc;
    link_create_call c("cuLinkCreate", rec.options.blob());
    CUresult rc = c.send_sync();
    if (!c.reply().outs.empty()) rec.options.answer(c.reply(), 1);
    if (rc != CUDA_SUCCESS) return rc;
    if (!c.link_id()) return CUDA_ERROR_UNKNOWN;
    CUlinkState link = c.link();
    {
        std::lock_guard lock(links_mu);
        links()[reinterpret_cast<uint64_t>(link)] = std::move(rec);
    }
    *out = link;
    return CUDA_SUCCESS;
}

CUresult link_add(CUlinkState state, CUjitInputType type, const void* data, size_t size, const char* name,
                  unsigned n, CUjit_option* o, void** v) {
    VCUDA_REQUIRE_INIT();
    auto id = reinterpret_cast<uint64_t>(state);
    if (!known_link(id)) return CUDA_ERROR_INVALID_HANDLE;
    if (!data || size == 0) return CUDA_ERROR_INVALID_VALUE;
    jit_call per_input;
    if (CUresult rc = per_input.take(n, o, v, "cuLinkAddData"); rc != CUDA_SUCCESS) return rc;
    link_add_call c("cuLinkAddData", state, static_cast<unsigned>(type), text(name), per_input.blob(),
                    {static_cast<const std::byte*>(data), size});
    CUresult rc = c.send_sync();
    answer_link(id, c.reply(), 0);
    return rc;
}

}  // namespace

VCUDA_API cuLinkCreate(unsigned int n, CUjit_option* options, void** values, CUlinkState* stateOut) noexcept {
    VCUDA_TRACE_HOOK(cuLinkCreate, n, options, values, stateOut);
    return link_create(n, options, values, stateOut);
}

VCUDA_API cuLinkCreate_v2(unsigned int n, CUjit_option* options, void** values,
                          CUlinkState* stateOut) noexcept {
    VCUDA_TRACE_HOOK(cuLinkCreate_v2, n, options, values, stateOut);
    return link_create(n, options, values, stateOut);
}

VCUDA_API cuLinkAddData(CUlinkState state, CUjitInputType type, void* data, size_t size, const char* name,
                        unsigned int n, CUjit_option* options, void** values) noexcept {
    VCUDA_TRACE_HOOK(cuLinkAddData, state, type, data, size, name, n, options, values);
    return link_add(state, type, data, size, name, n, options, values);
}

VCUDA_API cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data, size_t size, const char* name,
                           unsigned int n, CUjit_option* options, void** values) noexcept {
    VCUDA_TRACE_HOOK(cuLinkAddData_v2, state, type, data, size, name, n, options, values);
    return link_add(state, type, data, size, name, n, options, values);
}

namespace {
// A file is read here, where its path means something, and added as data named by its path.
CUresult link_add_file(CUlinkState state, CUjitInputType type, const char* path, unsigned n, CUjit_option* o,
                       void** v) {
    std::vector<std::byte> bytes;
    if (CUresult rc = read_image_file(path, bytes); rc != CUDA_SUCCESS) return rc;
    if (type == CU_JIT_INPUT_PTX)
        bytes.push_back(std::byte{0});  // PTX is text: the driver reads it to its NUL
    if (bytes.empty()) return CUDA_ERROR_INVALID_VALUE;
    return link_add(state, type, bytes.data(), bytes.size(), path, n, o, v);
}
}  // namespace

VCUDA_API cuLinkAddFile(CUlinkState state, CUjitInputType type, const char* path, unsigned int n,
                        CUjit_option* options, void** values) noexcept {
    VCUDA_TRACE_HOOK(cuLinkAddFile, state, type, path, n, options, values);
    return link_add_file(state, type, path, n, options, values);
}

VCUDA_API cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char* path, unsigned int n,
                           CUjit_option* options, void** values) noexcept {
    VCUDA_TRACE_HOOK(cuLinkAddFile_v2, state, type, path, n, options, values);
    return link_add_file(state, type, path, n, options, values);
}

VCUDA_API cuLinkComplete(CUlinkState state, void** cubinOut, size_t* sizeOut) noexcept {
    VCUDA_TRACE_HOOK(cuLinkComplete, state, cubinOut, sizeOut);
    VCUDA_REQUIRE_INIT();
    auto id = reinterpret_cast<uint64_t>(state);
    if (!known_link(id)) return CUDA_ERROR_INVALID_HANDLE;
    if (!cubinOut || !sizeOut) return CUDA_ERROR_INVALID_VALUE;
    link_complete_call c("cuLinkComplete", state);
    CUresult rc = c.send_sync();
    answer_link(id, c.reply(), 0);
    if (rc != CUDA_SUCCESS) return rc;
    auto image = c.image();
    if (image.empty()) return CUDA_ERROR_UNKNOWN;
    std::lock_guard lock(links_mu);
    auto it = links().find(id);
    if (it == links().end()) return CUDA_ERROR_INVALID_HANDLE;  // destroyed by another thread meanwhile
    it->second.image = std::move(image);
    *cubinOut = it->second.image.data();
    *sizeOut = it->second.image.size();
    return CUDA_SUCCESS;
}

VCUDA_API cuLinkDestroy(CUlinkState state) noexcept {
    VCUDA_TRACE_HOOK(cuLinkDestroy, state);
    VCUDA_REQUIRE_INIT();
    auto id = reinterpret_cast<uint64_t>(state);
    if (!known_link(id)) return CUDA_ERROR_INVALID_HANDLE;
    link_destroy_call c("cuLinkDestroy", state);
    CUresult rc = c.send_sync();
    c.forget_destroyed();  // the server forgets the link whatever the driver answers
    std::lock_guard lock(links_mu);
    links().erase(id);
    return rc;
}
