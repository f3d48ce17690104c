// The software test driver's internal state: its devices, the objects behind every handle it hands out,
// the memory ranges it treats as device memory, and the per-thread context stack. A CPU stand-in for
// libcuda used in CI (no GPU there); it never ships as a feature (DESIGN.md, "Testing").
//
// Handles are not pointers: each is a tagged 64-bit value (tag | kind | serial) looked up in one table, so
// a stale, foreign or wrong-kind handle is detected without ever being dereferenced, and values are never
// reused within a process.
//
// locks: one mutex (state::mu) guards everything in `state`. Work that runs user code (host kernels, host
// functions, stream callbacks) and bulk copies runs after it is released (see `entry_then`), so a callback
// may call back into the driver and threads do not serialise on large copies.
#pragma once

#include <cuda.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "soft_kernel.hpp"

// Every driver entry point: C linkage, visible although the library is built with hidden visibility.
#define VCUDA_SOFT_EXPORT extern "C" __attribute__((visibility("default")))

namespace vcuda::soft {

inline constexpr int driver_version = 13000;
inline constexpr int max_devices = 8;
// The area cuMemAddressReserve places ranges without a hint in (soft_memory.cpp), as the real driver does.
inline constexpr uintptr_t device_va_begin = uintptr_t{1} << 40;
inline constexpr uintptr_t device_va_end = uintptr_t{64} << 40;
inline constexpr size_t default_memory = size_t{8} << 30;
inline constexpr size_t vmm_granularity = size_t{2} << 20;
inline constexpr const char* device_name = "vcuda software test driver (CPU)";

// The limits of the device we pretend to be (an sm_90, H100-like part).
inline constexpr unsigned max_threads_per_block = 1024;
inline constexpr unsigned max_block_x = 1024, max_block_y = 1024, max_block_z = 64;
inline constexpr unsigned max_grid_x = 2147483647u, max_grid_y = 65535, max_grid_z = 65535;
inline constexpr int sm_count = 132;
inline constexpr int shared_per_block = 49152;
inline constexpr int shared_per_block_optin = 232448;
inline constexpr int shared_per_sm = 233472;
inline constexpr int reserved_shared_per_block = 1024;
inline constexpr int max_threads_per_sm = 2048;
inline constexpr int max_blocks_per_sm = 32;
inline constexpr int regs_per_sm = 65536;
inline constexpr int regs_per_thread = 32;
inline constexpr int least_stream_priority = 0, greatest_stream_priority = -5;
inline constexpr size_t max_access_policy_window = 134213632;

enum class kind : uint8_t {
    context = 1,
    stream,
    event,
    module,
    library,
    kernel,
    function,
    mem_handle,
    graph,
    graph_exec,
    mem_pool,
    graph_node,
    link,
    array,
    user_object,
    conditional,
    mipmapped_array,
    green_ctx,
    resource_desc
};

inline constexpr uint64_t handle_tag = uint64_t{0x5c0d} << 48;

struct object {
    explicit object(kind k) : k(k) {}
    virtual ~object() = default;
    kind k;
    uint64_t handle = 0;
};

struct context_obj : object {
    static constexpr kind tag = kind::context;
    context_obj() : object(tag) {}
    int device = 0;
    unsigned flags = 0;
    bool primary = false;
    bool active = true;     // a primary context is inactive while its retain count is zero
    unsigned refcount = 0;  // primary contexts only
    uint64_t id = 0;
    unsigned api_version = 3020;
    CUfunc_cache cache_config = CU_FUNC_CACHE_PREFER_NONE;
    std::array<size_t, CU_LIMIT_MAX> limits{};
    std::vector<uint64_t> peers;  // contexts it has peer access to (cuCtxEnablePeerAccess)
    unsigned sm_limit = 0;        // a green context's SMs (soft_green.cpp); 0: all of the device's
};

struct stream_obj : object {
    static constexpr kind tag = kind::stream;
    stream_obj() : object(tag) {}
    uint64_t ctx = 0;
    unsigned flags = 0;
    int priority = 0;
    uint64_t id = 0;
    uint64_t capture = 0;  // the capture sequence it records into (0: none; stale once that capture ended)
    std::map<int, CUlaunchAttributeValue> attrs;  // cuStreamSetAttribute (priority lives in `priority`)
};

// A memory pool (cuMemPoolCreate, or a device's default pool): stream-ordered allocations come from it and
// give their memory back at once (no caching), so its figures are what is in use.
struct pool_obj : object {
    static constexpr kind tag = kind::mem_pool;
    pool_obj() : object(tag) {}
    int device = 0;
    bool is_default = false;
    int reuse[3] = {1, 1, 1};  // CU_MEMPOOL_ATTR_REUSE_* (1-3)
    uint64_t release_threshold = 0;
    uint64_t used = 0, used_high = 0;
    std::array<CUmemAccess_flags, 8> access{};
    bool shareable = false;  // made for POSIX file descriptors (cuMemPoolExportToShareableHandle)
    uint64_t imported_from =
        0;  // an import of this pool (cuMemPoolImportFromShareableHandle): allocations stay its
};

struct event_obj : object {
    static constexpr kind tag = kind::event;
    event_obj() : object(tag) {}
    uint64_t ctx = 0;
    unsigned flags = 0;
    bool recorded = false;
    std::chrono::steady_clock::time_point when{};
    uint64_t capture =
        0;  // last recorded inside this capture sequence: a stream waiting on it joins the capture
};

// A stream capture under way (cuStreamBeginCapture* .. cuStreamEndCapture): the work of its streams is
// recorded into its graph instead of running, each piece a node after the one before (the capture is one
// chain).
struct capture_seq {
    uint64_t id = 0;
    uint64_t graph = 0;
    bool existing =
        false;  // cuStreamBeginCaptureToGraph: the application's graph, never destroyed with the capture
    std::vector<uint64_t> last;  // what the next node recorded depends on (at first: the dependencies given)
    std::vector<CUgraphEdgeData> last_edges;  // their edge data (empty: default)
    std::vector<CUgraphNode> reported;        // `last` as cuStreamGetCaptureInfo last handed it out
    uint64_t ctx = 0;
    uint64_t origin = 0;    // the stream it began on (the handle as given)
    bool blocking = false;  // the origin synchronizes with the legacy stream, which is then off limits
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    std::thread::id thread;  // the thread that began it
    bool invalidated = false;
};

// Function attributes that can be set; the rest are constants (soft_module.cpp).
struct func_attrs {
    int max_dynamic_shared = shared_per_block;
    int carveout = -1;
    int cluster_w = 0, cluster_h = 0, cluster_d = 0;
    int non_portable_cluster = 0;
    int cluster_sched = 0;
    CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;
};

struct function_obj : object {
    static constexpr kind tag = kind::function;
    function_obj() : object(tag) {}
    uint64_t module = 0;
    uint64_t kernel = 0;  // set when obtained through cuKernelGetFunction
    uint64_t ctx = 0;
    const kernel_entry* entry = nullptr;
    std::string name;
    std::shared_ptr<func_attrs> attrs;
};

// The __device__ variables of one module or library: one zeroed host allocation per registered global.
struct global_set {
    std::map<std::string, std::pair<void*, size_t>, std::less<>> vars;
};

struct module_obj : object {
    static constexpr kind tag = kind::module;
    module_obj() : object(tag) {}
    uint64_t ctx = 0;
    uint64_t library = 0;  // set for the per-context module of a library: its globals are the library's
    const void* image = nullptr;
    std::map<std::string, uint64_t, std::less<>> functions;
    global_set globals;
};

// A link state: the inputs as given; "linking" hands back the first one (kernels are found by name anyway).
struct link_obj : object {
    static constexpr kind tag = kind::link;
    link_obj() : object(tag) {}
    std::vector<std::vector<char>> inputs;
    std::vector<char> image;
    char* info_log = nullptr;
    char* error_log = nullptr;
    size_t info_size = 0, error_size = 0;
};

struct library_obj : object {
    static constexpr kind tag = kind::library;
    library_obj() : object(tag) {}
    const void* image = nullptr;
    std::map<std::string, uint64_t, std::less<>> kernels;
    std::map<uint64_t, uint64_t> modules;  // context -> module
    global_set globals;
};

struct kernel_obj : object {
    static constexpr kind tag = kind::kernel;
    kernel_obj() : object(tag) {}
    uint64_t library = 0;
    const kernel_entry* entry = nullptr;
    std::string name;
    std::shared_ptr<func_attrs> attrs;
    std::map<uint64_t, uint64_t> functions;  // context -> function
};

// A cuMemCreate allocation: a memfd of its size, mapped with cuMemMap. Freed when it is released and
// unmapped.
struct mem_handle_obj : object {
    static constexpr kind tag = kind::mem_handle;
    mem_handle_obj() : object(tag) {}
    int fd = -1;
    size_t size = 0;
    CUmemAllocationProp prop{};
    unsigned refs = 1;  // cuMemCreate / cuMemRetainAllocationHandle minus cuMemRelease
    unsigned maps = 0;  // live cuMemMap mappings
};

// A CUDA array (soft_array.cpp): host memory with a plain layout, rows of width * element bytes, `height`
// rows a slice (at least 1), `depth` slices (at least 1). Texture and surface objects point into it.
struct array_obj : object {
    static constexpr kind tag = kind::array;
    array_obj() : object(tag) {}
    CUDA_ARRAY3D_DESCRIPTOR desc{};
    size_t element = 0;  // bytes per element (all channels)
    int device = 0;      // charged to this device's memory
    std::vector<std::byte> data;
    uint64_t mipmapped = 0;  // the mipmapped array this is a level of, which destroys it; 0: none
    size_t row_bytes() const { return desc.Width * element; }
    size_t rows() const { return desc.Height ? desc.Height : 1; }
};

// A mipmapped array (soft_array.cpp): its levels are arrays of their own, each half the one before (at least
// 1; a layered array keeps its layer count), destroyed with it.
struct mipmapped_array_obj : object {
    static constexpr kind tag = kind::mipmapped_array;
    mipmapped_array_obj() : object(tag) {}
    CUDA_ARRAY3D_DESCRIPTOR desc{};
    std::vector<uint64_t> levels;  // array handles, level 0 first
};

enum class range_kind : uint8_t { device, managed, vmm, host_alloc, host_registered, global };

// One range of addresses the driver treats as device-accessible memory (device pointer == host pointer).
struct mem_range {
    uintptr_t base = 0;
    size_t size = 0;
    range_kind k = range_kind::device;
    int device = 0;
    uint64_t ctx = 0;    // owning context (0: none, e.g. VMM and globals)
    unsigned flags = 0;  // host alloc / register flags
    size_t charged = 0;  // bytes counted against the device's memory quota
    size_t os_size = 0;  // bytes to munmap (device, managed, host_alloc)
    uint64_t buffer_id = 0;
    uint64_t mem_handle = 0;  // vmm: the handle mapped here
    size_t handle_offset = 0;
    std::array<CUmemAccess_flags, max_devices> access{};  // vmm: per-device access
    bool sync_memops = false;
    uint64_t pool = 0;   // a stream-ordered allocation's pool
    int imports = 0;     // its cuMemPoolImportPointer imports not freed yet: a free ends one of them first
    bool graph = false;  // made by a memory alloc node: its address is its graph's, never unmapped by a free
};

struct device_info {
    size_t total_memory = default_memory;
    size_t used = 0;
    uint64_t primary_ctx = 0;
    uint64_t default_pool = 0, current_pool = 0;  // pool_obj handles, made on first use
    size_t graph_high = 0;                        // graph allocations' bytes, at most (since reset)
};

struct state {
    std::mutex mu;
    bool initialized = false;
    std::vector<device_info> devices;
    std::unordered_map<uint64_t, std::unique_ptr<object>> objects;
    std::map<uintptr_t, mem_range> ranges;     // by base; never overlapping
    std::map<uintptr_t, size_t> reservations;  // cuMemAddressReserve: base -> size
    // Globals' storage kept when their module goes, for the next load of the same global (name, device,
    // size): a module loaded again finds them where they were, every time (malloc mostly, not always, gave
    // the same address, and a resumed session's global that moves is another test's matter).
    std::multimap<std::tuple<std::string, int, size_t>, void*> freed_globals;
    uintptr_t next_device_va = device_va_begin;  // where the next reservation without a hint is tried
    uint64_t next_serial = 1;
    uint64_t next_buffer_id = 1;
    uint64_t next_ctx_id = 1;
    uint64_t next_stream_id = 16;
    std::map<uint64_t, capture_seq> captures;  // by capture id; ids are never reused
    uint64_t next_capture_id = 1;

