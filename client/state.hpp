// The vGPU mirror: everything about the remote GPU that the application can observe and that the client
// answers itself — devices and attributes (fetched once at cuInit), contexts and each thread's current
// context, context-local storage, handles and what they are, kernels' parameter layouts, device and host
// allocations — plus the journal of the calls that made what is alive (client/journal.hpp).
// locks: `mu` guards the maps; the per-thread context stack needs no lock.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "client/journal.hpp"
#include "client/remote.hpp"
#include "common/handle_kind.hpp"
#include "common/param_layout.hpp"

namespace vcuda::client {

// What the mirror knows about one server-backed handle.
struct handle_info {
    handle_kind kind = handle_kind::none;
    uint64_t ctx = 0;    // the context it was created in
    int device = 0;      // client ordinal
    uint64_t owner = 0;  // module or library of a function/kernel; graph of a node or an executable graph
    std::string name;    // functions and kernels
    CUgraphNodeType node_type{};  // graph nodes
    std::shared_ptr<const param_layout> layout;
    // Libraries are context-independent: the image is kept so the library can be loaded into the session of
    // any other device it is used on (route()).
    std::shared_ptr<const std::vector<std::vector<std::byte>>> image_parts;
    uint64_t image_format = 0, image_hash = 0;
    // A memory alloc node's access descriptors, once asked for: cuGraphMemAllocNodeGetParams answers an array
    // that lives as long as the node.
    std::shared_ptr<const std::vector<CUmemAccessDesc>> node_access;
};

struct context_info {
    uint64_t id = 0;
    int device = 0;
    bool primary = false;
    unsigned flags = 0;
    unsigned long long uid = 0;  // cuCtxGetId
    uint64_t green = 0;          // cuCtxFromGreenCtx's: the green context (session handle) its calls name
    std::map<std::pair<uint64_t, uint64_t>, std::pair<void*, void (*)(CUcontext, void*, void*)>>
        cls;  // context-local storage
};

struct device_allocation {
    uint64_t base = 0;
    size_t size = 0;
    int device = 0;
    bool module_global = false;  // a __device__ variable of a module: copyable, never freed by cuMemFree
    bool managed = false;        // cuMemAllocManaged: the CPU reaches it too (client/managed.hpp)
    bool graph =
        false;  // a memory alloc node's: its address is its graph's, kept through frees (api_graph.cpp)
};

struct host_allocation {
    uintptr_t base = 0;
    size_t size = 0;
    unsigned flags = 0;
    bool registered = false;  // cuMemHostRegister (memory the application owns) vs cuMemHostAlloc
    // Pages shared with a server on this host (server/handlers_host.cpp): its address for them and the device
    // pointer the GPU reaches them by. Zero for memory only this process has.
    uint64_t server_addr = 0;
    uint64_t device_ptr = 0;
    class session* owner = nullptr;
    bool shared() const { return server_addr != 0; }
};

class state {
  public:
    static state& get();

    // Connects to the server once; later calls return the first call's answer.
    CUresult initialize(unsigned flags);
    CUresult init_status() const { return init_result_; }
    bool initialized() const { return init_result_ == CUDA_SUCCESS; }

    // The session serving the current context's device (the first session when no context is current).
    session& remote();
    int device_count() const { return static_cast<int>(devices_.size()); }
    size_t session_count() const { return sessions_.size(); }
    const server_device& device(int ordinal) const { return devices_[ordinal]; }
    // The client ordinal of GPU `server_index` of the session remote() gives; -1 when this process has none.
    int client_device(int server_index);
    // Every GPU of the sessions in the servers' order, also those CUDA_VISIBLE_DEVICES hides: what NVML
    // lists.
    const std::vector<server_device>& listed_devices() const { return listed_; }
    // The CUDA ordinal of listed_devices()[i], or -1 when CUDA_VISIBLE_DEVICES hides it.
    int cuda_ordinal_of_listed(size_t i) const;
    int attribute(int ordinal, int attr) const;

    // Contexts.
    uint64_t primary_context(int device);     // the id; the context exists from first use, retained or not
    context_info* find_context(uint64_t id);  // caller holds mu
    uint64_t create_context(int device, unsigned flags);
    // The CUcontext of green context `green` (cuCtxFromGreenCtx): a context of `device` whose calls name it
    // (Call.green_ctx), the same id each time; forgotten at cuGreenCtxDestroy.
    uint64_t green_context(uint64_t green, int device);
    void forget_green_context(uint64_t green);
    CUresult destroy_context(uint64_t id);
    void run_cls_destructors(context_info& c);

    // Server-backed handles. A graph node is its graph's, and a graph with an owner (a conditional node's
    // body, a child graph moved into its node) is that node's: forgetting one forgets what it owns.
    void adopt(uint64_t id, handle_info info);
    void forget(uint64_t id);
    // Graph `id` now belongs to node `node` (cuGraphAddNode with CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE).
    void give_graph(uint64_t id, uint64_t node);
    // True when graph node `node` lies in graph `top`, or in a graph owned (at any depth) by one of its
    // nodes: an executable graph of `top` holds it (conditional bodies, moved child graphs).
    bool node_within(uint64_t node, uint64_t top);
    bool lookup(uint64_t id, handle_info& out);
    // Changes what the mirror keeps for handle `id`; false when it has no such handle.
    bool amend(uint64_t id, const std::function<void(handle_info&)>& change);
    // The kind (and parameter layout) only, without copying the rest: for the per-launch checks.
    bool lookup_kind(uint64_t id, handle_kind& kind, std::shared_ptr<const param_layout>* layout = nullptr);
    bool known(uint64_t id, handle_kind k);
    // The id under which the session of the current device knows library/kernel/function `id` (which
    // another session minted), loading it there on first use. Other ids are returned unchanged.
    uint64_t route(uint64_t id);
    std::map<std::pair<uint64_t, uint32_t>, uint64_t>
        routes;  // (id, session tag) -> that session's id; under mu

