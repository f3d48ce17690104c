#include "client/state.hpp"

#include <atomic>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "common/log.hpp"
#include "mgmt/wire/lease.hpp"

namespace vcuda::client {

namespace {

constexpr uint64_t granule = 2ull << 20;

// Reservations in the application's address space, counted per 2 MiB granule, so that no host allocation
// can land where a device allocation lives (device pointers are the server's real addresses).
std::map<uint64_t, uint32_t> reserved_granules;  // guarded by state::mu

void reserve_range(uint64_t base, size_t size) {
    for (uint64_t g = base & ~(granule - 1); g < base + size; g += granule) {
        if (reserved_granules[g]++ == 0) {
            void* p = mmap(reinterpret_cast<void*>(g), granule, PROT_NONE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
            if (p == MAP_FAILED || p != reinterpret_cast<void*>(g)) {
                if (p != MAP_FAILED) munmap(p, granule);
                // Something of the application's already lives there; the pointers still work, only the
                // no-aliasing guarantee is lost for this range.
                VCUDA_LOG_DEBUG("could not reserve device range {:#x} in the local address space", g);
                reserved_granules[g] = 1u << 31;  // never unmapped: it is not ours
            }
        }
    }
}

void release_range(uint64_t base, size_t size) {
    for (uint64_t g = base & ~(granule - 1); g < base + size; g += granule) {
        auto it = reserved_granules.find(g);
        if (it == reserved_granules.end()) continue;
        if (it->second >= (1u << 31)) continue;
        if (--it->second == 0) {
            munmap(reinterpret_cast<void*>(g), granule);
            reserved_granules.erase(it);
        }
    }
}

std::chrono::milliseconds connect_timeout() {
    if (const char* t = std::getenv("VCUDA_CONNECT_TIMEOUT_MS"); t && *t)
        return std::chrono::milliseconds(std::atol(t));
    return std::chrono::milliseconds(5000);
}

}  // namespace

state& state::get() {
    static state* s = new state();  // never destroyed: other libraries' destructors may call us at exit
    return *s;
}

CUresult state::initialize(unsigned flags) {
    std::call_once(once_, [&] {
        log::init("vcuda-client", {},
                  "warn");  // an application's stderr is not ours: warnings and errors only
        std::string why;
        if (!connect_sessions(why)) {
            VCUDA_LOG_ERROR("cuInit: {}", why);
            init_result_ = CUDA_ERROR_NO_DEVICE;
            return;
        }
        primary_.resize(devices_.size());
        VCUDA_LOG_INFO("connected: {} device(s) from {} session(s), first: {}", devices_.size(),
                       sessions_.size(), devices_.empty() ? "-" : devices_[0].name);
        init_result_ = CUDA_SUCCESS;
    });
    return init_result_;
}

namespace {

std::string uuid_text(const std::array<unsigned char, 16>& b) {
    char s[64];
    std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                  b[14], b[15]);
    return s;
}

// CUDA_VISIBLE_DEVICES: ordinals or UUID prefixes, in the order given, up to the first that matches nothing.
std::vector<server_device> visible(std::vector<server_device> all) {
    const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!env) return all;
    std::vector<server_device> out;
    std::string list = env;
    size_t pos = 0;
    while (pos <= list.size()) {
        size_t comma = list.find(',', pos);
        std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? list.size() + 1 : comma + 1;
        while (!item.empty() && item.front() == ' ') item.erase(item.begin());
        const server_device* pick = nullptr;
        if (!item.empty() && std::all_of(item.begin(), item.end(), ::isdigit)) {
            size_t i = std::stoul(item);
            if (i < all.size()) pick = &all[i];
        } else if (item.rfind("GPU-", 0) == 0) {
            for (auto& d : all)
                if (uuid_text(d.uuid).rfind(item, 0) == 0) pick = &d;
        }
        if (!pick) break;
        out.push_back(*pick);
    }
    return out;
}

}  // namespace