    template <class T>
    T* find(uint64_t h) {
        auto it = objects.find(h);
        if (it == objects.end()) return nullptr;
        return it->second->k == T::tag ? static_cast<T*>(it->second.get()) : nullptr;
    }
    template <class T>
    T* find(const void* h) {
        return find<T>(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(h)));
    }
    template <class T>
    T* create() {
        auto obj = std::make_unique<T>();
        obj->handle = handle_tag | (uint64_t{static_cast<uint8_t>(obj->k)} << 40) | next_serial++;
        T* raw = obj.get();
        objects.emplace(raw->handle, std::move(obj));
        return raw;
    }
    void erase(uint64_t h) { objects.erase(h); }

    bool valid_device(CUdevice d) const { return d >= 0 && static_cast<size_t>(d) < devices.size(); }
};

state& global_state();

template <class H>
H to_handle(uint64_t h) {
    return reinterpret_cast<H>(static_cast<uintptr_t>(h));
}
template <class H>
uint64_t from_handle(H h) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(h));
}

// --- Entry points: catch everything, take the lock, refuse before cuInit.
using work = std::function<CUresult()>;

template <class F>
CUresult guarded(F&& f) noexcept {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    } catch (...) {
        return CUDA_ERROR_UNKNOWN;
    }
}

// f(state&) under the lock, after checking that cuInit has run.
template <class F>
CUresult entry(F&& f) noexcept {
    return guarded([&]() -> CUresult {
        state& s = global_state();
        std::lock_guard lk(s.mu);
        if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
        return f(s);
    });
}