    // Device allocations (the server's real addresses). False, and nothing kept, when the range overlaps
    // memory of another device: two servers handing out the same addresses (one address window, or none),
    // which this process could not tell apart.
    bool add_allocation(uint64_t base, size_t size, int device, bool module_global = false,
                        bool managed = false, bool graph = false);
    bool remove_allocation(uint64_t base, device_allocation& out);
    // The allocation holding [p, p+len); false when there is none (overflow-safe).
    bool find_allocation(uint64_t p, size_t len, device_allocation& out);
    // Whether [base, base+size) is reserved here by vcuda (not memory of the application's that was there
    // first): managed memory maps its CPU view over it.
    bool reserved(uint64_t base, size_t size);

    // What NVML reports as this process's use of client device `device`: the bytes of its allocations
    // (module globals excluded: they live in their module's memory) and whether it has a context there.
    void device_usage(int device, uint64_t& bytes, bool& has_context);

    // Host allocations made through the driver.
    void add_host(const host_allocation& h);
    bool remove_host(uintptr_t base, host_allocation& out);
    bool find_host(uintptr_t p, host_allocation& out);
    // The shared pinned allocation of `owner` whose pages the server knows at `server_addr` (false: none).
    bool find_host_shared_at(uint64_t server_addr, const session* owner, host_allocation& out);
    // Whether any host allocation or registration overlaps [lo, hi).
    bool host_overlaps(uintptr_t lo, uintptr_t hi);
    // The 8-byte words of `params` (a launch's parameter buffer) that point into pinned host memory only this
    // process has (not shared with a server on this host), which the GPU cannot reach: each word's offset in
    // `params` and that memory. Empty for most launches, without taking the lock.
    std::vector<std::pair<size_t, host_allocation>> private_host_words(std::span<const std::byte> params);

    // Images already sent to the server (by content hash).
    bool image_sent(uint64_t hash);
    void mark_image_sent(uint64_t hash);

    // The calls that made what is alive (client/journal.hpp).
    client::journal& journal() { return journal_; }

    std::shared_mutex mu;

  private:
    uint64_t add_context(int device, unsigned flags, uint64_t green);  // caller holds mu
    state() = default;

    std::once_flag once_;
    CUresult init_result_ = CUDA_ERROR_NOT_INITIALIZED;
    // Opens the sessions: one to VCUDA_SERVER, or one per GPU of a lease from VCUDA_MANAGER. `why` on
    // failure.
    bool connect_sessions(std::string& why);

    std::vector<std::unique_ptr<session>> sessions_;
    std::vector<server_device> devices_;  // by client ordinal, after CUDA_VISIBLE_DEVICES
    std::vector<server_device> listed_;   // before it
    void* lease_keeper_ = nullptr;  // mgmt::lease_keeper, alive until exit (released by an exit handler)
    std::vector<uint64_t> primary_;
    std::unordered_map<uint64_t, std::unique_ptr<context_info>> contexts_;
    uint32_t next_context_ = 1;
    std::unordered_map<uint64_t, handle_info> handles_;
    std::unordered_map<uint64_t, std::unordered_set<uint64_t>>
        dependents_;  // graph -> its nodes, node -> the graphs it owns (what the mirror knows)
    std::map<uint64_t, device_allocation> allocations_;
    std::map<uintptr_t, host_allocation> host_;
    // The span [lo, hi) of the entries of host_ that are not shared (lo >= hi: none), read without the lock
    // by every launch; kept under it by add_host and remove_host.
    std::atomic<uintptr_t> private_lo_{1}, private_hi_{0};
    void update_private_span();
    std::unordered_set<uint64_t> images_;
    client::journal journal_;
};

// The calling thread's current context (0 when none) and its context stack.
std::vector<uint64_t>& context_stack();
uint64_t current_context();
// The green context (session handle) the calling thread's current context stands for, else 0: one relaxed
// load while the process has none.
uint64_t current_green_context();
// The client ordinal of the current context's device, or -1.
int current_device();
// The context `ctx` current on this thread for the scope's duration: calls go to its device's session.
struct context_scope {
    explicit context_scope(uint64_t ctx) { context_stack().push_back(ctx); }
    ~context_scope() { context_stack().pop_back(); }
    context_scope(const context_scope&) = delete;
    context_scope& operator=(const context_scope&) = delete;
};

// Guard at the top of every entry point that needs cuInit to have succeeded.
#define VCUDA_REQUIRE_INIT()                                          \
    do {                                                              \
        auto& vcuda_st_ = ::vcuda::client::state::get();              \
        if (!vcuda_st_.initialized()) return vcuda_st_.init_status(); \
    } while (0)

// Maps NULL/legacy/per-thread stream handles for the _ptsz variants.
CUstream per_thread_stream(CUstream s);
// True while a stream capture is under way in this process (client/api_stream.cpp).
bool capture_under_way();

// What `call` answers when the memory a server gave overlaps another device's (state::add_allocation refused
// it; the caller has freed it there): logged with the reason and the fix, CUDA_ERROR_OUT_OF_MEMORY.
CUresult refuse_overlapping(uint64_t base, size_t size, int device, const char* call);

}  // namespace vcuda::client
