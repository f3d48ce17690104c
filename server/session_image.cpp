// Suspend and resume of a session: its GPU state is saved to this server's memory and given back to the
// driver (contexts destroyed, the memory's physical part released), then rebuilt in new contexts at the same
// device addresses, each handle id standing for the new driver object. The gate (enter_call/leave_call) makes
// sure no call runs meanwhile; a suspended session is rebuilt by its next call.
//
// What is rebuilt: device memory (cuMemAlloc: contents and addresses; the reservations stay while suspended),
// modules and libraries (from the images and JIT options they were loaded with), their functions, kernels and
// modules (by name) with their settable attributes, module globals the client looked up (contents; a global
// the driver places elsewhere is reported, and its old address is sent to the new one), streams (flags and
// priority), events (flags), context limits and cache configuration, shared pinned host memory (registered
// again), the application's own VMM use (server/vmm_image.cpp), CUDA arrays and mipmapped arrays
// (server/array_image.cpp), texture and surface objects at the values kernels hold (the same file), CUDA
// graphs and executable graphs (server/graph_image.cpp), allocations of the devices' default pools and of
// the pools the application made that the session serves (device memory of the session:
// server/handlers_pool.cpp), those pools with their settable attributes. What is not yet: other pools the
// application made (shareable, size-limited) and their allocations, link states in progress, memory of other
// sessions (IPC), CUDA user objects: a session holding any of them is not suspended, and the caller is told
// which.
#include "server/session_image.hpp"

#include <array>
#include <condition_variable>
#include <thread>

#include "common/log.hpp"
#include "ops.hpp"
#include "server/device_output.hpp"
#include "server/jit.hpp"
#include "server/kernel_args.hpp"
#include "server/launch_attributes.hpp"
#include "server/session.hpp"