// f(state&, work&) under the lock; then, unlocked and only on success, the work it left (copies, kernels,
// callbacks).
template <class F>
CUresult entry_then(F&& f) noexcept {
    return guarded([&]() -> CUresult {
        work w;
        {
            state& s = global_state();
            std::lock_guard lk(s.mu);
            if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
            CUresult r = f(s, w);
            if (r != CUDA_SUCCESS) return r;
        }
        return w ? w() : CUDA_SUCCESS;
    });
}

// A graph: its nodes in the order they were added, each with the nodes it runs after. Instantiating copies
// the nodes' work in a topological order (dependencies first, then insertion order); launching runs it, one
// node at a time like everything here.
// User objects (cuUserObjectCreate) and the references a graph or an executable graph holds on them: user
// object handle -> count.
using user_refs = std::map<uint64_t, unsigned>;

struct graph_obj : object {
    static constexpr kind tag = kind::graph;
    graph_obj() : object(tag) {}
    std::vector<uint64_t> nodes;  // node_obj handles, in insertion order
    uint64_t capture = 0;         // the capture recording into it, while one does
    uint64_t parent = 0;          // the child graph node it was cloned into (0: a graph of the application's)
    user_refs refs;
};

// A kernel node's parameters as given, its parameter values copied (cuGraphKernelNodeGetParams answers them):
// kernelParams, or an `extra` buffer, as the real driver reports the form most recently set.
struct kernel_node_params {
    CUDA_KERNEL_NODE_PARAMS_v2 p{};
    std::vector<std::vector<std::byte>> values;
    std::vector<void*> pointers;    // into `values`: what p.kernelParams points at
    std::vector<std::byte> buffer;  // an `extra` buffer's bytes, and the array p.extra points at
    size_t buffer_size = 0;
    void* extra[5] = {};
};

