// Stream queries answered from the mirror, stream capture (mirrored: which streams capture, each thread's
// capture mode), and occupancy helpers built on the forwarded per-block-size query.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "client/copy_paths.hpp"
#include "client/deferred_copies.hpp"
#include "client/entry_point.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {
bool stream_info(CUstream s, handle_info& info) {
    uint64_t id = reinterpret_cast<uint64_t>(s);
    if (id == stream_null || id == stream_legacy || id == stream_per_thread) {
        info.ctx = current_context();
        info.device = current_device();
        return info.ctx != 0;
    }
    return state::get().lookup(id, info) && info.kind == handle_kind::stream;
}

// The green context whose CUcontext the stream was made in (under it, or by cuGreenCtxStreamCreate), else 0.
uint64_t green_of(const handle_info& stream) {
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    const context_info* c = st.find_context(stream.ctx);
    return c ? c->green : 0;
}
}  // namespace

VCUDA_API cuStreamGetCtx(CUstream s, CUcontext* pctx) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetCtx, s, pctx);
    VCUDA_REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!stream_info(s, info)) return CUDA_ERROR_INVALID_HANDLE;
    *pctx = reinterpret_cast<CUcontext>(info.ctx);
    return CUDA_SUCCESS;
}

// A stream of a green context answers the green context and, as the driver does, the device's primary
// context; any other its context and NULL.
VCUDA_API cuStreamGetCtx_v2(CUstream s, CUcontext* pctx, CUgreenCtx* pgreen) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetCtx_v2, s, pctx, pgreen);
    VCUDA_REQUIRE_INIT();
    if (!pctx || !pgreen) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!stream_info(s, info)) return CUDA_ERROR_INVALID_HANDLE;
    const uint64_t green = green_of(info);
    *pctx = reinterpret_cast<CUcontext>(green ? state::get().primary_context(info.device) : info.ctx);
    *pgreen = reinterpret_cast<CUgreenCtx>(green);
    return CUDA_SUCCESS;
}

VCUDA_API cuStreamGetGreenCtx(CUstream s, CUgreenCtx* phCtx) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetGreenCtx, s, phCtx);
    VCUDA_REQUIRE_INIT();
    if (!phCtx) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!stream_info(s, info)) return CUDA_ERROR_INVALID_HANDLE;
    *phCtx = reinterpret_cast<CUgreenCtx>(green_of(info));
    return CUDA_SUCCESS;
}

VCUDA_API cuStreamGetDevice(CUstream s, CUdevice* dev) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetDevice, s, dev);
    VCUDA_REQUIRE_INIT();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!stream_info(s, info)) return CUDA_ERROR_INVALID_HANDLE;
    *dev = info.device;
    return CUDA_SUCCESS;
}

namespace {
// A wait for event `event_id` of another session, made on the host: that session synchronizes the event.
CUresult wait_on_host(const handle_info& event, uint64_t event_id) {
    const server_device& where = state::get().device(event.device);
    lane* l = where.owner->this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    call_request rq;
    rq.operation = op::cuEventSynchronize;
    rq.device = where.server_index;
    rq.args = {&event_id, 1};
    call_reply rp;
    const auto rc = static_cast<CUresult>(l->call(rq, rp));
    if (rc == CUDA_SUCCESS) settle_finished();  // the event's work is done: copies it covers land
    return rc;
}
}  // namespace

