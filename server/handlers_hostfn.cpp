// Host functions (cuLaunchHostFunc, cuStreamAddCallback) run in the client, in stream order: the server
// enqueues a callback of its own on the real stream; when the stream reaches it, the callback hands the
// function's id to the client's host-function thread (op host_func_next) and waits until the client says it
// ran (op host_func_done), so that later work on the stream waits for the function as with the real driver.
// Host nodes of graphs work the same way, and so do the host nodes of graph copies with the client's memory
// (server/host_functions.hpp), at which the client reads or writes the copy's staging buffer (ops
// host_copy_read, host_copy_write) before it says it is done.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "server/call_context.hpp"
#include "server/host_functions.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {
// One host function as the driver's callback sees it. Launched on a stream, it runs once and is freed then;
// captured into a graph, it runs at every launch of the graph, so the session keeps it until it ends (after
// its graphs are destroyed).
struct pending_host_func : session::kept_host_func {
    std::weak_ptr<session> sess;
    uint64_t id = 0;
    bool in_graph = false;
};

void CUDA_CB run_in_client(void* data) {
    auto* p = static_cast<pending_host_func*>(data);
    std::unique_ptr<pending_host_func> once(p->in_graph ? nullptr : p);
    auto s = p->sess.lock();
    if (!s) return;  // the session is gone: nothing to wait for
    s->host_func_started(p->id, p->in_graph);
    s->host_func_wait(p->id);
}

// A graph copy's host node data: kept by the session until it ends (as captured host functions are), so that
// the host node never reads freed memory, whatever happens to the staging buffer.
struct host_copy_node : session::kept_host_func {
    std::weak_ptr<session> sess;
    uint64_t id = 0;
};

// A graph copy's staging buffer, owned by the CUDA user object that the graphs using it hold: freed (and its
// bytes credited) when the last of them goes. Were it gone early, the client's read or write at the host node
// would fail, logged, and nothing else.
struct host_copy_buffer {
    std::weak_ptr<session> sess;
    uint64_t id = 0;
    size_t size = 0;
};

// The copy's host node: the client moves the bytes between the staging buffer and its memory.
void CUDA_CB run_host_copy(void* data) {
    auto* n = static_cast<host_copy_node*>(data);
    auto s = n->sess.lock();
    if (!s) return;
    s->host_func_started(n->id, true);
    s->host_func_wait(n->id);
}

// The user object's destructor, on a thread of the driver's: no driver calls (the buffer is unregistered
// later, by a lane), no session mutex.
void CUDA_CB drop_host_copy(void* data) {
    std::unique_ptr<host_copy_buffer> b(static_cast<host_copy_buffer*>(data));
    if (auto s = b->sess.lock()) {
        if (s->host_copies.retire(b->id)) s->host.credit_later(b->size);
    }
}

// An application's user object as its driver destructor sees it.
struct user_object_end {
    std::weak_ptr<session> sess;
    uint64_t id = 0;
};

// The driver's destructor of an application's user object, on a thread of the driver's (or in the release
// that dropped the last reference): no driver calls. The application's destructor runs in the client.
void CUDA_CB end_user_object(void* data) {
    std::unique_ptr<user_object_end> e(static_cast<user_object_end*>(data));
    auto s = e->sess.lock();
    if (!s) return;  // the session has ended: its client has no one to run the destructor
    {
        std::lock_guard lock(s->user_objects_mu);
        s->user_objects.erase(e->id);
    }
    s->host_func_started(e->id, false);
}

// At most this many user objects a session (each holds a little of the server's memory).
constexpr size_t max_user_objects = 65536;

// References counted in one call: at most what CUDA's unsigned int takes.
bool valid_count(uint64_t n) { return n > 0 && n <= UINT32_MAX; }

// The bytes of one side of a 2D/3D copy, packed: w x h x depth.
bool packed_size(const CUDA_MEMCPY3D& c, size_t& out) {
    uint64_t n;
    if (!mul_add(c.WidthInBytes, c.Height, 0, n) || !mul_add(n, c.Depth, 0, n)) return false;
    out = n;
    return true;
}