struct node_obj : object {
    static constexpr kind tag = kind::graph_node;
    node_obj() : object(tag) {}
    uint64_t graph = 0;
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    std::vector<uint64_t> deps;          // nodes of the same graph it runs after
    std::vector<CUgraphEdgeData> edges;  // one per dependency
    work run;                            // what it does (nothing for empty and child graph nodes)
    uint64_t child = 0;  // child graph nodes: the graph cloned into the node, destroyed with it
    std::map<int, CUlaunchAttributeValue> attrs;  // kernel nodes: cuGraphKernelNodeSetAttribute
    CUDA_HOST_NODE_PARAMS host{};                 // host nodes: the function and its data
    std::optional<CUDA_MEMCPY3D> copy;  // memcpy nodes made by cuGraphAddNode: their parameters, for updates
    uint64_t event = 0;  // event record and event wait nodes made by cuGraphAddNode: their event
    std::shared_ptr<const kernel_node_params> kernel;  // kernel nodes made or set by cuGraph* calls
    std::optional<CUDA_MEMSET_NODE_PARAMS> memset;     // memset nodes made or set by cuGraph* calls
    // Memory alloc nodes: their parameters (accessDescs pointing into `access`); free nodes: the address.
    CUDA_MEM_ALLOC_NODE_PARAMS alloc{};
    std::vector<CUmemAccessDesc> access;
    CUdeviceptr freed = 0;
    uint64_t origin = 0;  // the node it was cloned from (cuGraphNodeFindInClone)
    std::string name;     // kernel nodes: the kernel's (cuGraphDebugDotPrint)
    // Conditional nodes: the handle, the kind, and the body graphs (the node's own), as handed out.
    uint64_t cond = 0;
    CUgraphConditionalNodeType cond_type = CU_GRAPH_COND_TYPE_IF;
    std::vector<uint64_t> bodies;
    std::vector<CUgraph> bodies_out;
};