// A stream waits for an event. The application's GPUs may be served by several sessions (a lease of GPUs on
// several servers, or of several GPUs of one: one session each), and a session's server knows only its own
// events: a wait on an event of another session is made on the host instead — that session synchronizes the
// event, then the call returns — which orders the stream's later work after the event's as the driver would,
// with the calling thread waiting meanwhile. PyTorch makes such waits for every copy between two GPUs.
VCUDA_API cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuStreamWaitEvent, s, e, flags);
    VCUDA_REQUIRE_INIT();
    auto& st = state::get();
    handle_info stream, event;
    const uint64_t event_id = reinterpret_cast<uint64_t>(e);
    if (st.session_count() > 1 && stream_info(s, stream) && st.lookup(event_id, event) &&
        event.kind == handle_kind::event && stream.device >= 0 && stream.device < st.device_count() &&
        event.device >= 0 && event.device < st.device_count() &&
        st.device(stream.device).owner != st.device(event.device).owner) {
        if (stream_captures(s))  // a graph cannot wait on another session's work
            return static_cast<CUresult>(
                refused("a capturing stream waiting on an event of another vcuda server (another session)",
                        CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"));
        return wait_on_host(event, event_id);
    }
    stream_wait_event_call c("cuStreamWaitEvent", s, e, flags);
    return c.send_async();
}

// cuCtxRecordEvent and cuCtxWaitEvent (protocol/spec/driver.spec, ctx_event): the event recorded must be the
// context's own, as natively (`own_event`); a wait goes to the context's device, or is made on the host when
// the event is of another session. A green context's (its CUcontext's, or cuGreenCtxRecordEvent's and
// cuGreenCtxWaitEvent's) names it, and the server runs it there.
namespace {
CUresult ctx_event(CUcontext ctx, CUevent e, bool record, bool own_event = true) {
    VCUDA_REQUIRE_INIT();
    auto& st = state::get();
    int device = -1;
    uint64_t green = 0;
    {
        std::shared_lock lock(st.mu);
        auto* c = ctx ? st.find_context(reinterpret_cast<uint64_t>(ctx)) : nullptr;
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        device = c->device;
        green = c->green;
    }
    handle_info event;
    if (!st.lookup(reinterpret_cast<uint64_t>(e), event) || event.kind != handle_kind::event)
        return CUDA_ERROR_INVALID_HANDLE;
    if (record && own_event && event.ctx != reinterpret_cast<uint64_t>(ctx)) return CUDA_ERROR_INVALID_HANDLE;
    if (!record && st.session_count() > 1 && st.device(device).owner != st.device(event.device).owner) {
        return wait_on_host(event, reinterpret_cast<uint64_t>(e));
    }
    ctx_event_call c(record ? "cuCtxRecordEvent" : "cuCtxWaitEvent", record ? 0u : 1u, e, device,
                     green ? std::optional(reinterpret_cast<CUgreenCtx>(green)) : std::nullopt);
    return c.send_async();
}

// The mirror context that stands for green context `g` (cuCtxFromGreenCtx's), or nullptr when g is none.
CUcontext green_ctx(CUgreenCtx g) {
    handle_info info;
    const auto id = reinterpret_cast<uint64_t>(g);
    if (!state::get().lookup(id, info) || info.kind != handle_kind::green_ctx) return nullptr;
    return reinterpret_cast<CUcontext>(state::get().green_context(id, info.device));
}

// cuGreenCtxRecordEvent and cuGreenCtxWaitEvent: as their context's, the event any of the session's.
CUresult green_ctx_event(CUgreenCtx g, CUevent e, bool record) {
    VCUDA_REQUIRE_INIT();
    CUcontext ctx = green_ctx(g);
    return ctx ? ctx_event(ctx, e, record, false) : CUDA_ERROR_INVALID_HANDLE;
}
}  // namespace

VCUDA_API cuCtxRecordEvent(CUcontext ctx, CUevent e) noexcept {
    VCUDA_TRACE_HOOK(cuCtxRecordEvent, ctx, e);
    return ctx_event(ctx, e, true);
}

VCUDA_API cuCtxWaitEvent(CUcontext ctx, CUevent e) noexcept {
    VCUDA_TRACE_HOOK(cuCtxWaitEvent, ctx, e);
    return ctx_event(ctx, e, false);
}

VCUDA_API cuGreenCtxRecordEvent(CUgreenCtx hCtx, CUevent hEvent) noexcept {
    VCUDA_TRACE_HOOK(cuGreenCtxRecordEvent, hCtx, hEvent);
    return green_ctx_event(hCtx, hEvent, true);
}

VCUDA_API cuGreenCtxWaitEvent(CUgreenCtx hCtx, CUevent hEvent) noexcept {
    VCUDA_TRACE_HOOK(cuGreenCtxWaitEvent, hCtx, hEvent);
    return green_ctx_event(hCtx, hEvent, false);
}

// ---------------------------------------------------------------- stream capture
// Capture happens on the server: the calls a capturing thread makes reach its lane in order and the server's
// driver records them. The client mirrors which streams capture, from cuStreamBeginCapture to
// cuStreamEndCapture, and each thread's capture mode, because PyTorch asks about both all the time
// (cuThreadExchangeStreamCaptureMode about a thousand times a step, cuStreamIsCapturing before many
// allocations): those answers need no round trip. What the mirror does not see: a capture the server's driver
// invalidated (it still reads ACTIVE until cuStreamEndCapture reports the failure) and the capture's current
// dependency nodes (reported as none).

namespace {

// One capture sequence, as the server reported it at cuStreamBeginCapture*.
struct capture_sequence {
    uint64_t id = 0;  // the driver's capture id
    uint64_t graph =
        0;  // the graph it captures into: a session handle, the application's after cuStreamEndCapture
    uint64_t origin = 0;    // the key of the stream it began on
    bool existing = false;  // cuStreamBeginCaptureToGraph: the graph was the application's all along
};

// Streams that capture: the ones a capture began on, and ones the server said joined a capture (a stream
// joins by waiting on an event recorded in a capturing stream) until that capture ends. locks: mu guards
// streams; `sequences` is also read without it, as the fast path of every query.
struct capture_mirror {
    std::mutex mu;
    std::unordered_map<uint64_t, std::shared_ptr<const capture_sequence>>
        streams;                    // stream key -> its capture
    std::atomic<int> sequences{0};  // captures under way in this process
};

capture_mirror& captures() {
    static auto* m =
        new capture_mirror();  // never destroyed: atexit handlers of the application may still query
    return *m;
}

// The per-thread default stream is another stream on every thread: its key is this thread's.
thread_local char per_thread_stream_key;
uint64_t stream_key(CUstream s) {
    uint64_t id = reinterpret_cast<uint64_t>(s);
    return id == stream_per_thread ? reinterpret_cast<uint64_t>(&per_thread_stream_key) : id;
}

std::shared_ptr<const capture_sequence> sequence_of(uint64_t key) {
    auto& m = captures();
    std::lock_guard lock(m.mu);
    auto it = m.streams.find(key);
    return it == m.streams.end() ? nullptr : it->second;
}

// Drops `seq` and every stream that joined it. Caller holds captures().mu.
void end_sequence(const capture_sequence* seq) {
    auto& m = captures();
    if (std::erase_if(m.streams, [&](auto& kv) { return kv.second.get() == seq; }) > 0) --m.sequences;
}

// The calling thread's capture mode, and per session the mode its lane's server thread was last given.
thread_local CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
struct lane_capture_mode {
    const session* where;
    CUstreamCaptureMode mode;
};
thread_local std::vector<lane_capture_mode> lane_modes;

CUstreamCaptureMode& lane_mode(const session& s) {
    for (auto& m : lane_modes)
        if (m.where == &s) return m.mode;
    lane_modes.push_back({&s, CU_STREAM_CAPTURE_MODE_GLOBAL});
    return lane_modes.back().mode;
}

// The thread's mode matters to the server's driver only while a capture is under way (it decides which calls
// are legal then), so it is sent, queued, only then; outside captures a lane is only ever brought back to the
// default. A thread that left its mode away from the default before a capture began and makes no exchange
// during it keeps the default on the server.
void sync_lane_mode() {
    if (captures().sequences.load() == 0) {
        // The common case, cheaply: no capture, and no lane to bring back to the default.
        if (thread_capture_mode != CU_STREAM_CAPTURE_MODE_GLOBAL) return;
        if (std::all_of(lane_modes.begin(), lane_modes.end(),
                        [](const lane_capture_mode& m) { return m.mode == CU_STREAM_CAPTURE_MODE_GLOBAL; }))
            return;
    }
    auto& st = state::get();
    if (!st.initialized()) return;
    CUstreamCaptureMode& sent = lane_mode(st.remote());
    if (sent == thread_capture_mode) return;
    capture_mode_call c("cuThreadExchangeStreamCaptureMode", static_cast<unsigned>(thread_capture_mode));
    if (c.send_async() == CUDA_SUCCESS) sent = thread_capture_mode;
}

// The capture status of stream `s` (already checked) and its capture when known. With no capture under way,
// or for a stream the mirror knows, the answer is immediate. Otherwise the server is asked: the stream may
// have joined a capture, and the legacy stream answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking
// stream captures.
CUresult capture_status(CUstream s, CUstreamCaptureStatus& status, uint64_t& id,
                        std::shared_ptr<const capture_sequence>& seq) {
    auto& m = captures();
    status = CU_STREAM_CAPTURE_STATUS_NONE;
    id = 0;
    seq = nullptr;
    if (m.sequences.load() == 0) return CUDA_SUCCESS;
    uint64_t key = stream_key(s);
    if ((seq = sequence_of(key))) {
        status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        id = seq->id;
        return CUDA_SUCCESS;
    }
    capture_status_call c("cuStreamIsCapturing", s);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    status = static_cast<CUstreamCaptureStatus>(c.status());
    id = c.id();
    if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_SUCCESS;
    std::lock_guard lock(m.mu);
    for (auto& [k, q] : m.streams) {
        if (q->id == id) {
            seq = q;
            m.streams[key] = q;  // joined: remembered until the capture ends
            break;
        }
    }
    return CUDA_SUCCESS;
}

}  // namespace

namespace vcuda::client {

// The nodes `s`'s next captured work follows, in the capture's graph `graph` (client/api_graph.cpp).
CUresult capture_dependencies(CUstream s, uint64_t graph, std::vector<CUgraphNode>& nodes,
                              std::vector<CUgraphEdgeData>& edges);

// Also cuStreamBeginCaptureToGraph's (api_graph.cpp): `into` the application's graph after `deps`.
CUresult begin_capture(CUstream s, CUstreamCaptureMode mode, const char* name, CUgraph into,
                       std::span<const std::byte> deps, std::span<const std::byte> edges) {
    VCUDA_REQUIRE_INIT();
    if (static_cast<unsigned>(mode) > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    // The server gives its thread the thread's capture mode first.
    const auto thread_mode = static_cast<unsigned>(thread_capture_mode);
    uint64_t id = 0, graph = reinterpret_cast<uint64_t>(into);
    if (into) {
        begin_capture_to_graph_call c(name, s, into, static_cast<unsigned>(mode), thread_mode, deps, edges);
        if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
        id = c.capture_id();
    } else {
        begin_capture_call c(name, s, static_cast<unsigned>(mode), thread_mode);
        if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
        id = c.capture_id();
        graph = reinterpret_cast<uint64_t>(c.out_handle<CUgraph>(1, handle_kind::graph));
    }
    lane_mode(state::get().remote()) = thread_capture_mode;
    auto seq = std::make_shared<capture_sequence>();
    seq->id = id;
    seq->graph = graph;
    seq->existing = into != nullptr;
    seq->origin = stream_key(s);
    auto& m = captures();
    std::lock_guard lock(m.mu);
    if (auto it = m.streams.find(seq->origin); it != m.streams.end())
        end_sequence(it->second.get());  // stale
    m.streams[seq->origin] = std::move(seq);
    ++m.sequences;
    return CUDA_SUCCESS;
}

}  // namespace vcuda::client

namespace {

CUresult capture_info(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id_out, CUgraph* graph_out,
                      const CUgraphNode** dependencies_out, const CUgraphEdgeData** edges_out,
                      size_t* count_out) {
    VCUDA_REQUIRE_INIT();
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!stream_info(s, info)) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t id = 0;
    std::shared_ptr<const capture_sequence> seq;
    if (CUresult rc = capture_status(s, *status, id, seq); rc != CUDA_SUCCESS) return rc;
    bool active = *status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (id_out) *id_out = active ? id : 0;
    if (graph_out) *graph_out = active && seq ? reinterpret_cast<CUgraph>(seq->graph) : nullptr;
    if (dependencies_out) *dependencies_out = nullptr;
    if (edges_out) *edges_out = nullptr;
    if (count_out) *count_out = 0;
    if (!active || !seq || (!dependencies_out && !edges_out && !count_out)) return CUDA_SUCCESS;
    // The nodes the next captured work follows: asked of the server, kept per thread and stream until the
    // next such question (the driver's arrays are valid until the stream's next capture call).
    thread_local std::unordered_map<uint64_t,
                                    std::pair<std::vector<CUgraphNode>, std::vector<CUgraphEdgeData>>>
        asked;
    auto& [nodes, edges] = asked[stream_key(s)];
    if (CUresult rc = capture_dependencies(s, seq->graph, nodes, edges); rc != CUDA_SUCCESS) return rc;
    if (dependencies_out) *dependencies_out = nodes.empty() ? nullptr : nodes.data();
    if (edges_out) *edges_out = edges.empty() ? nullptr : edges.data();
    if (count_out) *count_out = nodes.size();
    return CUDA_SUCCESS;
}

}  // namespace

bool vcuda::client::capture_under_way() { return captures().sequences.load() != 0; }

bool vcuda::client::stream_captures(CUstream s) {
    CUstreamCaptureStatus status{};
    uint64_t id = 0;
    std::shared_ptr<const capture_sequence> seq;
    return capture_status(s, status, id, seq) == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

VCUDA_API cuStreamBeginCapture(CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuStreamBeginCapture, s);
    return begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, "cuStreamBeginCapture", nullptr, {}, {});
}

