// The linker: link states are session handles (kind link_state). The JIT options given at creation, with the
// server's log buffers the driver writes into until the link is destroyed, live in session::links; every call
// answers them again (values, then the two logs), since the driver writes logs at each add and at completion.
#include "common/log.hpp"
#include "server/call_context.hpp"
#include "server/jit.hpp"

namespace vcuda::server {

namespace {

constexpr size_t max_link_name = 4096;

// The link state of argument 0 and its creation options.
CUresult link_arg(call_context& cx, CUlinkState& st, jit_request*& job) {
    if (CUresult rc = cx.handle(0, handle_kind::link_state, st); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    job = cx.sess.links.find(cx.arg(0));
    if (!job) return cx.fail(CUDA_ERROR_INVALID_HANDLE, "no such link state");
    return CUDA_SUCCESS;
}

}  // namespace

// blob 0: options -> outs {link or 0, values...}, blobs {info log, error log}
CUresult handle_link_create(call_context& cx) {
    if (!cx.expect_args(0) || cx.blob_count() > 1) return cx.bad_arguments();
    auto job = std::make_unique<jit_request>();
    std::string why;
    if (cx.blob_count() == 1)
        if (CUresult rc = job->parse(cx.blob(0), why); rc != CUDA_SUCCESS) return cx.fail(rc, why);
    auto& d = cx.drv();
    if (!d.cuLinkCreate_v2) return cx.unsupported("cuLinkCreate");
    CUlinkState st = nullptr;
    CUresult rc = d.cuLinkCreate_v2(job->count(), job->option_array(), job->value_array(), &st);
    if (rc != CUDA_SUCCESS) {
        cx.out(uint64_t{0});
        job->answer(cx);
        return rc;
    }
    cx.out_handle(handle_kind::link_state, st);
    job->answer(cx);
    std::lock_guard lock(cx.sess.mu);
    cx.sess.links.add(cx.outs[0], std::move(job));
    return CUDA_SUCCESS;
}

// args {link, input type}, blob 0 name, blob 1 this input's options (no log buffers), payload the input
// -> outs {creation option values...}, blobs {info log, error log}
CUresult handle_link_add(call_context& cx) {
    if (!cx.expect_args(2) || cx.blob_count() != 2) return cx.bad_arguments();
    CUlinkState st;
    jit_request* job = nullptr;
    if (CUresult rc = link_arg(cx, st, job); rc != CUDA_SUCCESS) return rc;
    uint64_t type = cx.arg(1);
    auto name_bytes = cx.blob(0);
    auto data = cx.payload();
    if (type >= CU_JIT_NUM_INPUT_TYPES || name_bytes.size() > max_link_name || data.empty())
        return cx.bad_arguments();
    std::string name(reinterpret_cast<const char*>(name_bytes.data()), name_bytes.size());
    jit_request input;
    std::string why;
    if (CUresult rc = input.parse(cx.blob(1), why); rc != CUDA_SUCCESS) return cx.fail(rc, why);
    if (!input.info_log.empty() || !input.error_log.empty())
        return cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                       "log buffers per link input are not supported by vcuda (give them to cuLinkCreate)");
    // The driver reads PTX up to its NUL: an input of type PTX must end with one inside the bytes sent.
    if (type == CU_JIT_INPUT_PTX && data.back() != std::byte{0})
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "PTX input without its terminating NUL");
    CUresult rc = cx.drv().cuLinkAddData_v2(st, static_cast<CUjitInputType>(type),
                                            const_cast<std::byte*>(data.data()), data.size(), name.c_str(),
                                            input.count(), input.option_array(), input.value_array());
    job->answer(cx);
    return rc;
}

// args {link} -> outs {creation option values...}, blobs {info log, error log}, payload the linked image
CUresult handle_link_complete(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    CUlinkState st;
    jit_request* job = nullptr;
    if (CUresult rc = link_arg(cx, st, job); rc != CUDA_SUCCESS) return rc;
    void* image = nullptr;
    size_t size = 0;
    CUresult rc = cx.drv().cuLinkComplete(st, &image, &size);
    job->answer(cx);
    if (rc == CUDA_SUCCESS && image && size) {
        auto* b = static_cast<const std::byte*>(image);
        cx.reply_payload.assign(b, b + size);
    }
    return rc;
}

// args {link}
CUresult handle_link_destroy(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    CUlinkState st;
    jit_request* job = nullptr;
    if (CUresult rc = link_arg(cx, st, job); rc != CUDA_SUCCESS) return rc;
    CUresult rc = cx.drv().cuLinkDestroy(st);
    std::lock_guard lock(cx.sess.mu);
    cx.sess.links.erase(cx.arg(0));
    cx.sess.handles.erase(cx.arg(0));
    return rc;
}

}  // namespace vcuda::server