// One node of an executable graph: its own copy of the node's work, which updates replace.
struct exec_node {
    uint64_t node = 0;  // the graph node it was instantiated from
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    work run;
    std::optional<CUDA_MEMCPY3D> copy;  // as node_obj's
    std::vector<size_t> deps;           // the positions of its dependencies in its list
    bool enabled = true;                // cuGraphNodeSetEnabled: a disabled node does nothing when launched
    std::vector<exec_node> child;       // child graph nodes: the child graph's nodes, in the order they run
    // Conditional nodes: the handle, the kind, and each body graph's nodes in the order they run.
    uint64_t cond = 0;
    CUgraphConditionalNodeType cond_type = CU_GRAPH_COND_TYPE_IF;
    std::vector<std::vector<exec_node>> bodies;
};

struct graph_exec_obj : object {
    static constexpr kind tag = kind::graph_exec;
    graph_exec_obj() : object(tag) {}
    uint64_t ctx = 0;
    uint64_t graph = 0;            // the graph it was instantiated from
    unsigned long long flags = 0;  // its instantiation flags
    // Replaced, never edited: a launch under way keeps the list it started with.
    std::shared_ptr<const std::vector<exec_node>> nodes;
    std::vector<uint64_t> shape;  // its graph's topology, for cuGraphExecUpdate (soft_graph.cpp)
    user_refs refs;               // those of its graph and child graphs, taken at instantiation
    std::vector<uint64_t>
        conds;  // the conditional handles its nodes use, set to their default at each launch
};