bool state::connect_sessions(std::string& why) {
    std::vector<server_device> all;
    const char* manager = std::getenv("VCUDA_MANAGER");
    const char* addr = std::getenv("VCUDA_SERVER");
    if (manager && *manager && !(addr && *addr)) {
        auto ep = endpoint::parse(manager);
        if (!ep) {
            why = "VCUDA_MANAGER='" + std::string(manager) + "': " + ep.error();
            return false;
        }
        std::string bad;
        auto request = mgmt::lease_request_from_env(&bad);
        if (!bad.empty()) {
            why = bad;
            return false;
        }
        auto grant = mgmt::acquire_lease(*ep, request, connect_timeout());
        if (!grant) {
            why = "no lease from the manager at " + std::string(manager) + ": " + grant.error();
            return false;
        }
        if (grant->devices.size() > session::max_sessions) {
            why = "a lease of more than 16 GPUs is not supported";
            return false;
        }
        // One session per leased GPU: each carries that GPU's token, possibly on different servers.
        for (size_t i = 0; i < grant->devices.size(); ++i) {
            auto& g = grant->devices[i];
            std::unique_ptr<session> s;
            std::string last;
            for (auto& e : g.server_endpoints) {
                s = session::open(e, connect_timeout(), g.token, static_cast<uint32_t>(i), last);
                if (s) break;
            }
            if (!s) {
                why = "cannot reach the server of leased GPU " + g.uuid + ": " + last;
                return false;
            }
            for (auto& d : s->devices()) all.push_back(d);
            sessions_.push_back(std::move(s));
        }
        // The same order in every process of a job: each process takes a lease of its own, and the manager
        // may list two leases' GPUs in different orders (NCCL then finds two ranks on one GPU). Natively
        // CUDA numbers equal GPUs by PCI bus id; ties (GPUs of two hosts) by UUID.
        auto pci = [](const server_device& d) {
            return std::tuple(d.attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                              d.attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
                              d.attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID), d.uuid);
        };
        std::stable_sort(all.begin(), all.end(),
                         [&](const auto& a, const auto& b) { return pci(a) < pci(b); });
        // Renew while the process lives; the lease ends with it (the manager expires it).
        lease_keeper_ = new mgmt::lease_keeper(*ep, *grant, [](const std::string& reason) {
            VCUDA_LOG_ERROR("the GPU lease was lost: {}", reason);
        });
        // A process that exits normally hands its lease back at once; one that is killed lets it expire.
        static const pid_t owner = getpid();  // a forked child's exit must not hand back its parent's lease
        std::atexit([] {
            if (getpid() != owner) return;
            session::expect_disconnect();
            delete static_cast<mgmt::lease_keeper*>(state::get().lease_keeper_);
        });
    } else {
        if (!addr || !*addr) {
            why =
                "no vcuda server configured: set VCUDA_SERVER=host:port (or unix:/path) or "
                "VCUDA_MANAGER=host:port, "
                "or run the program with `vcuda run --server ADDR -- PROGRAM`";
            return false;
        }
        const char* token = std::getenv("VCUDA_TOKEN");
        auto s = session::open(addr, connect_timeout(), token ? token : "", 0, why);
        if (!s) return false;
        all = s->devices();
        sessions_.push_back(std::move(s));
    }
    listed_ = all;
    devices_ = visible(std::move(all));
    if (devices_.empty()) {
        why = "the server offers no GPU" +
              std::string(std::getenv("CUDA_VISIBLE_DEVICES") ? " visible under CUDA_VISIBLE_DEVICES" : "");
        return false;
    }
    return true;
}

int state::cuda_ordinal_of_listed(size_t i) const {
    if (i >= listed_.size()) return -1;
    for (size_t o = 0; o < devices_.size(); ++o)
        if (devices_[o].owner == listed_[i].owner && devices_[o].server_index == listed_[i].server_index)
            return static_cast<int>(o);
    return -1;
}

session& state::remote() {
    int d = current_device();
    return d >= 0 ? *devices_[d].owner : *devices_.front().owner;
}

int state::attribute(int ordinal, int attr) const {
    switch (attr) {
        // Managed memory is kept coherent as on a GPU without concurrent access (client/managed.hpp): the CPU
        // may touch it only while the device is idle, and the GPU cannot reach this process's pageable
        // memory. Programs read these to know that they must synchronize before touching managed memory.
        case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
        case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
        case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
        case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST:
            return 0;
        default:
            return device(ordinal).attribute(attr);
    }
}