// A copy or host node of a host copy's child graph.
CUresult add_to(const driver_table& d, CUgraph g, CUgraphNode* after, CUgraphNodeParams& p,
                CUgraphNode& out) {
    return d.cuGraphAddNode_v2(&out, g, after, nullptr, after ? 1 : 0, &p);
}
}  // namespace

host_copy_buffers::buffer::buffer(size_t n) : size(n) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    if (n > SIZE_MAX - page) throw std::bad_alloc();
    const size_t rounded = (n + page - 1) / page * page;
    bytes = static_cast<std::byte*>(std::aligned_alloc(page, rounded));
    if (!bytes) throw std::bad_alloc();
    std::memset(bytes, 0, rounded);
}

host_copy_buffers::buffer::~buffer() { std::free(bytes); }

void session::drop_host_copies(bool all) {
    auto gone = host_copies.take_retired(all);
    if (gone.empty()) return;
    // A lane's thread has a context of the session current. At the session's end a launch may still read a
    // buffer: wait for it. A registration whose context went is gone with it: unregistering it answers an
    // error, harmlessly.
    if (all) {
        std::lock_guard lock(mu);
        if (std::none_of(devices_.begin(), devices_.end(), [](const auto& s) { return s.ctx != nullptr; }))
            return;  // no context left: no registration either
        synchronize_any_context();
    }
    auto& d = api();
    relaxed_capture_scope relaxed(d);
    for (auto& b : gone)
        if (b->registered) d.cuMemHostUnregister(b->bytes);
}  // the memory goes with the last reference (a host_copy_read or _write under way may hold one)

bool graph_host_func_id(const CUDA_HOST_NODE_PARAMS& p, uint64_t& id) {
    if (p.fn != &run_in_client || !p.userData) return false;
    id = static_cast<const pending_host_func*>(p.userData)->id;  // kept until the session ends
    return true;
}

CUDA_HOST_NODE_PARAMS graph_host_func(call_context& cx, uint64_t id) {
    auto p = std::make_unique<pending_host_func>();
    p->sess = cx.sess.weak_from_this();
    p->id = id;
    p->in_graph = true;
    CUDA_HOST_NODE_PARAMS h{&run_in_client, p.get()};
    cx.sess.keep_host_func(std::move(p));
    return h;
}

namespace {

// The client's side of copy `c` (its source when it goes to the device): what staging buffers are shared by.
host_copy_buffers::shape client_side(const CUDA_MEMCPY3D& c, bool to_device) {
    if (to_device)
        return {reinterpret_cast<uintptr_t>(c.srcHost),
                c.srcXInBytes,
                c.srcY,
                c.srcZ,
                c.srcPitch,
                c.srcHeight,
                c.WidthInBytes,
                c.Height,
                c.Depth,
                1};
    return {reinterpret_cast<uintptr_t>(c.dstHost),
            c.dstXInBytes,
            c.dstY,
            c.dstZ,
            c.dstPitch,
            c.dstHeight,
            c.WidthInBytes,
            c.Height,
            c.Depth,
            0};
}

// Gives a staging buffer that no host copy uses back: unregistered, its size credited.
void unpin(call_context& cx, host_copy_buffers::buffer& b) {
    if (b.registered) {
        relaxed_capture_scope relaxed(cx.drv());
        cx.drv().cuMemHostUnregister(b.bytes);
        b.registered = false;
    }
    std::lock_guard lock(cx.sess.mu);
    cx.sess.host.unreserve(b.size);
}

// A staging buffer of `size` bytes for copies of shape `of`, charged to the session's host quota and pinned:
// the copy node reads or writes it when it runs only if it is pinned (the driver reads a pageable source
// before the graph's nodes run).
CUresult new_host_copy_buffer(call_context& cx, const host_copy_buffers::shape& of, size_t size,
                              std::shared_ptr<host_copy_buffers::buffer>& out) {
    auto& d = cx.drv();
    if (!d.cuMemHostRegister_v2 || !d.cuMemHostUnregister) return cx.unsupported("cuMemHostRegister");
    {
        std::lock_guard lock(cx.sess.mu);
        if (!cx.sess.host.reserve(size, cx.sess.host_quota()))
            return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "a graph copy's staging buffer of " +
                                                         std::to_string(size) +
                                                         " bytes exceeds the session's host memory quota");
    }
    try {
        out = std::make_shared<host_copy_buffers::buffer>(size);
    } catch (const std::bad_alloc&) {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.host.unreserve(size);
        return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "no memory for a graph copy's staging buffer");
    }
    out->of = of;
    relaxed_capture_scope relaxed(d);  // a capture under way on this thread must go on
    if (CUresult rc = d.cuMemHostRegister_v2(out->bytes, out->size, CU_MEMHOSTREGISTER_PORTABLE);
        rc != CUDA_SUCCESS) {
        unpin(cx, *out);
        out.reset();
        return cx.fail(rc,
                       "could not pin a graph copy's staging buffer of " + std::to_string(size) + " bytes");
    }
    out->registered = true;
    return CUDA_SUCCESS;
}

}  // namespace