namespace vcuda::server {

namespace {

constexpr std::array<CUlimit, 7> saved_limits = {
    CU_LIMIT_STACK_SIZE,
    CU_LIMIT_PRINTF_FIFO_SIZE,
    CU_LIMIT_MALLOC_HEAP_SIZE,
    CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
    CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
    CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
    CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
};

// Function attributes an application may set (cuFuncSetAttribute); the others are properties of the code.
constexpr std::array<CUfunction_attribute, 7> settable_attributes = {
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH,
    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
    CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
};

// Attributes of int of a pool the application made (the release threshold, 64 bits, goes on its own).
constexpr std::array<CUmemPool_attribute, 3> settable_pool_attributes = {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
};

// The order in which entries are made again: what owns comes before what it owns.
int rebuild_rank(const handle_entry& e) {
    switch (e.kind) {
        case handle_kind::module:
            return e.owned ? 1 : 0;  // a library's module after its library
        case handle_kind::library:
            return 0;
        case handle_kind::kernel:
            return 2;
        case handle_kind::function:
            return 3;
        case handle_kind::stream:
        case handle_kind::event:
            return 4;
        case handle_kind::mem_pool:  // a device's default pool, or one of the application's it serves
            return e.owned || (e.made_with[0] & pool_allocations::served_by_session) ? 4 : -1;
        default:
            return -1;
    }
}

// What a session holds that cannot be rebuilt yet, or empty.
const char* not_rebuilt(const handle_entry& e) {
    switch (e.kind) {
        // A device's default pool stands for the new one's, and a pool the application made that the session
        // serves is made again (the memory of both is the session's).
        case handle_kind::mem_pool:
            return e.owned || (e.made_with[0] & pool_allocations::served_by_session)
                       ? nullptr
                       : "a memory pool the application made shareable (IPC), limited in size or for a "
                         "special use";
        case handle_kind::link_state:
            return "a link in progress";
        case handle_kind::green_ctx:
        case handle_kind::resource_desc:
            return "a green context (an SM partition)";
        default:
            return nullptr;
    }
}

// How long a suspend or a move waits for the session's GPU work before it gives up. Work may wait for the
// application itself (a stream callback whose thread, or a thread it started, waits at the closed gate): the
// gate must open again rather than wait for ever.
constexpr std::chrono::milliseconds drain_limit{2000};

// True when `layout` is the one the driver reports through `query(i, &offset, &size)`: a moved session's
// functions come with the layouts its sender knew, and a launch packed at a shorter one than the kernel's
// would hand the driver a parameter array it reads past.
template <class Query>
bool driver_layout_is(const param_layout* layout, Query&& query) {
    if (!layout) return true;  // none: its launches are refused (kernel_args::set)
    param_layout reported;
    return driver_param_layout(query, reported) == CUDA_SUCCESS &&
           reported.params.size() < max_kernel_params && reported.params == layout->params;
}

}  // namespace

// The synchronize runs on a thread of its own, so that the caller can give up on it; that thread ends when
// the work does (at the latest when the session ends: its callbacks then return at once). What the kernels
// printed the driver writes on that thread, which is no lane's: kept for the client.
CUresult session::drain_within(std::chrono::milliseconds limit, std::string& why) {
    if (drain_) {
        std::lock_guard earlier(drain_->mu);
        if (!drain_->done) {
            why = "its GPU work is still running since an earlier suspend or move gave up on it";
            return CUDA_ERROR_NOT_READY;
        }
    }
    auto st = std::make_shared<drain_state>();
    drain_ = st;
    std::vector<CUcontext> contexts;
    for (auto& s : devices_)
        if (s.ctx) contexts.push_back(s.ctx);
    std::thread([st, contexts, &d = api(), self = weak_from_this()] {
        CUresult rc = CUDA_SUCCESS;
        std::string printed;
        {
            device_output::capture to_client(printed);
            for (CUcontext c : contexts) {
                if (rc != CUDA_SUCCESS) break;
                d.cuCtxSetCurrent(c);
                rc = d.cuCtxSynchronize();
            }
            d.cuCtxSetCurrent(nullptr);
        }
        if (auto s = self.lock()) s->hold_output(printed);
        std::lock_guard lock(st->mu);
        st->rc = rc;
        st->done = true;
        st->cv.notify_all();
    }).detach();
    std::unique_lock lock(st->mu);
    if (!st->cv.wait_for(lock, limit, [&] { return st->done; })) {
        why = "its GPU work did not finish within " + std::to_string(limit.count()) +
              " ms (long kernels, or stream callbacks waiting for the application)";
        return CUDA_ERROR_NOT_READY;
    }
    if (st->rc != CUDA_SUCCESS) {
        why = "its GPU work failed (" + error_text(st->rc) + "); the session stays as it is";
        return st->rc;
    }
    return CUDA_SUCCESS;
}

void session::wait_for_drain() {
    if (!drain_) return;
    std::unique_lock lock(drain_->mu);
    drain_->cv.wait(lock, [&] { return drain_->done; });
}

CUresult session::enter_call(std::string& why) {
    for (;;) {
        active_.fetch_add(1);
        if (!closed_.load() && !suspended_.load()) {
            last_call_.store(std::chrono::steady_clock::now().time_since_epoch().count());
            return CUDA_SUCCESS;
        }
        if (active_.fetch_sub(1) == 1) {
            std::lock_guard lock(gate_mu_);
            gate_cv_.notify_all();
        }
        std::unique_lock lock(gate_mu_);
        gate_cv_.wait(lock, [&] { return !closed_.load(); });
        if (moved_.load()) {  // nothing of it is here any more (server/session_transfer.cpp)
            why = "the session moved to " + moved_to_;
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        if (!suspended_.load()) continue;
        // Suspended: this call brings the session back before it runs.
        if (CUresult rc = rebuild_through_gate(lock, why); rc != CUDA_SUCCESS) return rc;
    }
}

void session::leave_call() {
    if (active_.fetch_sub(1) == 1 && closed_.load()) {
        std::lock_guard lock(gate_mu_);
        gate_cv_.notify_all();
    }
}

CUresult session::close_gate(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds wait,
                             std::string& why) {
    if (lanes.load() == 0) {
        why = "the session is ending";
        return CUDA_ERROR_NOT_READY;
    }
    if (!gate_cv_.wait_for(lock, wait, [&] { return !closed_.load(); })) {
        why = "a suspend or resume of the session is already under way";
        return CUDA_ERROR_NOT_READY;
    }
    closed_.store(true);
    if (!gate_cv_.wait_for(lock, wait, [&] { return active_.load() == 0; })) {
        closed_.store(false);
        gate_cv_.notify_all();
        why = "calls were still running after " + std::to_string(wait.count()) + " ms";
        return CUDA_ERROR_NOT_READY;
    }
    return CUDA_SUCCESS;
}

CUresult session::suspend(std::chrono::milliseconds wait, std::string& why) {
    std::unique_lock lock(gate_mu_);
    if (suspended_.load()) return CUDA_SUCCESS;
    if (CUresult rc = close_gate(lock, wait, why); rc != CUDA_SUCCESS) return rc;
    lock.unlock();
    auto t0 = std::chrono::steady_clock::now();
    CUresult rc = save_and_release(why);
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    if (rc == CUDA_SUCCESS) {
        counters.suspends.add(std::chrono::steady_clock::now() - t0);
        note_ = "suspended: " + std::to_string(image_->bytes >> 20) + " MiB of GPU state saved in " +
                std::to_string(ms) + " ms";
        VCUDA_LOG_INFO("session {} {}, the GPU given back", id_, note_);
    } else {
        note_ = "not suspended: " + why;
    }
    closed_.store(false);
    gate_cv_.notify_all();
    return rc;
}

CUresult session::resume(std::string& why) {
    std::unique_lock lock(gate_mu_);
    gate_cv_.wait(lock, [&] { return !closed_.load(); });
    if (moved_.load()) {
        why = "the session moved to " + moved_to_;
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (!suspended_.load()) return CUDA_SUCCESS;
    return rebuild_through_gate(lock, why);
}

CUresult session::relocate(size_t index, size_t gpu, std::chrono::milliseconds wait, std::string& why) {
    if (!allowed(index) || gpu >= drv_->gpus().size()) {
        why = "it has no device " + std::to_string(index) + ", or this server no GPU " + std::to_string(gpu);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    const size_t from = gpu_of(index);
    if (from == gpu) return CUDA_SUCCESS;
    if (auto other = device_on(gpu)) {  // not `index`: that one runs on `from`
        why = "its device " + std::to_string(*other) + " runs on GPU " + std::to_string(gpu) + " already";
        return CUDA_ERROR_INVALID_DEVICE;
    }
    // The gate stays closed from the save to the rebuild: a call in between would rebuild on the old GPU. A
    // suspend or resume under way goes first; gate_mu_ is held from then until the gate is closed.
    std::unique_lock lock(gate_mu_);
    if (!gate_cv_.wait_for(lock, wait, [&] { return !closed_.load(); })) {
        why = "a suspend or resume of the session is already under way";
        return CUDA_ERROR_NOT_READY;
    }
    if (moved_.load()) {
        why = "the session moved to " + moved_to_;
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    auto t0 = std::chrono::steady_clock::now();
    if (!suspended_.load()) {
        if (CUresult rc = close_gate(lock, wait, why); rc != CUDA_SUCCESS) return rc;
        lock.unlock();
        CUresult rc = save_and_release(why);
        lock.lock();
        if (rc != CUDA_SUCCESS) {
            note_ = "not moved to GPU " + std::to_string(gpu) + ": " + why;
            closed_.store(false);
            gate_cv_.notify_all();
            return rc;
        }
    } else {  // suspended already: rebuilt on the other GPU, as a resume would
        closed_.store(true);
        gate_cv_.wait(lock, [&] { return active_.load() == 0; });
    }
    auto point_at = [&](size_t g) {
        std::lock_guard m(mu);
        auto& s = devices_[index];
        s.gpu = g;
        s.device = drv_->gpus()[g].device;
        s.memory->set_device(s.device);
        set_peers();
    };
    point_at(gpu);
    const uint64_t bytes = image_ ? image_->bytes : 0;  // the rebuild lets the saved image go
    lock.unlock();
    CUresult rc = rebuild(why);
    if (rc != CUDA_SUCCESS) {
        VCUDA_LOG_WARN("session {}: not rebuilt on GPU {} ({}); back to GPU {}", id_, gpu, why, from);
        point_at(from);
        std::string again;
        if (rebuild(again) != CUDA_SUCCESS)
            VCUDA_LOG_ERROR("session {}: not rebuilt on GPU {} either ({}): its next call tries again", id_,
                            from, again);
        why = "not rebuilt on GPU " + std::to_string(gpu) + " (" + why + "); it stays on GPU " +
              std::to_string(from);
    }
    lock.lock();
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    note_ = rc == CUDA_SUCCESS ? "moved from GPU " + std::to_string(from) + " to GPU " + std::to_string(gpu) +
                                     " of this server: " + std::to_string(bytes >> 20) +
                                     " MiB of GPU state, paused " + std::to_string(ms) + " ms"
                               : why;
    if (rc == CUDA_SUCCESS) {
        counters.migrations.add(std::chrono::steady_clock::now() - t0);
        VCUDA_LOG_INFO("session {}: device {} {}", id_, index, note_);
    }
    closed_.store(false);
    gate_cv_.notify_all();
    return rc;
}

CUresult session::rebuild_through_gate(std::unique_lock<std::mutex>& lock, std::string& why) {
    closed_.store(true);
    gate_cv_.wait(lock, [&] { return active_.load() == 0; });
    lock.unlock();
    CUresult rc = rebuild(why);
    lock.lock();
    note_ = rc == CUDA_SUCCESS ? rebuilt_note_ : why;
    closed_.store(false);
    gate_cv_.notify_all();
    return rc;
}

CUresult session::save_and_release(std::string& why, device_memory::save_mode memory) {
    output_for_client printed(*this);  // the driver may write kernels' printf on this thread too (its copies)
    auto& d = api();
    std::lock_guard lock(mu);
    std::string blocker;
    bool graphs = false;  // user objects are kept only without them (below)
    handles.for_each([&](uint64_t, handle_entry& e) {
        graphs = graphs || e.kind == handle_kind::graph || e.kind == handle_kind::graph_exec;
        if (const char* what = not_rebuilt(e); what && blocker.empty()) blocker = what;
        if (e.kind == handle_kind::event && e.made_by != static_cast<uint32_t>(op::cuEventCreate) &&
            blocker.empty())
            blocker = "an event not made by cuEventCreate";
        // Checked before the synchronize below, which would end the capture with an error.
        if (e.kind == handle_kind::stream && e.raw && blocker.empty() &&
            capture_status(d, static_cast<CUstream>(e.raw)) != CU_STREAM_CAPTURE_STATUS_NONE)
            blocker = "a stream capture under way";
    });
    for (auto& [id, a] : vmm.allocations_)
        if (a.foreign) blocker = "memory of another session mapped with the VMM API (IPC)";
    if (std::any_of(pools.allocations_.begin(), pools.allocations_.end(),
                    [](const auto& a) { return !a.second.windowed; }))
        blocker = "stream-ordered allocations of a pool the application made";
    if (std::string objects = objects_blocker(); !objects.empty()) blocker = objects;
    if (!ipc_state.empty()) blocker = "memory or events shared with other sessions (IPC)";
    {
        // The driver keeps user objects through the context's release
        // (tests/gpu/probes/user_object_context.cpp), so the application's stay valid; graphs holding them
        // are not made again with their references yet.
        std::lock_guard objects(user_objects_mu);
        if (!user_objects.empty() && graphs) blocker = "CUDA user objects and graphs";
    }
    if (!blocker.empty()) {
        why = "the session holds " + blocker + ", which suspend does not rebuild yet";
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    // Pending work first: what is saved must be what the application's calls so far have made.
    if (CUresult rc = drain_within(drain_limit, why); rc != CUDA_SUCCESS) return rc;
    settle_stream_frees(true);  // their events are the old context's; their streams are done
    for (auto& s : devices_) s.memory->drop_spares();  // kept for allocations to come: not worth saving
    // Copies left under way for the client keep their bytes here until it collects them.
    deferred.land_all(d);
    auto img = std::make_unique<session_image>();
    img->devices.resize(devices_.size());
    for (size_t i = 0; i < devices_.size(); ++i) {
        auto& s = devices_[i];
        if (!s.ctx) continue;
        auto& ds = img->devices[i];
        ds.had_context = true;
        d.cuCtxSetCurrent(s.ctx);
        for (CUlimit l : saved_limits)
            if (size_t v = 0; d.cuCtxGetLimit(&v, l) == CUDA_SUCCESS) ds.limits.emplace_back(l, v);
        d.cuCtxGetCacheConfig(&ds.cache_config);
        if (CUresult rc = s.memory->save(ds.memory, memory); rc != CUDA_SUCCESS) {
            d.cuCtxSetCurrent(nullptr);
            why = "its memory could not be copied out (" + error_text(rc) + ")";
            return rc;
        }
        for (auto& m : ds.memory) {
            img->bytes += m.size;
            if (m.fd() >= 0) img->handed_over += m.size;
        }
    }
    auto current_for = [&](size_t device) -> bool {
        if (device >= devices_.size() || !devices_[device].ctx) return false;
        d.cuCtxSetCurrent(devices_[device].ctx);
        return true;
    };
    for (auto& [key, g] : globals.globals_) {
        if (!current_for(key.second)) continue;
        session_image::global_state gs{key.first, g.size, key.second, g.owner, g.name, {}, g.managed};
        gs.bytes.resize(g.size);
        if (CUresult rc = d.cuMemcpyDtoH_v2(gs.bytes.data(), key.first, g.size); rc != CUDA_SUCCESS) {
            d.cuCtxSetCurrent(nullptr);
            why = "global " + g.name + " could not be copied out (" + error_text(rc) + ")";
            return rc;
        }
        img->bytes += g.size;
        img->globals.push_back(std::move(gs));
    }
    if (CUresult rc = save_vmm(*img, why, memory); rc != CUDA_SUCCESS) {
        d.cuCtxSetCurrent(nullptr);
        return rc;
    }
    if (CUresult rc = save_arrays(*img, why); rc != CUDA_SUCCESS) {
        d.cuCtxSetCurrent(nullptr);
        return rc;
    }
    if (CUresult rc = save_graphs(*img, why); rc != CUDA_SUCCESS) {
        d.cuCtxSetCurrent(nullptr);
        return rc;
    }
    // A reference point behind everything the session did, for the ages of its events.
    std::vector<CUevent> reference(devices_.size(), nullptr);
    for (size_t i = 0; i < devices_.size(); ++i)
        if (current_for(i) && d.cuEventCreate(&reference[i], CU_EVENT_DEFAULT) == CUDA_SUCCESS) {
            d.cuEventRecord(reference[i], nullptr);
            d.cuEventSynchronize(reference[i]);
        }
    CUresult rc = CUDA_SUCCESS;
    handles.for_each([&](uint64_t id, handle_entry& e) {
        if (rc != CUDA_SUCCESS || rebuild_rank(e) < 0) return;
        session_image::entry_state es;
        es.id = id;
        current_for(static_cast<size_t>(e.device));
        switch (e.kind) {
            case handle_kind::module:
            case handle_kind::library:
                if (!e.owned && !origins.find(id)) {
                    rc = CUDA_ERROR_NOT_SUPPORTED;
                    why = "a module was loaded in a way that cannot be repeated";
                }
                break;
            case handle_kind::function: {
                const char* name = nullptr;
                rc = d.cuFuncGetName(&name, static_cast<CUfunction>(e.raw));
                if (rc == CUDA_SUCCESS && name) es.name = name;
                for (auto a : settable_attributes)
                    if (int v = 0;
                        d.cuFuncGetAttribute(&v, a, static_cast<CUfunction>(e.raw)) == CUDA_SUCCESS)
                        es.attributes.emplace_back(a, v);
                break;
            }
            case handle_kind::kernel: {
                const char* name = nullptr;
                rc = d.cuKernelGetName(&name, static_cast<CUkernel>(e.raw));
                if (rc == CUDA_SUCCESS && name) es.name = name;
                CUdevice dev = devices_[static_cast<size_t>(e.device)].device;
                for (auto a : settable_attributes)
                    if (int v = 0;
                        d.cuKernelGetAttribute(&v, a, static_cast<CUkernel>(e.raw), dev) == CUDA_SUCCESS)
                        es.attributes.emplace_back(a, v);
                break;
            }
            case handle_kind::stream:
                rc = d.cuStreamGetFlags(static_cast<CUstream>(e.raw), &es.flags);
                if (rc == CUDA_SUCCESS)
                    rc = d.cuStreamGetPriority(static_cast<CUstream>(e.raw), &es.priority);
                for (auto a : settable_stream_attributes)
                    if (CUstreamAttrValue v{};
                        rc == CUDA_SUCCESS && d.cuStreamGetAttribute &&
                        d.cuStreamGetAttribute(static_cast<CUstream>(e.raw), a, &v) == CUDA_SUCCESS)
                        es.stream_attributes.emplace_back(a, v);
                break;
            case handle_kind::mem_pool:  // one the application made: its settable attributes
                if (!e.owned) {
                    auto pool = static_cast<CUmemoryPool>(e.raw);
                    for (auto a : settable_pool_attributes)
                        if (int v = 0;
                            rc == CUDA_SUCCESS && (rc = d.cuMemPoolGetAttribute(pool, a, &v)) == CUDA_SUCCESS)
                            es.attributes.emplace_back(a, v);
                    if (rc == CUDA_SUCCESS)
                        rc = d.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                                     &es.release_threshold);
                }
                break;
            case handle_kind::event: {
                es.flags = static_cast<unsigned>(e.made_with[0]);
                // An event without timing cannot say whether it was recorded: it is recorded again at the
                // resume, as one that completed. One with timing was recorded when it has a time.
                es.recorded = (es.flags & CU_EVENT_DISABLE_TIMING) != 0;
                auto dev = static_cast<size_t>(e.device);
                if (float ms = 0;
                    !es.recorded && dev < reference.size() && reference[dev] &&
                    d.cuEventElapsedTime(&ms, static_cast<CUevent>(e.raw), reference[dev]) == CUDA_SUCCESS) {
                    es.recorded = true;
                    es.age_ms = ms + event_times.age(id);
                }
                break;
            }
            default:
                break;
        }
        if (rc != CUDA_SUCCESS && why.empty())
            why = "the driver did not describe handle " + std::to_string(id);
        img->entries.push_back(std::move(es));
    });
    for (size_t i = 0; i < reference.size(); ++i)
        if (reference[i] && current_for(i)) d.cuEventDestroy_v2(reference[i]);
    if (rc != CUDA_SUCCESS) {
        d.cuCtxSetCurrent(nullptr);
        return rc;
    }
    std::stable_sort(img->entries.begin(), img->entries.end(), [&](auto& a, auto& b) {
        return rebuild_rank(*handles.find(a.id, kind_of(a.id))) <
               rebuild_rank(*handles.find(b.id, kind_of(b.id)));
    });
    for (auto& [addr, r] : host.regions_) img->host_regions.emplace_back(addr, r.size);
    image_ = std::move(img);
    if (memory == device_memory::save_mode::none) {  // a pre-copied move reads the memory, then releases
        d.cuCtxSetCurrent(nullptr);
        return CUDA_SUCCESS;
    }
    release_gpu_state();
    suspended_.store(true);
    epoch_.fetch_add(1);
    return CUDA_SUCCESS;
}

void session::release_gpu_state() {
    auto& d = api();
    release_vmm_physical();  // while the contexts exist
    release_arrays();
    release_graphs();
    // Shared host pages stay mapped (the client uses them); only their registration goes with the contexts.
    CUcontext any = nullptr;
    for (auto& s : devices_)
        if (s.ctx && !any) any = s.ctx;
    if (any) {
        d.cuCtxSetCurrent(any);
        for (auto& [addr, r] : host.regions_) {
            if (r.last_copy) {
                std::lock_guard mark(r.last_copy->mu);
                if (r.last_copy->event) d.cuEventDestroy_v2(r.last_copy->event);
                r.last_copy->event = nullptr;
                r.last_copy->ctx = nullptr;
            }
            unregister_host_pages(addr);
        }
    }
    // Dependents before what they depend on: events and streams, then modules and libraries (their functions,
    // kernels and modules go with them).
    for (int pass = 0; pass < 2; ++pass)
        handles.for_each([&](uint64_t id, handle_entry& e) {
            if (!e.raw) return;
            auto dev = static_cast<size_t>(e.device);
            if (dev < devices_.size() && devices_[dev].ctx) d.cuCtxSetCurrent(devices_[dev].ctx);
            if (pass == 0 && e.kind == handle_kind::event) d.cuEventDestroy_v2(static_cast<CUevent>(e.raw));
            if (pass == 0 && e.kind == handle_kind::stream)
                d.cuStreamDestroy_v2(static_cast<CUstream>(e.raw));
            if (pass == 1 && !e.owned && e.kind == handle_kind::module)
                d.cuModuleUnload(static_cast<CUmodule>(e.raw));
            if (pass == 1 && !e.owned && e.kind == handle_kind::library)
                d.cuLibraryUnload(static_cast<CUlibrary>(e.raw));
            if (pass == 1 && !e.owned && e.kind == handle_kind::mem_pool && rebuild_rank(e) >= 0)
                d.cuMemPoolDestroy(static_cast<CUmemoryPool>(e.raw));  // it holds nothing: made again
            if (pass == 1 && rebuild_rank(e) >= 0) handles.rebind(id, nullptr);
        });
    for (auto& s : devices_) {
        if (!s.ctx) continue;
        d.cuCtxSetCurrent(s.ctx);
        bulk_->forget_context(s.ctx);
        s.memory->drop_physical();
        d.cuCtxSetCurrent(nullptr);
        d.cuCtxDestroy_v2(s.ctx);
        s.ctx = nullptr;
    }
}

CUresult session::rebuild(std::string& why) {
    auto& d = api();
    auto t0 = std::chrono::steady_clock::now();
    std::lock_guard lock(mu);
    auto& img = *image_;
    auto failed = [&](CUresult rc, const std::string& what) {
        why = "the session could not be resumed: " + what + " (" + error_text(rc) + "); it stays suspended";
        VCUDA_LOG_ERROR("session {}: {}", id_, why);
        release_gpu_state();
        d.cuCtxSetCurrent(nullptr);
        return rc;
    };
    for (size_t i = 0; i < devices_.size(); ++i) {
        auto& ds = img.devices[i];
        if (!ds.had_context) continue;
        CUresult rc;
        CUcontext ctx = context_locked(i, rc);
        if (!ctx) return failed(rc, "no context on GPU " + std::to_string(i));
        d.cuCtxSetCurrent(ctx);
        for (auto [l, v] : ds.limits) d.cuCtxSetLimit(l, v);
        d.cuCtxSetCacheConfig(ds.cache_config);
        if (rc = devices_[i].memory->restore(ds.memory); rc != CUDA_SUCCESS)
            return failed(rc, "its memory on GPU " + std::to_string(i) + " could not be mapped again");
    }
    auto current_for = [&](size_t device) {
        if (device < devices_.size() && devices_[device].ctx) d.cuCtxSetCurrent(devices_[device].ctx);
    };
    if (!img.host_regions.empty()) {
        current_for(0);
        for (auto [addr, size] : img.host_regions)
            if (CUresult rc =
                    d.cuMemHostRegister_v2(reinterpret_cast<void*>(addr), size, host_regions::register_flags);
                rc != CUDA_SUCCESS)
                return failed(rc, "its shared host memory could not be registered again");
    }
    if (std::string what; CUresult rc = rebuild_vmm(img, what)) return failed(rc, what);
    if (std::string what; CUresult rc = rebuild_arrays(img, what)) return failed(rc, what);
    if (std::string what; CUresult rc = rebuild_objects(what)) return failed(rc, what);
    for (auto& es : img.entries) {
        handle_entry* e = handles.find(es.id, kind_of(es.id));
        if (!e) continue;
        auto device = static_cast<size_t>(e->device);
        current_for(device);
        void* raw = nullptr;
        void* owner = nullptr;
        handle_entry* owner_entry = nullptr;
        if (e->owner) {
            owner_entry = handles.find(e->owner, kind_of(e->owner));
            owner = owner_entry ? owner_entry->raw : nullptr;
        }
        CUresult rc = CUDA_SUCCESS;
        switch (e->kind) {
            case handle_kind::module:
            case handle_kind::library:
                if (e->owned) {
                    CUmodule m = nullptr;
                    rc = d.cuLibraryGetModule(&m, static_cast<CUlibrary>(owner));
                    raw = m;
                } else if (auto* o = origins.find(es.id)) {
                    jit_request jit;
                    std::string bad;
                    if (rc = jit.parse(o->jit_options, bad); rc == CUDA_SUCCESS)
                        rc = load_image(d, o->library, o->format, *o->parts, jit, raw);
                }
                break;
            case handle_kind::kernel: {
                CUkernel k = nullptr;
                rc = d.cuLibraryGetKernel(&k, static_cast<CUlibrary>(owner), es.name.c_str());
                raw = k;
                for (auto [a, v] : es.attributes)
                    if (int now = 0; rc == CUDA_SUCCESS &&
                                     d.cuKernelGetAttribute(&now, static_cast<CUfunction_attribute>(a), k,
                                                            devices_[device].device) == CUDA_SUCCESS &&
                                     now != v)
                        d.cuKernelSetAttribute(static_cast<CUfunction_attribute>(a), v, k,
                                               devices_[device].device);
                break;
            }
            case handle_kind::function: {
                CUfunction f = nullptr;
                if (owner_entry && owner_entry->kind == handle_kind::kernel)
                    rc = d.cuKernelGetFunction(&f, static_cast<CUkernel>(owner));
                else
                    rc = d.cuModuleGetFunction(&f, static_cast<CUmodule>(owner), es.name.c_str());
                raw = f;
                for (auto [a, v] : es.attributes)
                    if (int now = 0;
                        rc == CUDA_SUCCESS &&
                        d.cuFuncGetAttribute(&now, static_cast<CUfunction_attribute>(a), f) == CUDA_SUCCESS &&
                        now != v)
                        d.cuFuncSetAttribute(f, static_cast<CUfunction_attribute>(a), v);
                break;
            }
            case handle_kind::stream: {
                CUstream s = nullptr;
                rc = d.cuStreamCreateWithPriority(&s, es.flags, es.priority);
                for (auto& [a, v] : es.stream_attributes)  // those that differ from a new stream's
                    if (CUstreamAttrValue now{}; rc == CUDA_SUCCESS && d.cuStreamGetAttribute &&
                                                 d.cuStreamSetAttribute &&
                                                 d.cuStreamGetAttribute(s, a, &now) == CUDA_SUCCESS &&
                                                 !same_launch_attribute(a, now, v))
                        rc = d.cuStreamSetAttribute(s, a, &v);
                raw = s;
                break;
            }
            case handle_kind::mem_pool: {
                CUmemoryPool pool = nullptr;
                if (e->owned) {
                    rc = d.cuDeviceGetDefaultMemPool(&pool, devices_[device].device);
                } else {  // one the application made, served by the session: as handle_pool_create made it
                    CUmemPoolProps props{};
                    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
                    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
                    props.location = {CU_MEM_LOCATION_TYPE_DEVICE, devices_[device].device};
                    rc = d.cuMemPoolCreate(&pool, &props);
                    for (auto [a, v] : es.attributes)
                        if (rc == CUDA_SUCCESS)
                            rc = d.cuMemPoolSetAttribute(pool, static_cast<CUmemPool_attribute>(a), &v);
                    if (rc == CUDA_SUCCESS)
                        rc = d.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                                     &es.release_threshold);
                }
                raw = pool;
                break;
            }
            case handle_kind::event: {
                CUevent ev = nullptr;
                rc = d.cuEventCreate(&ev, es.flags);
                if (rc == CUDA_SUCCESS && es.recorded) rc = d.cuEventRecord(ev, nullptr);
                if (rc == CUDA_SUCCESS && es.recorded && !(es.flags & CU_EVENT_DISABLE_TIMING))
                    event_times.set(es.id, es.age_ms);
                raw = ev;
                break;
            }
            default:
                break;
        }
        if (rc != CUDA_SUCCESS)
            return failed(rc, "handle " + std::to_string(es.id) + " could not be made again");
        // A moved session's functions and kernels came with the layouts its sender knew: the driver's, or
        // none.
        const bool kernel = e->kind == handle_kind::kernel;
        if (img.moved_in && (kernel || e->kind == handle_kind::function) &&
            !driver_layout_is(e->layout.get(), [&](size_t i, size_t* o, size_t* s) {
                return kernel ? d.cuKernelGetParamInfo(static_cast<CUkernel>(raw), i, o, s)
                              : d.cuFuncGetParamInfo(static_cast<CUfunction>(raw), i, o, s);
            }))
            return failed(CUDA_ERROR_INVALID_VALUE,
                          std::string(to_string(e->kind)) + " " + es.name +
                              " came with another parameter layout than the driver's");
        handles.rebind(es.id, raw);
    }
    // Globals: contents back; one the driver placed elsewhere keeps its contents at its new address, and the
    // old one is no longer the session's: kernel parameters and copies naming it are sent to the new one
    // (module_globals::relocate).
    for (auto& g : img.globals) {
        handle_entry* owner = handles.find(g.owner, kind_of(g.owner));
        if (!owner) continue;
        current_for(g.device);
        CUdeviceptr p = 0;
        size_t size = 0;
        const auto lib = static_cast<CUlibrary>(owner->raw);
        CUresult rc =
            owner->kind != handle_kind::library
                ? d.cuModuleGetGlobal_v2(&p, &size, static_cast<CUmodule>(owner->raw), g.name.c_str())
            : g.managed ? d.cuLibraryGetManaged(&p, &size, lib, g.name.c_str())
                        : d.cuLibraryGetGlobal(&p, &size, lib, g.name.c_str());
        if (rc == CUDA_SUCCESS && size == g.size) rc = d.cuMemcpyHtoD_v2(p, g.bytes.data(), g.size);
        if (rc != CUDA_SUCCESS) return failed(rc, "global " + g.name + " could not be restored");
        if (p != g.address) {
            VCUDA_LOG_WARN(
                "session {}: global {} moved from {:#x} to {:#x} when its module was loaded again; kernel "
                "parameters and copies naming the old address are given the new one",
                id_, g.name, g.address, p);
            globals.globals_.erase({g.address, g.device});
            globals.add(p, g.size, g.owner, g.device, g.name, g.managed);
            globals.relocate(g.address, p, g.size, g.owner);
        }
    }
    if (std::string what; CUresult rc = rebuild_graphs(img, what)) return failed(rc, what);
    d.cuCtxSetCurrent(nullptr);
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    rebuilt_note_ = "resumed: " + std::to_string(img.bytes >> 20) + " MiB of GPU state rebuilt in " +
                    std::to_string(ms) + " ms";
    VCUDA_LOG_INFO("session {} {}", id_, rebuilt_note_);
    counters.resumes.add(std::chrono::steady_clock::now() - t0);
    // Giving a large image's host memory back to the system takes a while (0.4 s for 10 GiB on the H200,
    // between a moved session's rebuild and its answer): on a thread of its own, so that the session goes on
    // meanwhile.
    std::thread([old = std::move(image_)]() mutable { old.reset(); }).detach();
    suspended_.store(false);
    epoch_.fetch_add(1);
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