// ---------------------------------------------------------------- contexts

uint64_t state::primary_context(int device) {
    std::unique_lock lock(mu);
    if (primary_[device] == 0) {
        auto c = std::make_unique<context_info>();
        c->id = make_handle(handle_kind::context, 1, next_context_++);
        c->device = device;
        c->primary = true;
        c->uid = next_context_;
        primary_[device] = c->id;
        contexts_[c->id] = std::move(c);
    }
    return primary_[device];
}

context_info* state::find_context(uint64_t id) {
    auto it = contexts_.find(id);
    return it == contexts_.end() ? nullptr : it->second.get();
}

uint64_t state::add_context(int device, unsigned flags, uint64_t green) {
    auto c = std::make_unique<context_info>();
    c->id = make_handle(handle_kind::context, 1, next_context_++);
    c->device = device;
    c->flags = flags;
    c->uid = next_context_;
    c->green = green;
    uint64_t id = c->id;
    contexts_[id] = std::move(c);
    return id;
}

uint64_t state::create_context(int device, unsigned flags) {
    std::unique_lock lock(mu);
    return add_context(device, flags, 0);
}

namespace {
// Bumped whenever a context is destroyed: a thread's remembered context -> device answer is then looked up
// again. (Context ids are never reused and a context's device never changes.)
std::atomic<uint64_t> contexts_destroyed{0};
std::atomic<int> green_contexts_live{0};
}  // namespace

uint64_t state::green_context(uint64_t green, int device) {
    std::unique_lock lock(mu);
    for (auto& [id, c] : contexts_)
        if (c->green == green) return id;
    green_contexts_live.fetch_add(1, std::memory_order_relaxed);
    return add_context(device, 0, green);
}

void state::forget_green_context(uint64_t green) {
    std::unique_ptr<context_info> c;
    {
        std::unique_lock lock(mu);
        auto it = std::find_if(contexts_.begin(), contexts_.end(),
                               [&](const auto& e) { return e.second->green == green; });
        if (it == contexts_.end()) return;
        c = std::move(it->second);
        contexts_.erase(it);
        contexts_destroyed.fetch_add(1, std::memory_order_release);
        green_contexts_live.fetch_sub(1, std::memory_order_relaxed);
    }
    run_cls_destructors(*c);
}

uint64_t current_green_context() {
    if (green_contexts_live.load(std::memory_order_relaxed) == 0) return 0;
    const uint64_t c = current_context();
    if (!c) return 0;
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    const context_info* info = st.find_context(c);
    return info ? info->green : 0;
}

void state::run_cls_destructors(context_info& c) {
    auto entries = std::move(c.cls);
    c.cls.clear();
    for (auto& [key, v] : entries)
        if (v.second)
            v.second(reinterpret_cast<CUcontext>(c.id), reinterpret_cast<void*>(key.second), v.first);
}