CUresult host_copy_graph(call_context& cx, CUDA_MEMCPY3D c, uint64_t id, CUgraph& out) {
    auto& d = cx.drv();
    if (!d.cuUserObjectCreate || !d.cuUserObjectRelease || !d.cuGraphRetainUserObject || !d.cuGraphCreate ||
        !d.cuGraphAddNode_v2 || !d.cuGraphDestroy)
        return cx.unsupported("cuUserObjectCreate");
    const bool to_device = c.srcMemoryType == CU_MEMORYTYPE_HOST;
    if (id == 0 || to_device == (c.dstMemoryType == CU_MEMORYTYPE_HOST)) return cx.bad_arguments();
    size_t size = 0;
    if (!packed_size(c, size) || size == 0) return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad copy extent");
    const host_copy_buffers::shape of = client_side(c, to_device);
    cx.sess.drop_host_copies(false);  // those whose graphs are gone
    bool taken = false;
    std::shared_ptr<host_copy_buffers::buffer> buf = cx.sess.host_copies.use(id, of, taken);
    if (!buf && !taken) {
        std::shared_ptr<host_copy_buffers::buffer> made;
        if (CUresult rc = new_host_copy_buffer(cx, of, size, made); rc != CUDA_SUCCESS) return rc;
        buf = cx.sess.host_copies.add(id, made);
        if (buf != made) unpin(cx, *made);  // not used: the id was taken, or another lane made one meanwhile
    }
    if (!buf) return cx.fail(CUDA_ERROR_INVALID_VALUE, "host copy id already in use");
    auto* owner = new host_copy_buffer{cx.sess.weak_from_this(), id, buf->size};
    CUuserObject obj = nullptr;
    if (CUresult rc =
            d.cuUserObjectCreate(&obj, owner, &drop_host_copy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
        rc != CUDA_SUCCESS) {
        delete owner;
        if (cx.sess.host_copies.retire(id)) {
            cx.sess.drop_host_copies(false);  // unregistered, then freed
            std::lock_guard lock(cx.sess.mu);
            cx.sess.host.unreserve(buf->size);
        }
        return rc;
    }
    // From here on the user object owns the buffer: releasing it undoes its part.
    CUgraph g = nullptr;
    CUresult rc = d.cuGraphCreate(&g, 0);
    if (rc == CUDA_SUCCESS) rc = d.cuGraphRetainUserObject(g, obj, 1, CU_GRAPH_USER_OBJECT_MOVE);
    if (rc != CUDA_SUCCESS) {
        d.cuUserObjectRelease(obj, 1);
        if (g) d.cuGraphDestroy(g);
        return rc;
    }
    void* staging = buf->bytes;
    if (to_device) {
        c.srcHost = staging;
        c.srcXInBytes = c.srcY = c.srcZ = 0;
        c.srcPitch = c.WidthInBytes;
        c.srcHeight = c.Height;
    } else {
        c.dstHost = staging;
        c.dstXInBytes = c.dstY = c.dstZ = 0;
        c.dstPitch = c.WidthInBytes;
        c.dstHeight = c.Height;
    }
    CUgraphNodeParams copy{};
    copy.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    copy.memcpy.copyParams = c;
    d.cuCtxGetCurrent(&copy.memcpy.copyCtx);  // the session's context of the call's device
    auto node = std::make_unique<host_copy_node>();
    node->sess = cx.sess.weak_from_this();
    node->id = id;
    CUgraphNodeParams host{};
    host.type = CU_GRAPH_NODE_TYPE_HOST;
    host.host = {&run_host_copy, node.get()};
    cx.sess.keep_host_func(std::move(node));
    CUgraphNode first = nullptr, second = nullptr;
    rc = add_to(d, g, nullptr, to_device ? host : copy, first);
    if (rc == CUDA_SUCCESS) rc = add_to(d, g, &first, to_device ? copy : host, second);
    if (rc != CUDA_SUCCESS) {
        d.cuGraphDestroy(g);
        return rc;
    }
    out = g;
    return CUDA_SUCCESS;
}

namespace {

// The copy node and the client's id of a host copy's child graph node (host_copy_graph); false for any other
// node. Reads no copy parameters: node listings ask it of every child graph node.
bool host_copy_parts(const driver_table& d, CUgraphNode node, CUgraphNode& copy_node, uint64_t& id) {
    CUgraphNodeType type{};
    CUgraph child = nullptr;
    if (!d.cuGraphNodeGetType || !d.cuGraphChildGraphNodeGetGraph || !d.cuGraphGetNodes ||
        !d.cuGraphHostNodeGetParams || d.cuGraphNodeGetType(node, &type) != CUDA_SUCCESS ||
        type != CU_GRAPH_NODE_TYPE_GRAPH || d.cuGraphChildGraphNodeGetGraph(node, &child) != CUDA_SUCCESS)
        return false;
    CUgraphNode nodes[2] = {};
    size_t n = 2;
    if (d.cuGraphGetNodes(child, nodes, &n) != CUDA_SUCCESS || n != 2) return false;
    bool host = false;
    copy_node = nullptr;
    for (CUgraphNode k : nodes) {
        if (d.cuGraphNodeGetType(k, &type) != CUDA_SUCCESS) return false;
        if (type == CU_GRAPH_NODE_TYPE_HOST) {
            CUDA_HOST_NODE_PARAMS p{};
            if (d.cuGraphHostNodeGetParams(k, &p) != CUDA_SUCCESS || p.fn != &run_host_copy) return false;
            id = static_cast<const host_copy_node*>(p.userData)->id;  // kept until the session ends
            host = true;
        } else if (type == CU_GRAPH_NODE_TYPE_MEMCPY) {
            copy_node = k;
        }
    }
    return host && copy_node;
}

}  // namespace

bool host_copy_of(const driver_table& d, CUgraphNode node, CUDA_MEMCPY3D& copy, uint64_t& id) {
    CUgraphNode copy_node = nullptr;
    return host_copy_parts(d, node, copy_node, id) && d.cuGraphMemcpyNodeGetParams &&
           d.cuGraphMemcpyNodeGetParams(copy_node, &copy) == CUDA_SUCCESS;
}

bool is_host_copy_node(const driver_table& d, CUgraphNode node) {
    CUgraphNode copy_node = nullptr;
    uint64_t id = 0;
    return host_copy_parts(d, node, copy_node, id);
}

void session::release_user_objects() {
    std::vector<CUuserObject> held;
    {
        std::lock_guard lock(user_objects_mu);
        for (auto& [id, o] : user_objects)
            if (o.obj && o.refs) {
                held.push_back(o.obj);
                o.refs = 0;
            }
    }
    for (CUuserObject o : held) api().cuUserObjectRelease(o, 1);
}

CUresult handle_user_object_create(call_context& cx, const user_object_create_args& a) {
    const uint64_t id = a.id, refs = a.refs;
    auto& d = cx.drv();
    if (!d.cuUserObjectCreate || !d.cuUserObjectRelease) return cx.unsupported("cuUserObjectCreate");
    if (id == 0 || !valid_count(refs))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad user object id or count");
    auto& s = cx.sess;
    {
        std::lock_guard lock(s.user_objects_mu);
        if (s.user_objects.size() >= max_user_objects)
            return cx.fail(CUDA_ERROR_OUT_OF_MEMORY,
                           "the session has " + std::to_string(max_user_objects) + " user objects already");
        if (!s.user_objects.emplace(id, session::user_object{}).second)
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "user object id already in use");
    }
    auto* end = new user_object_end{s.weak_from_this(), id};
    CUuserObject obj = nullptr;
    CUresult rc = d.cuUserObjectCreate(&obj, end, &end_user_object, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
    std::lock_guard lock(s.user_objects_mu);
    if (rc != CUDA_SUCCESS) {
        delete end;
        s.user_objects.erase(id);
        return rc;
    }
    s.user_objects[id] = {obj, refs};
    return CUDA_SUCCESS;
}

namespace {

// The driver's object of user object `id` with one more driver reference taken (the caller releases it once
// done with it), or null when the application holds no reference of it. `take`: references the application
// gives up (a release, or a move to a graph); refused when it holds fewer.
CUuserObject hold_user_object(call_context& cx, uint64_t id, uint64_t take, bool& last) {
    auto& s = cx.sess;
    std::lock_guard lock(s.user_objects_mu);
    auto it = s.user_objects.find(id);
    last = false;
    if (it == s.user_objects.end() || !it->second.obj || it->second.refs < std::max<uint64_t>(take, 1))
        return nullptr;
    cx.drv().cuUserObjectRetain(it->second.obj, 1);  // never runs a destructor
    it->second.refs -= take;
    last = it->second.refs == 0;  // the session's own reference goes too
    return it->second.obj;
}

// Gives back what hold_user_object took: its reference, and the session's when the application's last went.
void let_go(call_context& cx, CUuserObject obj, bool last) {
    cx.drv().cuUserObjectRelease(obj, last ? 2 : 1);
}

}  // namespace

CUresult handle_user_object_refs(call_context& cx, const user_object_refs_args& a) {
    const uint64_t id = a.id, count = a.count;
    const bool retain = a.retain;
    if (!valid_count(count)) return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad reference count");
    if (!cx.drv().cuUserObjectRetain) return cx.unsupported("cuUserObjectRetain");
    bool last = false;
    CUuserObject obj = hold_user_object(cx, id, retain ? 0 : count, last);
    if (!obj)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a user object the application holds that many of");
    if (retain) {
        std::lock_guard lock(cx.sess.user_objects_mu);
        cx.sess.user_objects[id].refs += count;
    }
    let_go(cx, obj, last);
    return CUDA_SUCCESS;
}

CUresult handle_graph_user_object(call_context& cx, const graph_user_object_args& a) {
    const uint64_t id = a.id, count = a.count, flags = a.flags;
    const bool retain = a.retain, move = flags == CU_GRAPH_USER_OBJECT_MOVE;
    CUgraph g = a.graph;
    auto& d = cx.drv();
    if (!d.cuGraphRetainUserObject || !d.cuGraphReleaseUserObject || !d.cuUserObjectRetain)
        return cx.unsupported("cuGraphRetainUserObject");
    if (!valid_count(count) || (flags != 0 && !(retain && move)))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad reference count or flags");
    bool last = false;
    CUuserObject obj = hold_user_object(cx, id, move ? count : 0, last);
    if (!obj)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a user object the application holds that many of");
    const auto n = static_cast<unsigned>(count);
    CUresult rc = retain ? d.cuGraphRetainUserObject(g, obj, n, 0) : d.cuGraphReleaseUserObject(g, obj, n);
    if (rc != CUDA_SUCCESS && move) {  // the application keeps its references
        std::lock_guard lock(cx.sess.user_objects_mu);
        cx.sess.user_objects[id].refs += count;
        last = false;
    }
    let_go(cx, obj, last);
    return rc;
}

CUresult handle_host_func(call_context& cx, const host_func_args& a) {
    CUstream s = a.stream;
    auto p = std::make_unique<pending_host_func>();
    p->sess = cx.sess.weak_from_this();
    p->id = a.id;
    const bool in_graph = capture_status(cx.drv(), s) == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    p->in_graph = in_graph;
    CUresult rc = cx.drv().cuLaunchHostFunc(s, &run_in_client, p.get());
    if (rc != CUDA_SUCCESS) return rc;
    // Not p->in_graph: a function launched on a stream may have run, and been freed, by now (the driver's
    // thread runs it as soon as the stream reaches it; the client may have answered already).
    if (in_graph)
        cx.sess.keep_host_func(std::move(p));
    else
        static_cast<void>(p.release());  // run_in_client frees it after its one run
    return CUDA_SUCCESS;
}

// Waits until a host function's turn has come on its stream or in a graph's launch; one in a graph runs again
// at every launch, so the client keeps it.
CUresult handle_host_func_next(call_context& cx, const host_func_next_args&) {
    uint64_t id;
    bool in_graph = false;
    // The client's host-function thread waits in this call for as long as its process lives; when the process
    // ends, this lane must notice (it reads nothing meanwhile), or the session would never end.
    frame_stream* fs = cx.lane.stream;
    if (!cx.sess.host_func_next(id, in_graph, [fs] { return fs && fs->raw().peer_gone(); }))
        return cx.fail(CUDA_ERROR_DEINITIALIZED, "session ending");
    cx.out(id);
    cx.out(uint64_t{in_graph});
    return CUDA_SUCCESS;
}

CUresult handle_host_func_done(call_context& cx, const host_func_done_args& a) {
    cx.sess.host_func_done(a.id);
    return CUDA_SUCCESS;
}

namespace {
// At most this many bytes of a staging buffer in one host_copy_read or host_copy_write.
constexpr uint64_t host_copy_chunk = uint64_t{8} << 20;

// The staging buffer of host copy `id` when [offset, offset+n) lies inside it.
CUresult staging_range(call_context& cx, uint64_t id, uint64_t offset, uint64_t n,
                       std::shared_ptr<host_copy_buffers::buffer>& out) {
    out = cx.sess.host_copies.find(id);
    if (!out) return cx.fail(CUDA_ERROR_INVALID_VALUE, "no graph copy with this id");
    if (n > host_copy_chunk || offset > out->size || n > out->size - offset)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "past the graph copy's staging buffer");
    return CUDA_SUCCESS;
}
}  // namespace

// A copy from the GPU whose host node is running: the bytes of its staging buffer.
CUresult handle_host_copy_read(call_context& cx, const host_copy_read_args& a) {
    std::shared_ptr<host_copy_buffers::buffer> b;
    if (CUresult rc = staging_range(cx, a.copy, a.offset, a.bytes, b); rc != CUDA_SUCCESS) return rc;
    const std::byte* from = b->bytes + a.offset;
    cx.reply_payload.assign(from, from + a.bytes);
    return CUDA_SUCCESS;
}

// A copy to the GPU whose host node is running: the bytes put into its staging buffer.
CUresult handle_host_copy_write(call_context& cx, const host_copy_write_args& a) {
    std::shared_ptr<host_copy_buffers::buffer> b;
    if (CUresult rc = staging_range(cx, a.copy, a.offset, a.data.size(), b); rc != CUDA_SUCCESS) return rc;
    std::memcpy(b->bytes + a.offset, a.data.data(), a.data.size());
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