VCUDA_API cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) noexcept {
    VCUDA_TRACE_HOOK(cuStreamBeginCapture_v2, s, mode);
    return begin_capture(s, mode, "cuStreamBeginCapture_v2", nullptr, {}, {});
}

VCUDA_API cuStreamEndCapture(CUstream s, CUgraph* graph) noexcept {
    VCUDA_TRACE_HOOK(cuStreamEndCapture, s, graph);
    VCUDA_REQUIRE_INIT();
    uint64_t key = stream_key(s);
    auto seq = sequence_of(key);
    // A capture into the application's graph need not name it again (graphConditionalNodes passes NULL).
    if (!graph && !(seq && seq->existing)) return CUDA_ERROR_INVALID_VALUE;
    end_capture_call c("cuStreamEndCapture", s, seq ? seq->graph : uint64_t{0});
    CUresult rc = c.send_sync();
    // The server says whether the stream still captures after a failure (wrong thread, say); without its word
    // (an earlier queued call's error took the reply) the capture is taken as over, as most failures end it.
    bool ended = rc == CUDA_SUCCESS || c.reply().outs.size() < 2 || c.capturing() == 0;
    uint64_t result = rc == CUDA_SUCCESS ? c.graph() : 0;
    if (seq && ended) {
        if (seq->graph != result && !seq->existing)
            state::get().forget(seq->graph);  // the driver destroyed it
        auto& m = captures();
        std::lock_guard lock(m.mu);
        if (seq->origin == key)
            end_sequence(seq.get());
        else
            m.streams.erase(key);
    }
    CUgraph captured = rc == CUDA_SUCCESS ? c.out_handle<CUgraph>(0, handle_kind::graph) : nullptr;
    if (graph) *graph = captured;
    return rc;
}