CUresult state::destroy_context(uint64_t id) {
    std::unique_ptr<context_info> c;
    {
        std::unique_lock lock(mu);
        auto it = contexts_.find(id);
        if (it == contexts_.end() || it->second->primary) return CUDA_ERROR_INVALID_CONTEXT;
        c = std::move(it->second);
        contexts_.erase(it);
        contexts_destroyed.fetch_add(1, std::memory_order_release);
    }
    run_cls_destructors(*c);
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- handles

namespace {
// Entries that belong to an owner and go with it: graph nodes, and graphs owned by a node.
bool dependent(const handle_info& info) {
    return info.owner && (info.kind == handle_kind::graph_node || info.kind == handle_kind::graph);
}

// Takes `id` (of `info`) out of its owner's dependents.
void unlink(std::unordered_map<uint64_t, std::unordered_set<uint64_t>>& dependents, uint64_t id,
            const handle_info& info) {
    if (!dependent(info)) return;
    if (auto o = dependents.find(info.owner); o != dependents.end()) o->second.erase(id);
}
}  // namespace

void state::adopt(uint64_t id, handle_info info) {
    std::unique_lock lock(mu);
    if (dependent(info)) dependents_[info.owner].insert(id);
    handles_[id] = std::move(info);
}

void state::forget(uint64_t id) {
    std::vector<uint64_t> gone{id};
    {
        std::unique_lock lock(mu);
        auto it = handles_.find(id);
        if (it == handles_.end()) return;
        unlink(dependents_, id, it->second);
        handles_.erase(it);
        // What it owned, at any depth (a graph's nodes, their bodies' nodes, ...).
        std::vector<uint64_t> doomed{id};
        while (!doomed.empty()) {
            const uint64_t d = doomed.back();
            doomed.pop_back();
            auto o = dependents_.find(d);
            if (o == dependents_.end()) continue;
            for (uint64_t x : o->second) {
                handles_.erase(x);
                doomed.push_back(x);
                gone.push_back(x);
            }
            dependents_.erase(o);
        }
    }
    for (uint64_t x : gone) journal_.ended(x);  // what the mirror forgets has ended
}

void state::give_graph(uint64_t id, uint64_t node) {
    std::unique_lock lock(mu);
    auto it = handles_.find(id);
    if (it == handles_.end() || it->second.kind != handle_kind::graph) return;
    unlink(dependents_, id, it->second);
    it->second.owner = node;
    dependents_[node].insert(id);
}

bool state::node_within(uint64_t node, uint64_t top) {
    std::shared_lock lock(mu);
    // node -> its graph -> that graph's owning node -> ... ; bounded, as a malformed chain must not loop.
    uint64_t at = node;
    for (int depth = 0; depth < 64; ++depth) {
        auto n = handles_.find(at);
        if (n == handles_.end() || n->second.kind != handle_kind::graph_node) return false;
        if (n->second.owner == top) return true;
        auto g = handles_.find(n->second.owner);
        if (g == handles_.end() || g->second.kind != handle_kind::graph || !g->second.owner) return false;
        at = g->second.owner;
    }
    return false;
}

bool state::lookup(uint64_t id, handle_info& out) {
    std::shared_lock lock(mu);
    auto it = handles_.find(id);
    if (it == handles_.end()) return false;
    out = it->second;
    return true;
}

bool state::amend(uint64_t id, const std::function<void(handle_info&)>& change) {
    std::unique_lock lock(mu);
    auto it = handles_.find(id);
    if (it == handles_.end()) return false;
    change(it->second);
    return true;
}

bool state::lookup_kind(uint64_t id, handle_kind& kind, std::shared_ptr<const param_layout>* layout) {
    std::shared_lock lock(mu);
    auto it = handles_.find(id);
    if (it == handles_.end()) return false;
    kind = it->second.kind;
    if (layout) *layout = it->second.layout;
    return true;
}

bool state::known(uint64_t id, handle_kind k) {
    std::shared_lock lock(mu);
    auto it = handles_.find(id);
    return it != handles_.end() && it->second.kind == k;
}

// ---------------------------------------------------------------- allocations

bool state::add_allocation(uint64_t base, size_t size, int device, bool module_global, bool managed,
                           bool graph) {
    std::unique_lock lock(mu);
    auto at = allocations_.find(base);
    if (at != allocations_.end()) return at->second.device == device;  // a module global looked up twice
    const uint64_t end = size > UINT64_MAX - base ? UINT64_MAX : base + size;
    auto it = allocations_.upper_bound(base);
    if (it != allocations_.begin()) {
        auto before = std::prev(it);
        if (before->second.device != device && before->first + before->second.size > base) return false;
    }
    for (; it != allocations_.end() && it->first < end; ++it)
        if (it->second.device != device) return false;
    allocations_[base] = device_allocation{base, size, device, module_global, managed, graph};
    reserve_range(base, size);
    return true;
}

bool state::reserved(uint64_t base, size_t size) {
    std::shared_lock lock(mu);
    for (uint64_t g = base & ~(granule - 1); g < base + size; g += granule) {
        auto it = reserved_granules.find(g);
        if (it == reserved_granules.end() || it->second >= (1u << 31)) return false;
    }
    return true;
}

bool state::remove_allocation(uint64_t base, device_allocation& out) {
    std::unique_lock lock(mu);
    auto it = allocations_.find(base);
    if (it == allocations_.end() || it->second.module_global || it->second.graph) return false;
    out = it->second;
    allocations_.erase(it);
    release_range(out.base, out.size);
    return true;
}

bool state::find_allocation(uint64_t p, size_t len, device_allocation& out) {
    std::shared_lock lock(mu);
    auto it = allocations_.upper_bound(p);
    if (it == allocations_.begin()) return false;
    --it;
    const auto& a = it->second;
    if (p - a.base >= a.size && !(a.size == 0 && p == a.base)) return false;
    out = a;
    if (len <= a.size - (p - a.base)) return true;
    // Ranges mapped back to back (the virtual memory API's chunks) can be used as one, as with the driver.
    uint64_t end = a.base + a.size;
    for (++it; it != allocations_.end() && it->first == end && it->second.device == a.device; ++it) {
        end += it->second.size;
        if (len <= end - p) return true;
    }
    return false;
}

void state::device_usage(int device, uint64_t& bytes, bool& has_context) {
    std::shared_lock lock(mu);
    bytes = 0;
    for (auto& [base, a] : allocations_)
        if (a.device == device && !a.module_global) bytes += a.size;
    has_context = false;
    for (auto& [id, c] : contexts_) has_context |= c->device == device;  // primary contexts included
}

int state::client_device(int server_index) {
    int found = -1;
    for (int d = 0; d < device_count(); ++d)
        if (devices_[d].owner == &remote() && devices_[d].server_index == server_index) found = d;
    return found;
}

void state::add_host(const host_allocation& h) {
    std::unique_lock lock(mu);
    host_[h.base] = h;
    update_private_span();
}

void state::update_private_span() {
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (const auto& [base, h] : host_)
        if (!h.shared()) {
            lo = std::min(lo, base);
            hi = std::max(hi, base + h.size);
        }
    private_lo_.store(lo, std::memory_order_relaxed);
    private_hi_.store(hi, std::memory_order_relaxed);
}

bool state::remove_host(uintptr_t base, host_allocation& out) {
    std::unique_lock lock(mu);
    auto it = host_.find(base);
    if (it == host_.end()) return false;
    out = it->second;
    host_.erase(it);
    update_private_span();
    return true;
}

std::vector<std::pair<size_t, host_allocation>> state::private_host_words(std::span<const std::byte> params) {
    std::vector<std::pair<size_t, host_allocation>> found;
    const uintptr_t lo = private_lo_.load(std::memory_order_relaxed);
    const uintptr_t hi = private_hi_.load(std::memory_order_relaxed);
    if (lo >= hi) return found;
    for (size_t at = 0; at + sizeof(uintptr_t) <= params.size(); at += sizeof(uintptr_t)) {
        uintptr_t p;
        std::memcpy(&p, params.data() + at, sizeof p);
        if (p < lo || p >= hi) continue;  // most launches end here, without the lock
        std::shared_lock lock(mu);
        auto it = host_.upper_bound(p);
        if (it == host_.begin()) continue;
        --it;
        if (p - it->second.base < it->second.size && !it->second.shared()) found.emplace_back(at, it->second);
    }
    return found;
}

bool state::find_host(uintptr_t p, host_allocation& out) {
    std::shared_lock lock(mu);
    auto it = host_.upper_bound(p);
    if (it == host_.begin()) return false;
    --it;
    if (p - it->second.base >= it->second.size) return false;
    out = it->second;
    return true;
}

bool state::find_host_shared_at(uint64_t server_addr, const session* owner, host_allocation& out) {
    std::shared_lock lock(mu);
    for (const auto& [base, h] : host_)  // few, and asked only by cuGraphMemcpyNodeGetParams
        if (h.shared() && h.owner == owner && server_addr - h.server_addr < h.size) {
            out = h;
            return true;
        }
    return false;
}

bool state::host_overlaps(uintptr_t lo, uintptr_t hi) {
    std::shared_lock lock(mu);
    auto it =
        host_.lower_bound(hi);  // the first starting at or after hi: the one before it is the last candidate
    if (it == host_.begin()) return false;
    --it;
    return it->second.base + it->second.size > lo;
}

// Images are cached per session: the key mixes in the session serving the current device.
bool state::image_sent(uint64_t hash) {
    uint64_t key = hash ^ (uint64_t{remote().tag()} << 56);
    std::shared_lock lock(mu);
    return images_.count(key) != 0;
}

void state::mark_image_sent(uint64_t hash) {
    uint64_t key = hash ^ (uint64_t{remote().tag()} << 56);
    std::unique_lock lock(mu);
    images_.insert(key);
}

// ---------------------------------------------------------------- per thread

std::vector<uint64_t>& context_stack() {
    thread_local std::vector<uint64_t> stack;
    return stack;
}

uint64_t current_context() {
    auto& s = context_stack();
    return s.empty() ? 0 : s.back();
}

int current_device() {
    uint64_t c = current_context();
    if (!c) return -1;
    // Asked several times per launch: the last answer of this thread, while no context was destroyed since.
    thread_local uint64_t last_ctx = 0, last_epoch = 0;
    thread_local int last_device = -1;
    uint64_t epoch = contexts_destroyed.load(std::memory_order_acquire);
    if (c == last_ctx && epoch == last_epoch) return last_device;
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    auto* info = st.find_context(c);
    last_ctx = c;
    last_epoch = epoch;
    last_device = info ? info->device : -1;
    return last_device;
}

CUstream per_thread_stream(CUstream s) {
    return s == nullptr ? reinterpret_cast<CUstream>(stream_per_thread) : s;
}

}  // namespace vcuda::client

