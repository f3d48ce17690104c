// The marshalling that generated client stubs (and many hand-written ones) use: scalars and handles in,
// scalars and handles out, sent synchronously or queued. Handles are validated against the mirror before
// anything is sent, so an unknown handle fails at once, as with the real driver.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <array>
#include <cstring>
#include <type_traits>

#include "client/state.hpp"
#include "client/unsupported.hpp"

namespace vcuda::client {

template <class T>
uint64_t to_wire(T v) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "only scalars travel as arguments");
    uint64_t w = 0;
    std::memcpy(&w, &v, sizeof v);
    return w;
}

template <class T>
T from_wire(uint64_t w) {
    T v;
    std::memcpy(&v, &w, sizeof v);
    return v;
}

// True when `h` names a live object of kind `k` (streams also accept NULL, legacy and per-thread;
// functions also accept kernels, which the driver lets callers cast to CUfunction).
bool valid_handle(uint64_t h, handle_kind k);

class plain_call {
public:
    plain_call(op o, const char* name) : op_(o), name_(name) {}

    template <class T>
    void arg(T v) {
        if (n_ < args_.size()) args_[n_++] = to_wire(v);
    }
    template <class H>
    void handle(H h, handle_kind k) {
        uint64_t id = reinterpret_cast<uint64_t>(h);
        if (!valid_handle(id, k) && error_ == CUDA_SUCCESS) error_ = CUDA_ERROR_INVALID_HANDLE;
        if (k == handle_kind::function || k == handle_kind::kernel || k == handle_kind::library) id = state::get().route(id);
        arg(id);
    }

    CUresult send_sync();
    CUresult send_async();

    template <class T>
    T out(size_t i) const {
        return i < reply_.outs.size() ? from_wire<T>(reply_.outs[i]) : T{};
    }
    // An output handle: the mirror learns it (kind, creating context) before the application sees it.
    template <class H>
    H out_handle(size_t i, handle_kind k) {
        uint64_t id = i < reply_.outs.size() ? reply_.outs[i] : 0;
        adopt_handle(id, k);
        return reinterpret_cast<H>(id);
    }
    template <class H>
    void forget(H h, handle_kind) {
        state::get().forget(reinterpret_cast<uint64_t>(h));
    }

    const call_reply& reply() const { return reply_; }

private:
    void adopt_handle(uint64_t id, handle_kind k);
    call_request request();

    op op_;
    const char* name_;
    std::array<uint64_t, 16> args_{};
    size_t n_ = 0;
    CUresult error_ = CUDA_SUCCESS;
    call_reply reply_;
};

}  // namespace vcuda::client
