// The slots of vcuda's private export table (client/private_table.hpp): this process's use of each device,
// answered from the mirror, and the physical GPU's live state, fetched with op gpu_status.
// runs on: any thread. gpu_status queries run on one worker thread with a lane of its own, so that a caller
// waits no longer than its timeout however slow the server is, and a query never queues behind the
// application's own calls on its thread's lane.
#include "client/private_table.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>

#include "client/state.hpp"

namespace vcuda::client {
namespace {

struct status_query {
    const server_device* device = nullptr;
    bool done = false;
    int result = CUDA_SUCCESS;
    gpu_status status;
};

// Decodes op gpu_status's reply (layout: common/gpu_status.hpp). Fields a different server version did not
// send stay unanswered.
int decode(const call_reply& rp, gpu_status& st) {
    if (rp.outs.empty() || rp.blobs.size() < 3) return CUDA_ERROR_UNKNOWN;
    size_t sent = std::min(rp.outs.size() - 1, gpu_field_count);
    st.answered = rp.outs[0] & (sent == 64 ? ~uint64_t{0} : (uint64_t{1} << sent) - 1);
    std::copy_n(rp.outs.begin() + 1, sent, st.values);
    auto text = [&](size_t i, char* dst, size_t cap) {
        size_t n = std::min(rp.blobs[i].size(), cap - 1);
        std::memcpy(dst, rp.blobs[i].data(), n);
        dst[n] = '\0';
    };
    text(0, st.driver_version, sizeof st.driver_version);
    text(1, st.nvml_version, sizeof st.nvml_version);
    text(2, st.serial, sizeof st.serial);
    if (rp.blobs.size() > 3) {  // the NVLinks' far ends, one per line
        std::string_view rest(reinterpret_cast<const char*>(rp.blobs[3].data()), rp.blobs[3].size());
        size_t n = 0;
        for (size_t end; n < std::size(st.nvlink_remote) && (end = rest.find('\n')) != std::string_view::npos;
             rest.remove_prefix(end + 1), ++n) {
            const size_t k = std::min(end, sizeof st.nvlink_remote[0] - 1);
            std::memcpy(st.nvlink_remote[n], rest.data(), k);
            st.nvlink_remote[n][k] = '\0';
        }
        if (st.has(gpu_field::nvlinks) && st.get(gpu_field::nvlinks) > n) st.set(gpu_field::nvlinks, n);
    }
    return CUDA_SUCCESS;
}

class status_worker {
  public:
    static status_worker& get() {
        static auto* w =
            new status_worker();  // never destroyed: its thread may still wait on the server at exit
        return *w;
    }

    int query(const server_device& dev, gpu_status& out, std::chrono::milliseconds timeout) {
        std::unique_lock lock(mu_);
        std::shared_ptr<status_query> q;
        if (worker_pid_ != getpid()) queue_.clear();  // a forked child: those queries belong to the parent
        for (auto& p : queue_)
            if (p->device == &dev) q = p;  // asked for already (maybe in flight): wait for that one
        if (!q) {
            q = std::make_shared<status_query>();
            q->device = &dev;
            queue_.push_back(q);
            if (worker_pid_ !=
                getpid()) {  // not started yet, or this is a forked child: the worker stayed behind
                worker_pid_ = getpid();
                std::thread([this] { run(); }).detach();
            }
            wake_.notify_one();
        }
        if (!done_.wait_for(lock, timeout, [&] { return q->done; })) return CUDA_ERROR_TIMEOUT;
        out = q->status;
        return q->result;
    }

  private:
    void run() {
        std::unique_lock lock(mu_);
        for (;;) {
            wake_.wait(lock, [&] { return !queue_.empty(); });
            auto q = queue_.front();  // stays queued while in flight, so that callers for its device join it
            lock.unlock();
            gpu_status st;
            int rc = fetch(*q->device, st);
            lock.lock();
            q->status = st;
            q->result = rc;
            q->done = true;
            queue_.pop_front();
            done_.notify_all();
        }
    }

