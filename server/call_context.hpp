// What an op handler sees: the verified call, its session and lane, typed access to arguments (every
// handle looked up in the session's table, every index bounds-checked), and the reply it builds.
// runs on: the lane's thread.
#pragma once

#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/transport.hpp"
#include "server/session.hpp"
#include "server/staging.hpp"
#include "vcuda_generated.h"

namespace vcuda::server {

// The first and one-past-last byte a box of a 2D/3D copy side touches (w bytes x h rows x depth slices from
// (x, y, z) of a pitch x height layout), overflow-checked: false when it overflows or rows overlap.
bool box_span(uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height, uint64_t w, uint64_t h,
              uint64_t depth, uint64_t& first, uint64_t& last);
// A memset of `height` rows of `width` elements of `elem` bytes, `pitch` apart: the bytes of one row and the
// span from the first byte to the last, overflow-checked; false for an element size other than 1, 2 or 4, an
// empty memset or an overflow (a pitch shorter than a row is the caller's to refuse).
bool memset_span(uint64_t elem, uint64_t width, uint64_t height, uint64_t pitch, uint64_t& row,
                 uint64_t& span);
// True for a range below 4 GiB of which the driver knows neither end: an address the application sets before
// the graph it recorded runs (cuDNN records its graphs so).
bool placeholder_range(const driver_table& d, CUdeviceptr p, uint64_t n);

struct lane_state {
    frame_stream* stream = nullptr;
    staging_pool* staging = nullptr;
    // The first failure of a queued call, for the next synchronous call's answer.
    CUresult pending_error = CUDA_SUCCESS;
    std::string pending_detail;
    int current_device = -2;        // the device whose context is current on this thread (-2: unknown)
    std::string device_output;      // device printf written on this lane's thread, sent with the next reply
    unsigned refused_launches = 0;  // launches refused for their parameters (the first few are logged)
    uint64_t epoch = 0;             // the session's epoch its contexts were made current in (session::epoch)
};

class call_context {
  public:
    call_context(session& s, lane_state& l, const wire::Call& call, frame& f, staging_pool::buffer* staged)
        : sess(s), lane(l), call_(call), frame_(f), staged_(staged) {}
    ~call_context();
    call_context(const call_context&) = delete;
    call_context& operator=(const call_context&) = delete;

    session& sess;
    lane_state& lane;

    const driver_table& drv() const { return sess.api(); }
    int device_index() const { return call_.device(); }
    uint32_t op_id() const { return call_.op(); }
    uint64_t sequence() const { return frame_.header.sequence; }
    bool queued() const { return frame_.header.flags & frame_flags::no_reply; }

    // ---- arguments
    size_t arg_count() const { return call_.args() ? call_.args()->size() : 0; }
    bool expect_args(size_t n) const { return arg_count() == n; }
    uint64_t arg(size_t i) const { return call_.args()->Get(static_cast<flatbuffers::uoffset_t>(i)); }
    // The arguments from `first` on (a described op's run of arguments, NAME:KIND...).
    std::span<const uint64_t> args_from(size_t first) const {
        const size_t n = arg_count();
        return first < n ? std::span<const uint64_t>(call_.args()->data() + first, n - first)
                         : std::span<const uint64_t>{};
    }
    template <class T>
    T scalar(size_t i) const {
        uint64_t w = arg(i);
        T v;
        std::memcpy(&v, &w, sizeof v);
        return v;
    }
    size_t blob_count() const { return call_.blobs() ? call_.blobs()->size() : 0; }
    std::span<const std::byte> blob(size_t i) const;

