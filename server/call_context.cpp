#include "server/call_context.hpp"

#include <cstdint>

#include <unistd.h>

#include "common/log.hpp"
#include "common/wire.hpp"

namespace vcuda::server {

std::span<const std::byte> call_context::blob(size_t i) const {
    if (i >= blob_count()) return {};
    auto* b = call_.blobs()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (!b || !b->bytes()) return {};
    return {reinterpret_cast<const std::byte*>(b->bytes()->data()), b->bytes()->size()};
}

std::span<const std::byte> call_context::payload() const {
    if (staged_) return {static_cast<const std::byte*>(staged_->data), frame_.header.payload_len};
    return frame_.payload;
}

CUresult call_context::lookup(uint64_t id, handle_kind k, void*& raw, handle_entry* entry) {
    if (k == handle_kind::stream && (id == stream_null || id == stream_legacy || id == stream_per_thread)) {
        raw = reinterpret_cast<void*>(id);
        return CUDA_SUCCESS;
    }
    std::lock_guard lock(sess.mu);
    handle_entry* e =
        sess.handles.find(id, k, k == handle_kind::function ? handle_kind::kernel : handle_kind::none);
    if (!e) {
        detail = std::string("unknown ") + std::string(to_string(k)) + " handle";
        return CUDA_ERROR_INVALID_HANDLE;
    }
    raw = e->raw;
    if (entry) *entry = *e;
    return CUDA_SUCCESS;
}

CUresult call_context::device(size_t i, CUdevice& out) {
    if (sess.real_device(arg(i), out) != CUDA_SUCCESS)
        return fail(CUDA_ERROR_INVALID_DEVICE, "no such device in this session");
    return CUDA_SUCCESS;
}

void call_context::out_handle(handle_kind k, void* raw, uint64_t owner, bool owned,
                              std::shared_ptr<const param_layout> layout) {
    handle_entry e;
    e.kind = k;
    e.raw = raw;
    e.device = device_index() < 0 ? 0 : device_index();
    e.owner = owner;
    e.owned = owned;
    e.layout = std::move(layout);
    e.made_by = call_.op();
    for (size_t i = 0; i < e.made_with.size() && i < arg_count(); ++i) e.made_with[i] = arg(i);
    const bool derived = owned && handle_table::derived_kind(k);
    std::lock_guard lock(sess.mu);
    outs.push_back(derived ? sess.handles.insert_derived(std::move(e)) : sess.handles.insert(std::move(e)));
}

CUresult call_context::device_location(CUmemLocation& loc, size_t& device, bool host_ok) {
    bool host = loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    if (host && host_ok) {
        device = SIZE_MAX;
        return CUDA_SUCCESS;
    }
    if (loc.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return fail(CUDA_ERROR_NOT_SUPPORTED, "only device locations are served");
    if (loc.id < 0 || !sess.allowed(static_cast<size_t>(loc.id)))
        return fail(CUDA_ERROR_INVALID_DEVICE, "no such device in this session");
    device = static_cast<size_t>(loc.id);
    CUdevice real;
    if (CUresult rc = sess.real_device(device, real); rc != CUDA_SUCCESS) return rc;
    loc.id = real;
    return CUDA_SUCCESS;
}

bool box_span(uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height, uint64_t w, uint64_t h,
              uint64_t depth, uint64_t& first, uint64_t& last) {
    uint64_t rows;
    if (pitch < w + x && h > 1) return false;
    if (!mul_add(z, height, y, rows) || !mul_add(rows, pitch, x, first)) return false;
    return mul_add(z + depth - 1, height, y + h - 1, rows) && mul_add(rows, pitch, x + w, last);
}

CUresult call_context::device_box(CUdeviceptr p, uint64_t x, uint64_t y, uint64_t z, uint64_t pitch,
                                  uint64_t height, uint64_t w, uint64_t h, uint64_t depth) {
    uint64_t first, last;
    if (!box_span(x, y, z, pitch, height, w, h, depth, first, last)) return CUDA_ERROR_INVALID_VALUE;
    return device_range(p + first, last - first);
}

size_t call_context::owned_prefix(CUdeviceptr p, size_t n) {
    auto owned = [&](size_t m) { return sess.owns_range(p, m) || sess.owns_host(p, m); };
    if (n == 0 || !owned(1)) return 0;
    size_t lo = 1, hi = n;  // owned(lo) holds; the answer lies in [lo, hi]
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (owned(mid))
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

CUresult call_context::host_box(uintptr_t p, uint64_t x, uint64_t y, uint64_t z, uint64_t pitch,
                                uint64_t height, uint64_t w, uint64_t h, uint64_t depth) {
    uint64_t first, last;
    if (!box_span(x, y, z, pitch, height, w, h, depth, first, last)) return CUDA_ERROR_INVALID_VALUE;
    return sess.owns_host(p + first, last - first)
               ? CUDA_SUCCESS
               : fail(CUDA_ERROR_INVALID_VALUE, "host range not this session's shared host memory");
}

bool memset_span(uint64_t elem, uint64_t width, uint64_t height, uint64_t pitch, uint64_t& row,
                 uint64_t& span) {
    if ((elem != 1 && elem != 2 && elem != 4) || !width || !height) return false;
    return mul_add(width, elem, 0, row) && mul_add(height - 1, pitch, row, span);
}

CUresult call_context::memset_range(CUdeviceptr& dst, uint64_t elem, uint64_t width, uint64_t height,
                                    uint64_t pitch, const std::function<bool()>& recorded) {
    uint64_t row, span;
    if (!memset_span(elem, width, height, pitch, row, span)) return bad_arguments();
    if (height > 1 && pitch < row) return CUDA_ERROR_INVALID_VALUE;
    // Pinned host memory the session shares with its client is the GPU's to set too, as under unified
    // addressing natively (XLA clears small pinned buffers with cuMemsetD32Async).
    if (sess.owns_host(static_cast<uintptr_t>(dst), span)) return CUDA_SUCCESS;
    if (!sess.owns_range(dst, span) && recorded && recorded() && placeholder_range(drv(), dst, span))
        return CUDA_SUCCESS;
    return device_range_now(dst, span);
}

bool placeholder_range(const driver_table& d, CUdeviceptr p, uint64_t n) {
    constexpr uint64_t limit = uint64_t{1} << 32;
    if (n > limit || p > limit - n) return false;
    if (!d.cuPointerGetAttribute) return false;
    CUcontext owner = nullptr;
    // Neither end is memory of any context: device memory, host registrations and VMM mappings all answer.
    return d.cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p) != CUDA_SUCCESS &&
           d.cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p + n - 1) != CUDA_SUCCESS;
}

void call_context::forget_handle(size_t arg_index) {
    std::lock_guard lock(sess.mu);
    sess.handles.erase(arg(arg_index));
}

CUresult call_context::unsupported(const char* name) {
    return fail(CUDA_ERROR_NOT_SUPPORTED, std::string(name) + " is not available in this server's driver");
}

call_context::~call_context() {
    if (reply_fd >= 0) ::close(reply_fd);
}

transport_result<void> send_reply(call_context& cx, CUresult rc, uint64_t payload_len) {
    flatbuffers::FlatBufferBuilder b(256);
    std::vector<flatbuffers::Offset<wire::Blob>> blobs;
    for (auto& bl : cx.out_blobs)
        blobs.push_back(
            wire::CreateBlob(b, b.CreateVector(reinterpret_cast<const uint8_t*>(bl.data()), bl.size())));
    auto outs = b.CreateVector(cx.outs);
    auto bv = b.CreateVector(blobs);
    auto detail = cx.detail.empty() ? 0 : b.CreateString(cx.detail);
    auto& printed = cx.lane.device_output;
    if (std::string held = cx.sess.take_held_output(); !held.empty()) printed.insert(0, held);
    auto output = printed.empty()
                      ? 0
                      : b.CreateVector(reinterpret_cast<const uint8_t*>(printed.data()), printed.size());
    printed.clear();
    b.Finish(wire::CreateReply(b, rc, outs, bv, detail, output));
    auto f = make_frame(frame_kind::reply, b, cx.sequence(), 0, 0, cx.reply_payload);
    if (payload_len > cx.reply_payload.size()) {
        // Header and metadata now, the payload streamed by the caller.
        std::byte header[frame_header_size];
        frame_header h = f.header;
        h.meta_len = static_cast<uint32_t>(f.meta.size());
        h.payload_len = payload_len;
        encode_header(h, header);
        iovec iov[2] = {{header, frame_header_size}, {const_cast<std::byte*>(f.meta.data()), f.meta.size()}};
        return cx.lane.stream->raw().write_all(iov);
    }
    return cx.lane.stream->send(f, never, rc == CUDA_SUCCESS ? cx.reply_fd : -1);
}

}  // namespace vcuda::server