    // On this thread's lane to the session that serves the device.
    static int fetch(const server_device& dev, gpu_status& st) {
        lane* l = dev.owner->this_thread_lane();
        if (!l) return connection_lost_result;
        uint64_t arg = static_cast<uint64_t>(dev.server_index);
        call_request rq;
        rq.operation = op::gpu_status;
        rq.device = -1;  // no context needed: an NVML-only process (nvidia-smi) never creates one
        rq.args = {&arg, 1};
        call_reply rp;
        if (int rc = l->call(rq, rp); rc != CUDA_SUCCESS) return rc;
        return decode(rp, st);
    }

    std::mutex mu_;
    std::condition_variable wake_, done_;
    std::deque<std::shared_ptr<status_query>> queue_;
    pid_t worker_pid_ = 0;  // the process whose worker thread runs
};

int checked_device(int dev) {
    auto& st = state::get();
    if (!st.initialized()) return st.init_status();
    if (dev < 0 || dev >= st.device_count()) return CUDA_ERROR_INVALID_DEVICE;
    if (st.device(dev).owner->lost()) return connection_lost_result;
    return CUDA_SUCCESS;
}

int device_usage(int dev, unsigned long long* bytes, int* has_context) {
    if (!bytes || !has_context) return CUDA_ERROR_INVALID_VALUE;
    if (int rc = checked_device(dev); rc != CUDA_SUCCESS) return rc;
    uint64_t b = 0;
    bool c = false;
    state::get().device_usage(dev, b, c);
    *bytes = b;
    *has_context = c;
    return CUDA_SUCCESS;
}

// The live state of `d` into `out` (slots 2 and 5, once they checked their arguments).
int query_status(const server_device& d, gpu_status& out, unsigned timeout_ms) {
    if (d.owner->lost()) return connection_lost_result;
    return status_worker::get().query(d, out, std::chrono::milliseconds(timeout_ms));
}

int fetch_gpu_status(int dev, gpu_status* out, size_t size, unsigned timeout_ms) {
    if (!out || size != sizeof(gpu_status)) return CUDA_ERROR_INVALID_VALUE;
    if (int rc = checked_device(dev); rc != CUDA_SUCCESS) return rc;
    return query_status(state::get().device(dev), *out, timeout_ms);
}

int listed_gpus(int index, listed_gpu* out, size_t size) {
    auto& st = state::get();
    auto& all = st.listed_devices();  // written once by cuInit, also when CUDA_VISIBLE_DEVICES hid every GPU
    if (all.empty()) return st.initialized() ? 0 : -1;
    if (!out || index < 0 || static_cast<size_t>(index) >= all.size()) return static_cast<int>(all.size());
    if (size != sizeof(listed_gpu)) return -1;
    const server_device& d = all[index];
    *out = listed_gpu{};
    out->cuda_ordinal = st.cuda_ordinal_of_listed(static_cast<size_t>(index));
    std::snprintf(out->name, sizeof out->name, "%s", d.name.c_str());
    std::memcpy(out->uuid, d.uuid.data(), sizeof out->uuid);
    out->total_memory = d.total_memory;
    out->pci_domain = d.attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
    out->pci_bus = d.attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    out->pci_device = d.attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    out->pci_device_id = d.attribute(CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID);
    out->pci_subsystem_id = d.attribute(CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID);
    out->cc_major = d.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    out->cc_minor = d.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    return static_cast<int>(all.size());
}

int fetch_listed_gpu_status(int index, gpu_status* out, size_t size, unsigned timeout_ms) {
    if (!out || size != sizeof(gpu_status)) return CUDA_ERROR_INVALID_VALUE;
    auto& all = state::get().listed_devices();
    if (index < 0 || static_cast<size_t>(index) >= all.size()) return CUDA_ERROR_INVALID_DEVICE;
    return query_status(all[index], *out, timeout_ms);
}

int call_counts(unsigned long long* round_trips, unsigned long long* posted) {
    if (round_trips) *round_trips = counters().round_trips.load(std::memory_order_relaxed);
    if (posted) *posted = counters().posted.load(std::memory_order_relaxed);
    return CUDA_SUCCESS;
}

}  // namespace

const private_table& the_private_table() {
    static const private_table t{sizeof(private_table), &device_usage, &fetch_gpu_status,
                                 &call_counts,          &listed_gpus,  &fetch_listed_gpu_status};
    return t;
}

}  // namespace vcuda::client
