// The marshalling that generated client stubs (and many hand-written ones) use: scalars and handles in,
// scalars and handles out, sent synchronously or queued. Handles are validated against the mirror before
// anything is sent, so an unknown handle fails at once, as with the real driver.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <array>
#include <cstring>
#include <span>
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

// Handles shared with other processes through IPC (events exported or opened): calls on them that are
// otherwise queued are sent synchronously (spec annotation shared_sync).
bool ipc_shared(uint64_t handle);
void mark_ipc_shared(uint64_t handle);

// Drops every answer of the reply cache (send_cached): called by whatever can change them — `uncaches` calls,
// a context reset or destroyed.
void drop_cached_replies();

class plain_call {
  public:
    // `name`: the entry point's, which tells the call site's reader what is called; nothing keeps it.
    plain_call(op o, const char* /*name*/) : op_(o) {}

    // More than a call holds (16 arguments, 4 blobs) makes the call fail with CUDA_ERROR_INVALID_VALUE, never
    // go out cut short.
    template <class T>
    void arg(T v) {
        if (n_ < args_.size())
            args_[n_++] = to_wire(v);
        else if (error_ == CUDA_SUCCESS)
            error_ = CUDA_ERROR_INVALID_VALUE;
    }
    // A device the application names by its ordinal: the server knows it by the index its session gave it
    // (server_device::server_index; not the ordinal when the session's GPU is not the server's first, or
    // CUDA_VISIBLE_DEVICES reorders). An ordinal this process does not have is CUDA_ERROR_INVALID_DEVICE. The
    // call goes to the session serving the device, which is not the current context's when the application's
    // GPUs are served by several (a lease of GPUs on several servers).
    void device(CUdevice d);
    // The call named devices of two sessions (different servers, which know nothing of each other's).
    bool devices_of_two_sessions() const { return two_sessions_; }
    template <class H>
    void handle(H h, handle_kind k) {
        uint64_t id = reinterpret_cast<uint64_t>(h);
        if (!valid_handle(id, k) && error_ == CUDA_SUCCESS) error_ = CUDA_ERROR_INVALID_HANDLE;
        if (k == handle_kind::function || k == handle_kind::kernel) about(id);
        if (k == handle_kind::function || k == handle_kind::kernel || k == handle_kind::library)
            id = state::get().route(id);
        arg(id);
    }
    // The call is about this function or kernel (handle() notes it itself): its cached answers are kept per
    // state of the kernel's settable attributes, so that setting them changes which answers apply.
    void about(uint64_t function_or_kernel);

    // A byte block that travels with the call, after those given before (at most four; the caller keeps them
    // alive until the call is sent).
    void blob(std::span<const std::byte> b) {
        if (n_blobs_ < blobs_.size())
            blobs_[n_blobs_++] = b;
        else if (error_ == CUDA_SUCCESS)
            error_ = CUDA_ERROR_INVALID_VALUE;
    }
    // The call's bulk bytes (the frame's payload; the caller keeps them alive until the call is sent).
    void payload(std::span<const std::byte> p) { payload_ = p; }

    CUresult send_sync();
    CUresult send_async();
    // send_sync for a `cached` query: a repeat of a successful call (same op, device, arguments) is answered
    // from the reply cache without a round trip.
    CUresult send_cached();
    // For an `uncaches` setter whose argument `value_index` is the value set. The same value already in
    // effect: nothing is sent. A kernel attribute value accepted before (valid, so it cannot fail now):
    // queued. Otherwise sent synchronously. A setter about a function or kernel changes the state its answers
    // are kept under; a context-wide one drops every cached answer.
    CUresult send_uncaching(size_t value_index);

    // The reply cache as a record of facts: whether this call (op, device, arguments) is known to succeed,
    // and noting that it did. Dropped like the cached answers.
    bool known_to_succeed() const;
    void note_success() const;

    template <class T>
    T out(size_t i) const {
        return i < reply_.outs.size() ? from_wire<T>(reply_.outs[i]) : T{};
    }
    // An output handle: the mirror learns it (kind, creating context, owner) before the application sees it.
    template <class H>
    H out_handle(size_t i, handle_kind k, uint64_t owner = 0) {
        uint64_t id = i < reply_.outs.size() ? reply_.outs[i] : 0;
        adopt_handle(id, k, owner);
        return reinterpret_cast<H>(id);
    }
    template <class H>
    void forget(H h, handle_kind) {
        state::get().forget(reinterpret_cast<uint64_t>(h));
    }

    // The arguments as they travel (the journal keeps them: client/journal.hpp).
    std::span<const uint64_t> wire_args() const { return {args_.data(), n_}; }
    std::span<const std::byte> out_blob(size_t i) const {
        return i < reply_.blobs.size() ? std::span<const std::byte>(reply_.blobs[i])
                                       : std::span<const std::byte>{};
    }
    const call_reply& reply() const { return reply_; }
    // The reply's payload, moved out.
    std::vector<std::byte> take_payload() { return std::move(reply_.payload); }

  private:
    std::string cache_key()
        const;  // op, device, arguments, blobs, payload and the attribute state of about()'s kernel
    void adopt_handle(uint64_t id, handle_kind k, uint64_t owner);
    call_request request();
    int call_device()
        const;  // the client ordinal the call is about: a device() of another session, else current
    session& target() const;  // the session it goes to

    op op_;
    std::array<uint64_t, 16> args_{};
    size_t n_ = 0;
    std::array<std::span<const std::byte>, 4> blobs_{};
    size_t n_blobs_ = 0;
    std::span<const std::byte> payload_;
    CUresult error_ = CUDA_SUCCESS;
    call_reply reply_;
    uint64_t about_ = 0;  // the kernel (or module function) whose attribute state keys the answer; 0: none
    session* named_ = nullptr;  // the session of the first device() named; null: none named
    int routed_ordinal_ = -1;   // that device, when its session is not the current context's
    bool two_sessions_ = false;
};

}  // namespace vcuda::client
