#include "server/jit.hpp"

#include <algorithm>
#include <cstring>

#include "server/call_context.hpp"

namespace vcuda::server {

CUresult jit_request::parse(std::span<const std::byte> blob, std::string& why) {
    options.clear();
    values.clear();
    if (blob.size() % 16 != 0 || blob.size() / 16 > jit::max_options) {
        why = "malformed JIT options";
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t n = blob.size() / 16;
    std::vector<uint64_t> words(2 * n);
    std::memcpy(words.data(), blob.data(), blob.size());
    auto value_of = [&](uint64_t option) -> uint64_t {
        for (size_t i = 0; i < n; ++i)
            if (words[2 * i] == option) return words[2 * i + 1];
        return 0;
    };
    for (size_t i = 0; i < n; ++i) {
        uint64_t o = words[2 * i], v = words[2 * i + 1];
        switch (jit::role_of(o)) {
            case jit::role::refused:
                why = "JIT option " + std::to_string(o) +
                      " (it names arrays in the caller's memory) is not supported by vcuda";
                options.clear();
                values.clear();
                return CUDA_ERROR_NOT_SUPPORTED;
            case jit::role::log_buffer: {
                auto& buf = o == CU_JIT_INFO_LOG_BUFFER ? info_log : error_log;
                buf.assign(std::min<uint64_t>(value_of(jit::size_option_of(o)), jit::max_log), '\0');
                v = reinterpret_cast<uintptr_t>(buf.empty() ? nullptr : buf.data());
                break;
            }
            case jit::role::value:
                if (o == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES || o == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
                    v = std::min<uint64_t>(v, jit::max_log);  // no more than the buffer the server made
                break;
        }
        options.push_back(static_cast<CUjit_option>(o));
        values.push_back(reinterpret_cast<void*>(static_cast<uintptr_t>(v)));
    }
    return CUDA_SUCCESS;
}

void jit_request::answer(call_context& cx) const {
    for (size_t i = 0; i < options.size(); ++i)
        cx.out(jit::role_of(options[i]) == jit::role::log_buffer ? uint64_t{0}
                                                                 : reinterpret_cast<uintptr_t>(values[i]));
    for (const auto* log : {&info_log, &error_log}) {
        size_t len = log->empty() ? 0 : strnlen(log->data(), log->size());
        cx.out_blob({reinterpret_cast<const std::byte*>(log->data()), len});
    }
}

namespace {
struct fatbin_wrapper {
    int32_t magic;
    int32_t version;
    const void* data;
    const void* filename_or_fatbins;
};
}  // namespace

CUresult load_image(const driver_table& d, bool library, uint64_t format,
                    const std::vector<std::vector<uint64_t>>& parts, jit_request& jit, void*& out) {
    fatbin_wrapper wrapper{0x466243B1, static_cast<int32_t>(format), parts[0].data(), nullptr};
    std::vector<const void*> extra;
    const void* image = parts[0].data();
    if (format != 0) {
        if (format == 2) {
            for (size_t i = 1; i < parts.size(); ++i) extra.push_back(parts[i].data());
            extra.push_back(nullptr);
            wrapper.filename_or_fatbins = extra.data();
        }
        image = &wrapper;
    }
    if (!library) {
        if (!d.cuModuleLoadDataEx) return CUDA_ERROR_NOT_SUPPORTED;
        CUmodule m = nullptr;
        CUresult rc = d.cuModuleLoadDataEx(&m, image, jit.count(), jit.option_array(), jit.value_array());
        out = m;
        return rc;
    }
    if (!d.cuLibraryLoadData) return CUDA_ERROR_NOT_SUPPORTED;
    CUlibrary l = nullptr;
    CUresult rc = d.cuLibraryLoadData(&l, image, jit.option_array(), jit.value_array(), jit.count(), nullptr,
                                      nullptr, 0);
    out = l;
    return rc;
}

}  // namespace vcuda::server
