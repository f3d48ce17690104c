// The linker: link states are session handles (kind link_state). The JIT options given at creation, with the
// server's log buffers the driver writes into until the link is destroyed, live in session::links; every call
// answers them again (values, then the two logs), since the driver writes logs at each add and at completion.
#include "common/log.hpp"
#include "server/call_context.hpp"
#include "server/jit.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

constexpr size_t max_link_name = 4096;

// The creation options of the link state `id`.
CUresult link_job(call_context& cx, uint64_t id, jit_request*& job) {
    std::lock_guard lock(cx.sess.mu);
    job = cx.sess.links.find(id);
    if (!job) return cx.fail(CUDA_ERROR_INVALID_HANDLE, "no such link state");
    return CUDA_SUCCESS;
}

}  // namespace

// The link is 0 when the driver refused it; the option values and logs come back either way.
CUresult handle_link_create(call_context& cx, const link_create_args& a) {
    auto job = std::make_unique<jit_request>();
    std::string why;
    if (CUresult rc = job->parse(a.options, why); rc != CUDA_SUCCESS) return cx.fail(rc, why);
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

// The input's own options carry no log buffers; the answer is the link's creation option values and logs.
CUresult handle_link_add(call_context& cx, const link_add_args& a) {
    jit_request* job = nullptr;
    if (CUresult rc = link_job(cx, a.link_id, job); rc != CUDA_SUCCESS) return rc;
    const unsigned type = a.type;
    auto name_bytes = a.name;
    auto data = a.input;
    if (type >= CU_JIT_NUM_INPUT_TYPES || name_bytes.size() > max_link_name || data.empty())
        return cx.bad_arguments();
    std::string name(reinterpret_cast<const char*>(name_bytes.data()), name_bytes.size());
    jit_request input;
    std::string why;
    if (CUresult rc = input.parse(a.options, why); rc != CUDA_SUCCESS) return cx.fail(rc, why);
    if (!input.info_log.empty() || !input.error_log.empty())
        return cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                       "log buffers per link input are not supported by vcuda (give them to cuLinkCreate)");
    // The driver reads PTX up to its NUL: an input of type PTX must end with one inside the bytes sent.
    if (type == CU_JIT_INPUT_PTX && data.back() != std::byte{0})
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "PTX input without its terminating NUL");
    CUresult rc = cx.drv().cuLinkAddData_v2(a.link, static_cast<CUjitInputType>(type),
                                            const_cast<std::byte*>(data.data()), data.size(), name.c_str(),
                                            input.count(), input.option_array(), input.value_array());
    job->answer(cx);
    return rc;
}

CUresult handle_link_complete(call_context& cx, const link_complete_args& a) {
    jit_request* job = nullptr;
    if (CUresult rc = link_job(cx, a.link_id, job); rc != CUDA_SUCCESS) return rc;
    void* image = nullptr;
    size_t size = 0;
    CUresult rc = cx.drv().cuLinkComplete(a.link, &image, &size);
    job->answer(cx);
    if (rc == CUDA_SUCCESS && image && size) {
        auto* b = static_cast<const std::byte*>(image);
        cx.reply_payload.assign(b, b + size);
    }
    return rc;
}

// The session forgets the link whatever the driver answers.
CUresult handle_link_destroy(call_context& cx, const link_destroy_args& a) {
    jit_request* job = nullptr;
    if (CUresult rc = link_job(cx, a.link_id, job); rc != CUDA_SUCCESS) return rc;
    CUresult rc = cx.drv().cuLinkDestroy(a.link);
    std::lock_guard lock(cx.sess.mu);
    cx.sess.links.erase(a.link_id);
    cx.sess.handles.erase(a.link_id);
    return rc;
}

}  // namespace vcuda::server
