#include "server/session.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <tuple>
#include "common/log.hpp"
#include "common/random.hpp"
#include "server/handlers_array.hpp"
#include "server/handlers_ipc.hpp"
#include "server/session_image.hpp"

namespace vcuda::server {

session::session(uint64_t id, std::string key, driver& drv, const server_options& opts,
                 const session_grant& grant, std::string peer)
    : id_(id),
      key_(std::move(key)),
      drv_(&drv),
      opts_(opts),
      peer_(std::move(peer)),
      lease_id_(grant.lease_id),
      tenant_(grant.tenant),
      bulk_(std::make_unique<bulk_hub>(drv.api(), id)) {
    // Device indices are the server's GPU indices, or a moved session's own (grant.placed), which may reach
    // past this server's GPUs: the slots in between are not allowed.
    const size_t slots = grant.placed.empty() ? drv.gpus().size()
                                              : std::max(drv.gpus().size(), grant.placed.rbegin()->first + 1);
    for (size_t i = 0; i < slots; ++i) {
        device_slot s;
        if (grant.placed.empty()) {
            s.gpu = i;
            s.allowed =
                grant.gpus.empty() || std::find(grant.gpus.begin(), grant.gpus.end(), i) != grant.gpus.end();
        } else {
            auto p = grant.placed.find(i);
            s.allowed = p != grant.placed.end();
            s.gpu = s.allowed ? p->second : std::min(i, drv.gpus().size() - 1);
        }
        auto& g = drv.gpus()[s.gpu];
        s.device = g.device;
        uint64_t want = grant.memory_quota ? grant.memory_quota : opts.memory_quota;
        uint64_t q = want ? std::min<uint64_t>(want, g.total_memory) : g.total_memory;
        s.memory = std::make_unique<device_memory>(drv.api(), g.device, q, opts.window.get());
        devices_.push_back(std::move(s));
    }
    set_peers();
}

void session::set_peers() {
    // Memory on one GPU is reachable from the session's GPUs that are its peers, as cuMemAlloc's is once peer
    // access is enabled (and by peer copies): the mappings are made accessible to them.
    auto& d = drv_->api();
    for (auto& s : devices_) {
        if (!s.allowed || !d.cuDeviceCanAccessPeer) continue;
        std::vector<CUdevice> peers;
        for (auto& o : devices_)
            if (int can = 0; o.allowed && o.device != s.device &&
                             d.cuDeviceCanAccessPeer(&can, o.device, s.device) == CUDA_SUCCESS && can)
                peers.push_back(o.device);
        s.memory->set_peers(std::move(peers));
    }
}

session::~session() { release_all(); }

uint64_t session::quota(size_t device) const { return devices_[device].memory->quota(); }

CUcontext session::context(size_t device, CUresult& rc) {
    std::lock_guard lock(mu);
    return context_locked(device, rc);
}

CUcontext session::context_locked(size_t device, CUresult& rc) {
    auto& s = devices_[device];
    rc = CUDA_SUCCESS;
    if (s.ctx) return s.ctx;
    auto& d = api();
    if (d.cuCtxCreate_v4)
        rc = d.cuCtxCreate_v4(&s.ctx, nullptr, 0, s.device);
    else if (d.cuCtxCreate_v2)
        rc = d.cuCtxCreate_v2(&s.ctx, 0, s.device);
    else
        rc = CUDA_ERROR_NOT_SUPPORTED;
    if (rc != CUDA_SUCCESS) {
        VCUDA_LOG_ERROR("session {}: cannot create a context on GPU {} (error {})", id_, device,
                        static_cast<int>(rc));
        s.ctx = nullptr;
        return nullptr;
    }
    if (d.cuCtxPopCurrent_v2) d.cuCtxPopCurrent_v2(nullptr);  // lanes choose their current context per call
    return s.ctx;
}

CUcontext session::first_context(CUresult& rc) {
    for (size_t i = 0; i < devices_.size(); ++i)
        if (devices_[i].allowed) return context(i, rc);
    rc = CUDA_ERROR_NO_DEVICE;
    return nullptr;
}

CUcontext session::existing_first_context() {
    std::lock_guard lock(mu);
    for (auto& s : devices_)
        if (s.allowed) return s.ctx;
    return nullptr;
}

void session::hold_output(const std::string& printed) {
    if (printed.empty()) return;
    static constexpr std::string_view dropped =
        "\n[vcuda: device printf output beyond 4 MiB held for the client was dropped]\n";
    std::lock_guard lock(held_output_mu_);
    // A client that does not call for long: the rest goes, said once where it stops.
    if (held_output_.size() >= device_output::capture::limit) return;
    const size_t room = device_output::capture::limit - held_output_.size();
    held_output_.append(printed, 0, room);
    if (printed.size() > room) held_output_.append(dropped);
    has_held_output_.store(true);
}

std::string session::take_held_output() {
    if (!has_held_output_.load()) return {};
    std::lock_guard lock(held_output_mu_);
    has_held_output_.store(false);
    return std::exchange(held_output_, {});
}

bool session::owns_range(CUdeviceptr p, size_t n) {
    std::lock_guard lock(mu);
    return owns_range_locked(p, n);
}

bool session::owns_range_locked(CUdeviceptr p, size_t n) {
    for (auto& s : devices_)
        if (s.memory->contains(p, n)) return true;
    auto& mapped = vmm.mapped_;
    if (auto m = mapped.upper_bound(p); m != mapped.begin()) {
        --m;
        if (p - m->first < m->second.size) {  // mappings back to back count as one range, as with the driver
            uint64_t end = m->first + m->second.size;
            for (++m; n > end - p && m != mapped.end() && m->first == end; ++m) end += m->second.size;
            if (n <= end - p) return true;
        }
    }
    if (auto a = pools.allocations_.upper_bound(p); a != pools.allocations_.begin()) {
        --a;
        if (p - a->first < a->second.size && n <= a->second.size - (p - a->first)) return true;
    }
    return globals.holds(p, n) || ipc_state.holding(p, n) != nullptr || graph_memory.holds(p, n);
}

void session::settle_stream_frees(bool wait) {
    auto& d = api();
    // A stream's frees complete in the order they were made: past its first one not done, none is asked.
    std::vector<CUstream> busy;
    std::erase_if(pools.pending(), [&](const pool_allocations::pending_free& f) {
        if (std::find(busy.begin(), busy.end(), f.stream) != busy.end()) return false;
        CUresult rc = wait ? d.cuEventSynchronize(f.done) : d.cuEventQuery(f.done);
        if (rc == CUDA_ERROR_NOT_READY) {
            busy.push_back(f.stream);
            return false;
        }
        // Done, or its stream failed: the memory goes back either way (the error is the application's to see
        // in its own calls).
        d.cuEventDestroy_v2(f.done);
        if (f.device < devices_.size()) devices_[f.device].memory->release(f.p, /*spare=*/f.size > 0);
        pools.gave_back(f);
        return true;
    });
    if (pools.pending().empty()) pools.maybe_pending.store(false, std::memory_order_relaxed);
}

CUcontext session::green_context(uint64_t id) {
    std::lock_guard lock(mu);
    auto it = green_contexts.find(id);
    return it == green_contexts.end() ? nullptr : it->second;
}

void session::synchronize_any_context() {
    auto& d = api();
    for (auto& s : devices_)
        if (s.ctx) {
            d.cuCtxSetCurrent(s.ctx);
            d.cuCtxSynchronize();  // nothing in flight may still use what the caller frees
            return;
        }
}

void session::release_vmm() {
    auto& d = api();
    std::lock_guard lock(mu);
    if (vmm.mapped_.empty() && vmm.reserved_.empty() && vmm.allocations_.empty()) return;
    synchronize_any_context();
    // Suspended, the physical memory is gone already (server/vmm_image.cpp): only reservations are left.
    if (!vmm.physical_released_)
        for (auto& [va, m] : vmm.mapped_) d.cuMemUnmap(va, m.size);
    vmm.mapped_.clear();
    // Window ranges go back to the window, unless the session moved: its addresses are its new server's now
    // (kept when it moved, as for its device memory).
    for (auto& [va, r] : vmm.reserved_)
        if (!r.windowed)
            d.cuMemAddressFree(va, r.size);
        else if (!moved())
            window()->give_back(va, r.size);
    vmm.reserved_.clear();
    handles.for_each([&](uint64_t, handle_entry& e) {
        if (e.kind != handle_kind::mem_handle || !e.raw) return;
        d.cuMemRelease(reinterpret_cast<CUmemGenericAllocationHandle>(e.raw));
    });
    vmm.physical_released_ = false;
    for (auto& [id, a] : vmm.allocations_)
        if (!a.foreign) devices_[a.device].memory->credit(a.size);
    vmm.allocations_.clear();
}

void session::release_device(size_t device) {
    auto& d = api();
    auto& s = devices_[device];
    std::lock_guard lock(mu);
    if (s.ctx) {
        d.cuCtxSetCurrent(s.ctx);
        d.cuCtxSynchronize();  // nothing may still use what is freed below (errors: the context is going
                               // anyway)
        bulk_->forget_context(s.ctx);
    }
    deferred.land_all(d);  // their bytes kept for the client; events and pinned pages go before the context
    // Stream-ordered allocations go back to their pools before pools are destroyed; those of the default
    // pool are the device memory released below, and the events of their frees go before the context.
    std::erase_if(pools.pending_, [&](const pool_allocations::pending_free& f) {
        if (f.device != device) return false;
        if (s.ctx) d.cuEventDestroy_v2(f.done);
        return true;
    });
    pools.figures_.erase(device);
    for (auto it = pools.allocations_.begin(); it != pools.allocations_.end();) {
        if (it->second.device != device) {
            ++it;
            continue;
        }
        if (it->second.windowed) {
            it = pools.allocations_.erase(it);
            continue;
        }
        if (s.ctx) d.cuMemFree_v2(it->first);
        if (!it->second.imported) s.memory->credit(it->second.size);  // an import is charged to its exporter
        it = pools.allocations_.erase(it);
    }
    // What the device's pools kept reserved goes with its context.
    for (auto& [pool, r] : pools.retention_) {
        if (r.device != device) continue;
        s.memory->credit(r.kept);
        r.kept = 0;
    }
    // IPC: exports of the device's objects withdrawn, opened memory unmapped, shared events left.
    release_ipc(*this, device);
    // Dependents first: events and streams, then functions/kernels (owned), then modules and libraries.
    std::vector<std::pair<uint64_t, handle_entry>> doomed;
    handles.for_each([&](uint64_t id, handle_entry& e) {
        if (static_cast<size_t>(e.device) == device) doomed.emplace_back(id, e);
    });
    auto destroy = [&](handle_kind k) {
        for (auto& [id, e] : doomed) {
            if (e.kind != k || e.owned) continue;
            switch (k) {
                case handle_kind::event:
                    d.cuEventDestroy_v2(static_cast<CUevent>(e.raw));
                    break;
                case handle_kind::stream:
                    d.cuStreamDestroy_v2(static_cast<CUstream>(e.raw));
                    break;
                case handle_kind::module:
                    d.cuModuleUnload(static_cast<CUmodule>(e.raw));
                    break;
                case handle_kind::library:
                    d.cuLibraryUnload(static_cast<CUlibrary>(e.raw));
                    break;
                case handle_kind::graph_exec:
                    d.cuGraphExecDestroy(static_cast<CUgraphExec>(e.raw));
                    break;
                case handle_kind::graph:
                    d.cuGraphDestroy(static_cast<CUgraph>(e.raw));
                    break;
                case handle_kind::mem_pool:
                    d.cuMemPoolDestroy(static_cast<CUmemoryPool>(e.raw));
                    pools.forget_made_pool(id);
                    break;
                case handle_kind::link_state:
                    d.cuLinkDestroy(static_cast<CUlinkState>(e.raw));
                    break;
                case handle_kind::green_ctx:
                    d.cuGreenCtxDestroy(static_cast<CUgreenCtx>(e.raw));
                    green_contexts.erase(id);
                    break;
                default:
                    break;
            }
        }
    };
    // Texture and surface objects before the arrays they read; arrays give their bytes back to the quota.
    for (auto it = arrays.objects.begin(); it != arrays.objects.end();) {
        if (it->first.first != device) {
            ++it;
            continue;
        }
        if (s.ctx) (it->second.surface ? d.cuSurfObjectDestroy : d.cuTexObjectDestroy)(it->first.second);
        it = arrays.objects.erase(it);
    }
    for (auto& [id, e] : doomed) {
        if (e.kind != handle_kind::array && e.kind != handle_kind::mipmapped_array) continue;
        if (s.ctx) destroy_driver_array(d, e);
        if (auto a = arrays.arrays.find(id); a != arrays.arrays.end()) {
            s.memory->credit(a->second.bytes);
            arrays.arrays.erase(a);
        }
    }
    if (s.ctx) {
        destroy(handle_kind::graph_exec);  // graphs use kernels of modules: before them
        for (auto& [id, e] : doomed)
            if (e.kind == handle_kind::graph_exec) graph_execs.forget(d, id);  // and the clones kept for them
        destroy(handle_kind::graph);
        destroy(handle_kind::event);
        destroy(handle_kind::stream);
        destroy(handle_kind::mem_pool);
        destroy(handle_kind::module);
        destroy(handle_kind::library);
        destroy(handle_kind::link_state);
        destroy(handle_kind::green_ctx);  // after the streams and events made in them
    }
    // The device's module globals go with its context; those of its modules and libraries in other devices'
    // contexts go with the libraries.
    for (auto& [id, e] : doomed) {
        handles.erase(id);
        links.erase(id);
        origins.erase(id);
        globals.erase_owner(id);
    }
    globals.erase_device(device);
    s.memory->release_all();
    if (s.ctx) {
        d.cuCtxSetCurrent(nullptr);
        d.cuCtxDestroy_v2(s.ctx);
        s.ctx = nullptr;
        epoch_.fetch_add(1);  // other lanes' threads may have it current, and staging registered in it
    }
}

void session::attach(frame_stream* fs) {
    std::lock_guard lock(lanes_mu_);
    streams_.push_back(fs);
}

void session::detach(frame_stream* fs) {
    std::lock_guard lock(lanes_mu_);
    std::erase(streams_, fs);
}

void session::host_func_started(uint64_t id, bool in_graph) {
    std::lock_guard lock(hf_mu_);
    hf_started_.emplace_back(id, in_graph);
    hf_cv_.notify_all();
}

bool session::host_func_next(uint64_t& id, bool& in_graph, const std::function<bool()>& client_gone) {
    std::unique_lock lock(hf_mu_);
    while (!hf_cv_.wait_for(lock, std::chrono::milliseconds(100),
                            [&] { return hf_stopped_ || !hf_started_.empty(); }))
        if (client_gone && client_gone()) return false;
    if (hf_started_.empty()) return false;
    std::tie(id, in_graph) = hf_started_.front();
    hf_started_.pop_front();
    return true;
}

void session::host_func_done(uint64_t id) {
    std::lock_guard lock(hf_mu_);
    hf_done_.insert(id);
    hf_cv_.notify_all();
}

void session::host_func_wait(uint64_t id) {
    std::unique_lock lock(hf_mu_);
    hf_cv_.wait(lock, [&] { return hf_stopped_ || hf_done_.count(id); });
    hf_done_.erase(id);
}

void session::stop_host_funcs() {
    std::lock_guard lock(hf_mu_);
    hf_stopped_ = true;
    hf_cv_.notify_all();
}

void session::lane_progress(uint32_t lane, uint64_t seq) {
    std::lock_guard lock(progress_mu_);
    progress_[lane] = seq;
    if (!gone_lanes_.empty()) gone_lanes_.erase(lane);  // a lane number used again
    if (progress_waiters_) progress_cv_.notify_all();
}

uint64_t session::progress_of(uint32_t lane) {
    std::lock_guard lock(progress_mu_);
    auto it = progress_.find(lane);
    return it == progress_.end() ? 0 : it->second;
}

void session::lane_gone(uint32_t lane) {
    std::lock_guard lock(progress_mu_);
    progress_.erase(lane);
    gone_lanes_.insert(lane);
    progress_cv_.notify_all();
}

bool session::wait_for_lane(uint32_t lane, uint64_t seq, const std::function<bool()>& client_gone) {
    std::unique_lock lock(progress_mu_);
    ++progress_waiters_;
    bool ok = false;
    const auto since = std::chrono::steady_clock::now();
    bool told = false;
    for (;;) {
        auto it = progress_.find(lane);
        if (it != progress_.end() && it->second >= seq) {
            ok = true;
            break;
        }
        // A lane that has not started yet (its frames are still on their way) is waited for; one that ended
        // never runs the call, and a session that ends stops the wait.
        {
            std::lock_guard l2(lanes_mu_);
            if (ending_) break;
        }
        if (it == progress_.end() && gone_lanes_.count(lane)) break;
        if (client_gone && client_gone()) break;  // nobody waits for this call any more
        if (!told && std::chrono::steady_clock::now() - since > std::chrono::seconds(5)) {
            told = true;  // a long wait says what it waits for, once: a lane that never comes is a hang
            VCUDA_LOG_WARN("session {}: a call has waited 5 s for lane {} to run its call {}; {}", id_, lane,
                           seq,
                           it == progress_.end() ? std::string("that lane has run nothing here")
                                                 : "it has run " + std::to_string(it->second));
        }
        progress_cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
    --progress_waiters_;
    return ok;
}

void session::end(const std::string& why) {
    stop_host_funcs();
    std::lock_guard lock(lanes_mu_);
    ending_ = true;
    if (!streams_.empty()) VCUDA_LOG_INFO("session {}: ending it: {}", id_, why);
    for (auto* fs : streams_) fs->shutdown();
}

bool session::owns_host(uintptr_t p, size_t n) {
    std::lock_guard lock(mu);
    return host.holding(p, n) != nullptr;
}

std::shared_ptr<copy_mark> session::host_copy_mark(uintptr_t p, size_t n) {
    std::lock_guard lock(mu);
    host_regions::region* r = host.holding(p, n);
    if (!r) return nullptr;
    if (!r->last_copy) r->last_copy = std::make_shared<copy_mark>(api());
    return r->last_copy;
}

copy_mark::~copy_mark() {
    if (event) drv.cuEventDestroy_v2(event);
}

void* session::map_host_pages(int fd, size_t size) {
    if (void* p = opts_.host_addresses ? opts_.host_addresses->map(fd, size) : nullptr) return p;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? nullptr : p;
}

bool session::map_host_pages_at(uintptr_t addr, int fd, size_t size) {
    if (opts_.host_addresses && opts_.host_addresses->map_at(addr, fd, size)) return true;
    void* want = reinterpret_cast<void*>(addr);
    void* p = ::mmap(want, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (p == want) return true;
    if (p != MAP_FAILED) ::munmap(p, size);
    return false;
}

void session::unmap_host_pages(uintptr_t addr, size_t size) {
    // The pages of a session that moved away live on at these addresses: they are not handed out again.
    if (!opts_.host_addresses || !opts_.host_addresses->unmap(addr, size, !moved_.load()))
        ::munmap(reinterpret_cast<void*>(addr), size);
}

void session::unregister_host_pages(uintptr_t addr) {
    auto& d = api();
    relaxed_capture_scope relaxed(d);
    if (CUresult rc = d.cuMemHostUnregister(reinterpret_cast<void*>(addr)); rc != CUDA_SUCCESS)
        VCUDA_LOG_WARN("session {}: unregistering pinned pages at {:#x} failed with error {}", id_, addr,
                       static_cast<int>(rc));
}

void session::release_host_regions() {
    std::lock_guard lock(mu);
    if (host.regions_.empty()) return;
    synchronize_any_context();  // the regions are portable: any context will do to unregister them
    for (auto& [addr, r] : host.regions_) {
        unregister_host_pages(addr);
        unmap_host_pages(addr, r.size);
        if (r.fd >= 0) ::close(r.fd);
    }
    host.regions_.clear();
    host.bytes_ = 0;
}

void session::release_all() {
    stop_host_funcs();  // the client is gone: callbacks still queued on streams return at once
    {
        std::lock_guard lock(mu);
        wait_for_drain();  // a synchronize a suspend gave up on, before the contexts go
    }
    release_user_objects();  // destructors of objects graphs still hold come when the graphs go
    release_host_regions();  // while the contexts still exist
    drop_host_copies(true);
    release_vmm();
    for (size_t i = 0; i < devices_.size(); ++i) release_device(i);
    deferred.clear(api());
    std::lock_guard lock(mu);
    images.clear();
    if (opts_.ipc) opts_.ipc->drop_owner(id_);  // what is left of its exports (physical allocations)
    ipc_state = ipc_tables{};
}

std::shared_ptr<session> session_registry::create(driver& drv, const server_options& opts,
                                                  const session_grant& grant, const std::string& peer) {
    // Ids and keys from the OS CSPRNG: one session's must tell nothing about another's (a seeded library
    // generator let a client that opened a few hundred sessions compute the next tenant's secret).
    std::lock_guard lock(mu_);
    uint64_t id;
    do id = os_random_u64() & 0x7fffffffffffffffULL;
    while (id == 0 || sessions_.count(id));
    auto s = std::make_shared<session>(id, os_random_bytes(session_key_bytes), drv, opts, grant, peer);
    sessions_[id] = s;
    return s;
}

std::shared_ptr<session> session_registry::adopt(uint64_t id, std::string key, driver& drv,
                                                 const server_options& opts, const session_grant& grant,
                                                 const std::string& peer) {
    std::lock_guard lock(mu_);
    if (sessions_.count(id)) return nullptr;
    auto s = std::make_shared<session>(id, std::move(key), drv, opts, grant, peer);
    sessions_[id] = s;
    return s;
}

std::shared_ptr<session> session_registry::find(uint64_t id, std::string_view key) {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || !equal_constant_time(it->second->key(), key)) return nullptr;
    return it->second;
}

bool session_registry::forget_moved_away(uint64_t id, std::string_view key) {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || !it->second->moved() || !equal_constant_time(it->second->key(), key))
        return false;
    sessions_.erase(it);  // its counters are added when its last connection goes (remove finds it gone)
    return true;
}

void session_registry::remove(uint64_t id, const session* which) {
    std::lock_guard lock(mu_);
    if (auto it = sessions_.find(id); it != sessions_.end() && it->second.get() == which) {
        it->second->counters.add_to(ended_);  // under the same lock as the erase: no scrape sees it twice
        sessions_.erase(it);
    }
}

size_t session_registry::size() {
    std::lock_guard lock(mu_);
    return sessions_.size();
}

void session_registry::add_counters(session_counters& sum) {
    std::lock_guard lock(mu_);
    ended_.add_to(sum);
    for (auto& [id, s] : sessions_) s->counters.add_to(sum);
}

void session_counters::add_to(session_counters& sum) const {
    constexpr auto relaxed = std::memory_order_relaxed;
    sum.calls.fetch_add(calls.load(relaxed), relaxed);
    for (auto [from, to] : {std::pair{&suspends, &sum.suspends}, std::pair{&resumes, &sum.resumes},
                            std::pair{&migrations, &sum.migrations}}) {
        to->count.fetch_add(from->count.load(relaxed), relaxed);
        to->micros.fetch_add(from->micros.load(relaxed), relaxed);
    }
}

}  // namespace vcuda::server