VCUDA_API cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) noexcept {
    VCUDA_TRACE_HOOK(cuStreamIsCapturing, s, status);
    return capture_info(s, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

VCUDA_API cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetCaptureInfo, s, status, id);
    return capture_info(s, status, id, nullptr, nullptr, nullptr, nullptr);
}

VCUDA_API cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                    const CUgraphNode** dependencies, size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetCaptureInfo_v2, s, status, id, graph, dependencies, count);
    return capture_info(s, status, id, graph, dependencies, nullptr, count);
}

VCUDA_API cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                    const CUgraphNode** dependencies, const CUgraphEdgeData** edges,
                                    size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetCaptureInfo_v3, s, status, id, graph, dependencies, edges, count);
    return capture_info(s, status, id, graph, dependencies, edges, count);
}

VCUDA_API cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) noexcept {
    VCUDA_TRACE_HOOK(cuThreadExchangeStreamCaptureMode, mode);
    if (!mode || static_cast<unsigned>(*mode) > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    std::swap(thread_capture_mode, *mode);
    sync_lane_mode();
    return CUDA_SUCCESS;
}

namespace {
CUresult max_potential_block_size(int* min_grid, int* block_size, CUfunction f, CUoccupancyB2DSize smem_of,
                                  size_t smem, int limit, unsigned flags) {
    VCUDA_REQUIRE_INIT();
    if (!min_grid || !block_size) return CUDA_ERROR_INVALID_VALUE;
    int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    auto& st = state::get();
    int max_threads = 0;
    if (CUresult rc = cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f);
        rc != CUDA_SUCCESS)
        return rc;
    int warp = st.attribute(device, CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    int sms = st.attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    if (limit > 0 && limit < max_threads) max_threads = limit;
    int best_threads = 0, best_block = 0;
    for (int b = max_threads - max_threads % warp; b > 0; b -= warp) {
        size_t s = smem_of ? smem_of(b) : smem;
        int blocks = 0;
        if (CUresult rc = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, b, s, flags);
            rc != CUDA_SUCCESS)
            return rc;
        if (blocks * b > best_threads) {
            best_threads = blocks * b;
            best_block = b;
        }
    }
    *block_size = best_block;
    *min_grid = best_block ? (best_threads / best_block) * sms : 0;
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_API cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block, CUfunction f,
                                           CUoccupancyB2DSize smem_of, size_t smem, int limit) noexcept {
    VCUDA_TRACE_HOOK(cuOccupancyMaxPotentialBlockSize, min_grid, block, f, smem_of, smem, limit);
    return max_potential_block_size(min_grid, block, f, smem_of, smem, limit, 0);
}

VCUDA_API cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block, CUfunction f,
                                                    CUoccupancyB2DSize smem_of, size_t smem, int limit,
                                                    unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuOccupancyMaxPotentialBlockSizeWithFlags, min_grid, block, f, smem_of, smem, limit,
                     flags);
    return max_potential_block_size(min_grid, block, f, smem_of, smem, limit, flags);
}