// ---------------------------------------------------------------- routing between sessions

namespace vcuda::client {

CUresult load_parts(uint64_t t, uint64_t format, uint64_t hash,
                    const std::vector<std::span<const std::byte>>& parts,
                    uint64_t& handle);  // api_module.cpp

uint64_t state::route(uint64_t id) {
    if (sessions_.size() < 2) return id;
    uint32_t have = static_cast<uint32_t>(id >> 52) & 0xf, want = remote().tag();
    if (have == want) return id;
    {
        std::shared_lock lock(mu);
        auto it = routes.find({id, want});
        if (it != routes.end()) return it->second;
    }
    handle_info info;
    if (!lookup(id, info)) return id;
    uint64_t mapped = 0;
    if (info.kind == handle_kind::library && info.image_parts) {
        std::vector<std::span<const std::byte>> parts(info.image_parts->begin(), info.image_parts->end());
        if (load_parts(1, info.image_format, info.image_hash, parts, mapped) != CUDA_SUCCESS) return id;
    } else if (info.kind == handle_kind::kernel || info.kind == handle_kind::function) {
        uint64_t owner = route(info.owner);
        if (owner == info.owner) return id;
        call_reply rp;
        call_request rq;
        uint64_t arg = owner;
        std::span<const std::byte> name(reinterpret_cast<const std::byte*>(info.name.data()),
                                        info.name.size());
        rq.operation = info.kind == handle_kind::kernel ? op::library_get_kernel : op::kernel_get_function;
        rq.device = device(current_device() < 0 ? 0 : current_device()).server_index;
        rq.args = {&arg, 1};
        if (info.kind == handle_kind::kernel) rq.blobs = {&name, 1};
        lane* l = remote().this_thread_lane();
        if (!l || l->call(rq, rp) != 0 || rp.outs.empty()) return id;
        mapped = rp.outs[0];
    } else {
        return id;  // modules and their functions belong to one context, as in CUDA
    }
    std::unique_lock lock(mu);
    routes[{id, want}] = mapped;
    return mapped;
}

CUresult refuse_overlapping(uint64_t base, size_t size, int device, const char* call) {
    VCUDA_LOG_ERROR(
        "{}: device {}'s server gave memory at {:#x}-{:#x}, which overlaps memory of another device this "
        "process "
        "holds: their servers hand out the same addresses (one --address-window, or none), and this process "
        "could not tell the two apart; answered CUDA_ERROR_OUT_OF_MEMORY. Give each server its own "
        "--address-window",
        call, device, base, base + size);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

}  // namespace vcuda::client