// A conditional handle (cuGraphConditionalHandleCreate): a value kernels set (set_conditional) and
// conditional nodes read. Its handle is what kernels take by value.
struct conditional_obj : object {
    static constexpr kind tag = kind::conditional;
    conditional_obj() : object(tag) {}
    uint64_t graph = 0;
    unsigned value = 0, default_value = 0;
    bool assign_default = false;  // CU_GRAPH_COND_ASSIGN_DEFAULT: set to the default at each launch
};

// A user object: its destructor runs, on a thread of its own as the real driver's internal thread does, when
// the last reference goes.
struct user_object_obj : object {
    static constexpr kind tag = kind::user_object;
    user_object_obj() : object(tag) {}
    void* ptr = nullptr;
    CUhostFn destroy = nullptr;
    unsigned refs = 0;
};

// --- Contexts (soft_context.cpp). The calling thread's current context, if it is usable.
context_obj* current_context(state& s);
// The current context or CUDA_ERROR_INVALID_CONTEXT.
CUresult require_context(state& s, context_obj*& out);
// A new context's limits (soft_context.cpp).
std::array<size_t, CU_LIMIT_MAX> default_limits();
// A context handle passed in: unknown or destroyed -> nullptr.
context_obj* usable_context(state& s, uint64_t h);
// Frees everything a context owns (streams, events, modules, allocations) and forgets it on this thread.
void release_context_resources(state& s, context_obj& c);
// The calling thread's current context handle (0: none), read without the driver's lock.
uint64_t current_context_handle();

// --- Texture and surface objects (soft_array.cpp). Their values count from 1 in each context, as the GPU's
// driver numbers them (a context's objects and another's may have the same value), so a kernel resolves them
// in the context it runs in: set for the kernel's duration on the thread that runs it.
struct running_in_context {
    explicit running_in_context(uint64_t ctx);
    ~running_in_context();
    running_in_context(const running_in_context&) = delete;
    running_in_context& operator=(const running_in_context&) = delete;
    uint64_t previous;
};
// Forgets a context's texture and surface objects (its destruction).
void forget_context_objects(uint64_t ctx);

// --- Streams (soft_stream.cpp). Checks a stream argument; special handles need a current context.
// On success *ctx is the context the stream belongs to.
CUresult check_stream(state& s, CUstream h, context_obj** ctx = nullptr);

// --- Stream capture and graphs (soft_graph.cpp).
// The work an operation on `stream` left: recorded into the capture's graph as a node of `type` when the
// stream captures (w is emptied), else left to run. Using the legacy stream while a blocking stream of its
// context captures fails with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates those captures.
// A host node's function and data (`host`) are kept with it, as the real driver does.
CUresult capture_or_run(state& s, CUstream stream, work& w, CUgraphNodeType type,
                        const CUDA_HOST_NODE_PARAMS* host = nullptr, std::string_view name = {});
// The capture `stream` records into, or null (a stale reference to an ended capture is dropped here).
capture_seq* capture_of(state& s, CUstream stream);
// The node `stream`'s capture recorded last (after capture_or_run recorded one), or null.
node_obj* last_captured(state& s, CUstream stream);
// Keeps a memory alloc node's parameters (made by cuGraphAddNode or captured) for
// cuGraphMemAllocNodeGetParams.
void keep_alloc_params(node_obj& n, const CUmemPoolProps& props, const CUmemAccessDesc* access, size_t count,
                       size_t bytes, CUdeviceptr dptr);