// ---------------------------------------------------------------- stream memory operations

namespace {
// Flags are checked here so that a bad one fails at the call; the address on the server. An address the
// mirror knows as this process's device memory is queued like any stream work, any other waits for the
// server's verdict. `legacy`: the entry points without _v2 (binaries built before CUDA 12), which still take
// CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER; the _v2 ones refuse it (as the real driver does).
constexpr uint64_t memop_legacy = 4;
CUresult stream_memop(CUstream stream, CUdeviceptr addr, uint64_t value, unsigned flags, uint64_t kind,
                      const char* name) {
    VCUDA_REQUIRE_INIT();
    const bool legacy = kind & memop_legacy;
    const bool wait = (kind & 3) == 1 || (kind & 3) == 3;
    const size_t width = (kind & 3) < 2 ? 4 : 8;
    const unsigned write_flags = legacy ? unsigned(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) : 0u;
    if (wait ? (flags & ~unsigned(CU_STREAM_WAIT_VALUE_FLUSH)) > CU_STREAM_WAIT_VALUE_NOR
             : (flags & ~write_flags) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (addr % width) return CUDA_ERROR_INVALID_VALUE;
    stream_memop_call c(name, stream, static_cast<unsigned>(kind), addr, value, flags);
    device_allocation a;
    return state::get().find_allocation(addr, width, a) ? c.send_async() : c.send_sync();
}
}  // namespace

// Each operation's _v2 entry point (what cuda.h names since CUDA 12) and its legacy one.
#define VCUDA_STREAM_MEMOP(name, value_type, kind)                                                          \
    VCUDA_API name##_v2(CUstream stream, CUdeviceptr addr, value_type value, unsigned int flags) noexcept { \
        VCUDA_TRACE_HOOK(name##_v2, stream, addr, value, flags);                                            \
        return stream_memop(stream, addr, value, flags, kind, #name);                                       \
    }                                                                                                       \
    VCUDA_API name(CUstream stream, CUdeviceptr addr, value_type value, unsigned int flags) noexcept {      \
        VCUDA_TRACE_HOOK(name, stream, addr, value, flags);                                                 \
        return stream_memop(stream, addr, value, flags, (kind) | memop_legacy, #name);                      \
    }
VCUDA_STREAM_MEMOP(cuStreamWriteValue32, cuuint32_t, 0)
VCUDA_STREAM_MEMOP(cuStreamWaitValue32, cuuint32_t, 1)
VCUDA_STREAM_MEMOP(cuStreamWriteValue64, cuuint64_t, 2)
VCUDA_STREAM_MEMOP(cuStreamWaitValue64, cuuint64_t, 3)
#undef VCUDA_STREAM_MEMOP

namespace {
// At most this many operations in one batch (the driver documents no bound; the frame must stay small).
constexpr unsigned max_batch_ops = 256;
CUresult batch_memop(CUstream stream, unsigned count, CUstreamBatchMemOpParams* ops, unsigned flags,
                     bool legacy, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (count > max_batch_ops || (count && !ops)) return CUDA_ERROR_INVALID_VALUE;
    return stream_batch_memop_call(
               name, stream, count, flags, legacy,
               {reinterpret_cast<const std::byte*>(ops), count * sizeof(CUstreamBatchMemOpParams)})
        .send_sync();  // the server's verdict on every address, at the call
}
}  // namespace

VCUDA_API cuStreamBatchMemOp_v2(CUstream stream, unsigned int count, CUstreamBatchMemOpParams* paramArray,
                                unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuStreamBatchMemOp_v2, stream, count, paramArray, flags);
    return batch_memop(stream, count, paramArray, flags, false, "cuStreamBatchMemOp_v2");
}

VCUDA_API cuStreamBatchMemOp(CUstream stream, unsigned int count, CUstreamBatchMemOpParams* paramArray,
                             unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuStreamBatchMemOp, stream, count, paramArray, flags);
    return batch_memop(stream, count, paramArray, flags, true, "cuStreamBatchMemOp");
}

// ---------------------------------------------------------------- stream and kernel-node attributes
// Forwarded and waited for (server/handlers_stream.cpp), so that a value the driver refuses fails at the
// call. The value travels as its 64 bytes; the server refuses attributes that hold a handle.

namespace {
enum attribute_what : unsigned { stream_get = 0, stream_set = 1, node_get = 2, node_set = 3 };

CUresult attribute(attribute_what what, uint64_t object, handle_kind kind, CUlaunchAttributeID id,
                   CUlaunchAttributeValue* out, const CUlaunchAttributeValue* in, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!out && !in) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_handle(object, kind)) return CUDA_ERROR_INVALID_HANDLE;
    attribute_call c(name, what, object, static_cast<unsigned>(id),
                     in ? std::span<const std::byte>(reinterpret_cast<const std::byte*>(in), sizeof *in)
                        : std::span<const std::byte>{});
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (out) {
        if (c.value().size() != sizeof *out) return CUDA_ERROR_UNKNOWN;
        std::memcpy(out, c.value().data(), sizeof *out);
    }
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_API cuStreamGetAttribute(CUstream hStream, CUstreamAttrID attr, CUstreamAttrValue* value_out) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetAttribute, hStream, attr, value_out);
    if (!value_out) return CUDA_ERROR_INVALID_VALUE;
    return attribute(stream_get, reinterpret_cast<uint64_t>(hStream), handle_kind::stream, attr, value_out,
                     nullptr, "cuStreamGetAttribute");
}