    // A handle argument of kind `k` from this session (streams: also NULL/legacy/per-thread; functions:
    // also kernels, as the driver allows). Anything else answers CUDA_ERROR_INVALID_HANDLE.
    template <class T>
    CUresult handle(size_t i, handle_kind k, T& out) {
        void* raw = nullptr;
        CUresult rc = lookup(arg(i), k, raw);
        out = static_cast<T>(raw);
        return rc;
    }
    CUresult lookup(uint64_t id, handle_kind k, void*& raw, handle_entry* entry = nullptr);
    // A device argument: the session's device index -> the real CUdevice.
    CUresult device(size_t i, CUdevice& out);
    // A memory location as the client sends it (device: the session's device index) turned into the real
    // device; `device` gets the session's index. Host locations pass (device = SIZE_MAX) only where `host_ok`
    // (queries: a NUMA id the application knows is already the server's); other kinds are not served.
    CUresult device_location(CUmemLocation& loc, size_t& device, bool host_ok = false);
    // A device range this session owns, or CUDA_ERROR_INVALID_VALUE: its device memory, or its shared pinned
    // host memory by its device pointer (the same address: kernels and copies reach it so, as XLA's autotuner
    // reads its results back).
    CUresult device_range(CUdeviceptr p, size_t n) {
        return sess.owns_range(p, n) || sess.owns_host(p, n)
                   ? CUDA_SUCCESS
                   : fail(CUDA_ERROR_INVALID_VALUE, "address range not owned by this session");
    }
    // device_range for a copy's device side, where an old address of a global the driver placed elsewhere at
    // a resume or move (module_globals::relocate) becomes `p`'s new value: the application keeps the old one
    // (cudart caches symbol addresses for cudaMemcpyToSymbol). A range the session owns now stays as it is.
    CUresult device_range_now(CUdeviceptr& p, size_t n) {
        if (sess.globals.any_relocated() && !sess.owns_range(p, n))
            if (auto to = sess.globals.relocated(p, n)) p = *to;
        return device_range(p, n);
    }
    // The longest prefix of [p, p+n) that device_range accepts (0: not even its first byte is the session's).
    size_t owned_prefix(CUdeviceptr p, size_t n);
    // The bytes one device side of a 2D/3D copy touches (w bytes x h rows x depth slices from (x, y, z) of a
    // pitch x height layout), checked as one range from the first byte to the last.
    CUresult device_box(CUdeviceptr p, uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height,
                        uint64_t w, uint64_t h, uint64_t depth);
    // The same box in the session's shared pinned host memory, by its server address.
    CUresult host_box(uintptr_t p, uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height,
                      uint64_t w, uint64_t h, uint64_t depth);
    // The bytes a memset of `height` rows of `width` elements of `elem` bytes, `pitch` apart, touches: the
    // session's device memory or its shared pinned host memory. A memset that `recorded()` says goes into a
    // graph (captured, or a memset node) may also name a placeholder: a range below 4 GiB that is no memory
    // the driver knows. cuDNN records its graphs so and sets the real addresses before they run; were one run
    // so, it would fault in this session's own context, as a kernel with a bad pointer does. `dst` as in
    // device_range_now.
    CUresult memset_range(CUdeviceptr& dst, uint64_t elem, uint64_t width, uint64_t height, uint64_t pitch,
                          const std::function<bool()>& recorded = {});

    // ---- payload: the bulk bytes that came with the call (in a staging buffer when one was used)
    std::span<const std::byte> payload() const;
    staging_pool::buffer* staged() const { return staged_; }

    // ---- reply
    template <class T>
    void out(T v) {
        uint64_t w = 0;
        std::memcpy(&w, &v, sizeof v);
        outs.push_back(w);
    }
    void out_handle(handle_kind k, void* raw, uint64_t owner = 0, bool owned = false,
                    std::shared_ptr<const param_layout> layout = nullptr);
    void forget_handle(size_t arg_index);
    void out_blob(std::span<const std::byte> b) { out_blobs.emplace_back(b.begin(), b.end()); }

    CUresult unsupported(const char* name);
    CUresult bad_arguments() { return fail(CUDA_ERROR_INVALID_VALUE, "malformed arguments for this op"); }
    CUresult fail(CUresult rc, std::string why) {
        detail = std::move(why);
        return rc;
    }

    std::vector<uint64_t> outs;
    std::vector<std::vector<std::byte>> out_blobs;
    std::vector<std::byte> reply_payload;
    std::string detail;
    bool replied = false;  // the handler sent its reply itself (streamed payloads)
    int reply_fd = -1;     // a file descriptor to pass with a successful reply (Unix sockets); closed after

  private:
    const wire::Call& call_;
    frame& frame_;
    staging_pool::buffer* staged_;
};

// out = a * b + c, false on overflow.
inline bool mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t& out) {
    uint64_t m;
    return !__builtin_mul_overflow(a, b, &m) && !__builtin_add_overflow(m, c, &out);
}

// Builds and sends a Reply frame for `cx` with `rc`; `payload_len` > payload bytes means the caller streams
// the rest right after (see handlers for copies).
transport_result<void> send_reply(call_context& cx, CUresult rc, uint64_t payload_len = 0);

}  // namespace vcuda::server