// Where `stream` keeps the id of the capture it belongs to; null for the legacy stream, which cannot capture.
uint64_t* capture_slot(state& s, CUstream stream);
// True when `stream` is the legacy stream and a blocking stream of its context captures.
bool blocked_by_capture(state& s, CUstream stream);
// Synchronizing with `stream` (cuStreamSynchronize, cuStreamQuery): not while it captures (the capture is
// invalidated), nor with the legacy stream while a blocking stream captures.
CUresult check_not_capturing(state& s, CUstream stream);
// A potentially unsafe call (allocations) while captures are under way: refused by the calling thread's
// capture mode (cuThreadExchangeStreamCaptureMode) with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
CUresult check_unsafe_call(state& s);
CUstreamCaptureMode thread_capture_mode();  // soft_stream.cpp
// Records event `ev` on `stream` now (streams are always complete here), or into the stream's capture.
CUresult record_event(state& s, CUevent ev, CUstream stream);
// A stream (`node` false) or kernel node attribute value as the real driver checks it: an id valid for that
// object, a policy window no larger than the device allows, known enum values (soft_stream.cpp).
CUresult check_attribute(CUlaunchAttributeID id, const CUlaunchAttributeValue& v, bool node);
bool attribute_id_valid(CUlaunchAttributeID id, bool node);
// Forgets the captures of context `ctx` and the graphs they made (context destroyed or reset).
void end_captures_of(state& s, uint64_t ctx);
// Destroys an executable graph, releasing the user object references it holds.
void destroy_graph_exec(state& s, uint64_t h);
// The work of one node of each kind, checked as the stream operation is (soft_module.cpp, soft_copy.cpp).
CUresult kernel_node_work(state& s, const CUDA_KERNEL_NODE_PARAMS_v2& p, const context_obj& ctx, work& w);
// A copy of kernel node parameters `p` (kernelParams form; values copied at the kernel's parameter sizes).
std::shared_ptr<const kernel_node_params> keep_kernel_params(state& s, const CUDA_KERNEL_NODE_PARAMS_v2& p);
// The name of the kernel a kernel node's parameters run, or empty.
std::string kernel_name(state& s, const CUDA_KERNEL_NODE_PARAMS_v2& p);
// `recorded`: see memset_2d (soft_copy.cpp).
CUresult memset_node_work(state& s, const CUDA_MEMSET_NODE_PARAMS& p, work& w, bool recorded);
CUresult copy_3d_desc(state& s, work& w, const CUDA_MEMCPY3D* p);

// --- Memory (soft_memory.cpp).
mem_range* find_range(state& s, uintptr_t p);
bool in_reservation(const state& s, uintptr_t p);
// Checks that [p, p+n) lies in device-accessible memory (allocations, mappings with access, pinned or
// registered host memory, globals): CUDA_ERROR_INVALID_VALUE outside, CUDA_ERROR_ILLEGAL_ADDRESS for an
// unmapped or inaccessible part of a VMM reservation.
CUresult check_device_range(state& s, uintptr_t p, size_t n, bool write);
void insert_range(state& s, mem_range r);
void free_range(state& s, uintptr_t base);          // releases the memory and the quota; erases the range
void release_pooled(state& s, const mem_range& r);  // a stream-ordered allocation's pool figures drop
CUresult charge(state& s, int device, size_t bytes);
// Memory of a memory alloc node in context `c`'s device: mapped from the node's creation until the context
// goes (a graph allocation's address is its graph's; frees leave it mapped).
CUresult graph_alloc(state& s, context_obj& c, size_t bytes, CUdeviceptr* out);
// Bytes of graph allocations on `device`.
size_t graph_memory(const state& s, int device);
void uncharge(state& s, int device, size_t bytes);
void* os_alloc(size_t bytes);  // anonymous, zeroed, lazily committed; nullptr on failure
void os_free(void* p, size_t bytes);
// The module's or library's copy of a registered global, allocated (zeroed) on first use.
void* global_alloc(state& s, global_set& set, const global_entry& g, int device);
void free_globals(state& s, global_set& set);
void maybe_free_mem_handle(state& s, mem_handle_obj& m);

// --- Modules (soft_module.cpp).
void destroy_module(state& s, uint64_t h);
void destroy_function(state& s, uint64_t h);

// --- Kernel registry (soft_registry.cpp).
std::vector<const kernel_entry*> registered_kernels();
std::vector<size_t> param_offsets(const kernel_entry& k);

// --- Small helpers.
inline bool add_overflows(uintptr_t a, size_t b, uintptr_t* out) { return __builtin_add_overflow(a, b, out); }
inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
inline bool is_pow2(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace vcuda::soft