VCUDA_API cuStreamSetAttribute(CUstream hStream, CUstreamAttrID attr,
                               const CUstreamAttrValue* value) noexcept {
    VCUDA_TRACE_HOOK(cuStreamSetAttribute, hStream, attr, value);
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    return attribute(stream_set, reinterpret_cast<uint64_t>(hStream), handle_kind::stream, attr, nullptr,
                     value, "cuStreamSetAttribute");
}

VCUDA_API cuGraphKernelNodeGetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                        CUkernelNodeAttrValue* value_out) noexcept {
    VCUDA_TRACE_HOOK(cuGraphKernelNodeGetAttribute, hNode, attr, value_out);
    if (!value_out) return CUDA_ERROR_INVALID_VALUE;
    return attribute(node_get, reinterpret_cast<uint64_t>(hNode), handle_kind::graph_node, attr, value_out,
                     nullptr, "cuGraphKernelNodeGetAttribute");
}

VCUDA_API cuGraphKernelNodeSetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                        const CUkernelNodeAttrValue* value) noexcept {
    VCUDA_TRACE_HOOK(cuGraphKernelNodeSetAttribute, hNode, attr, value);
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    return attribute(node_set, reinterpret_cast<uint64_t>(hNode), handle_kind::graph_node, attr, nullptr,
                     value, "cuGraphKernelNodeSetAttribute");
}
