#include "client/deferred_copies.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "client/env_switch.hpp"
#include "client/remote_call.hpp"
#include "client_ops.hpp"
#include "common/deferred_copy_limits.hpp"
#include "common/log.hpp"

namespace vcuda::client {

namespace {

bool deferring_enabled() {
    static const bool on = env_switch_on("VCUDA_DEFER_COPIES");
    return on;
}

using deferred_copy::charge;

struct under_way {
    std::byte* dst = nullptr;
    size_t n = 0;
    uint64_t ctx = 0;  // its context: the collect goes to that context's session
};

struct copies_under_way {
    std::mutex mu;                         // held while bytes are fetched and written
    std::map<uint64_t, under_way> copies;  // by ticket, the order they were made in
    size_t bytes = 0;
    uint64_t next_ticket = 0;
    std::atomic<size_t> count{0};
};

copies_under_way& queue() {
    static auto* q = new copies_under_way();  // never destroyed: copies may be settled at exit
    return *q;
}

void forget(copies_under_way& q, std::map<uint64_t, under_way>::iterator it) {
    q.bytes -= charge(it->second.n);
    q.copies.erase(it);
    q.count.fetch_sub(1);
}

// Fetches the finished copies of every session that has copies under way and writes their bytes. q.mu held.
void collect_locked(copies_under_way& q) {
    std::set<uint64_t> contexts;
    for (auto& [ticket, c] : q.copies) contexts.insert(c.ctx);
    for (uint64_t ctx : contexts) {
        call_reply rp;
        CUresult rc;
        {
            context_scope in(ctx);
            rc = remote(op::deferred_collect, {}, mode::sync, &rp);
        }
        if (rc != CUDA_SUCCESS) {
            // Their bytes cannot come any more (the server is gone, or the context): they are dropped, and
            // the application learns of the failure from the calls that follow.
            VCUDA_LOG_WARN(
                "copies from the device left under way were lost (error {}): their bytes did not "
                "arrive",
                static_cast<int>(rc));
            for (auto it = q.copies.begin(); it != q.copies.end();) {
                auto next = std::next(it);
                if (it->second.ctx == ctx) forget(q, it);
                it = next;
            }
            continue;
        }
        const auto& p = rp.payload;
        for (size_t at = 0; at + sizeof(deferred_copy::record_head) <= p.size();) {
            deferred_copy::record_head head;
            std::memcpy(&head, p.data() + at, sizeof head);
            at += sizeof head;
            const uint64_t size = head.size, status = head.status;
            if (size > p.size() - at) break;  // malformed: the rest is not trusted
            auto it = q.copies.find(head.ticket);
            if (it != q.copies.end()) {
                if (status == CUDA_SUCCESS && size == it->second.n)
                    std::memcpy(it->second.dst, p.data() + at, size);
                else  // the stream's error reaches the application at its next synchronous call, as natively
                    VCUDA_LOG_WARN("a copy from the device into pinned memory failed (error {})", status);
                forget(q, it);
            }
            at += size;
        }
    }
}

}  // namespace

bool defer_dtoh(void* dst, CUdeviceptr src, size_t n, CUstream stream, CUresult& rc) {
    if (!deferring_enabled() || n == 0 || n > deferred_copy::max_copy) return false;
    const uint64_t ctx = current_context();
    if (!ctx) return false;
    auto& q = queue();
    uint64_t ticket;
    {
        std::lock_guard lock(q.mu);
        if (q.bytes + charge(n) > deferred_copy::max_bytes) return false;
        ticket = ++q.next_ticket;
        q.copies[ticket] = {static_cast<std::byte*>(dst), n, ctx};
        q.bytes += charge(n);
        q.count.fetch_add(1);
    }
    rc = remote(op::copy_dtoh_deferred, {src, n, reinterpret_cast<uint64_t>(stream), ticket}, mode::post);
    if (rc != CUDA_SUCCESS) {
        std::lock_guard lock(q.mu);
        if (auto it = q.copies.find(ticket); it != q.copies.end()) forget(q, it);
    }
    return true;
}

void settle_finished() {
    auto& q = queue();
    if (q.count.load() == 0) return;
    std::lock_guard lock(q.mu);
    collect_locked(q);
}

void settle_range(const void* p, size_t n) {
    auto& q = queue();
    if (q.count.load() == 0 || n == 0) return;
    const auto* lo = static_cast<const std::byte*>(p);
    for (;;) {
        uint64_t ticket = 0, ctx = 0;
        {
            std::lock_guard lock(q.mu);
            for (auto& [t, c] : q.copies)
                if (c.dst < lo + n && lo < c.dst + c.n) {
                    ticket = t;
                    ctx = c.ctx;
                    break;
                }
        }
        if (ticket == 0) return;
        {
            // The server waits for it; no lock is held here meanwhile (a host function may need to settle).
            context_scope in(ctx);
            (void)deferred_wait_call("deferred_wait", ticket).send_sync();
        }
        std::lock_guard lock(q.mu);
        collect_locked(q);
        if (auto it = q.copies.find(ticket); it != q.copies.end()) {  // the server knows it no more
            VCUDA_LOG_WARN("a copy from the device left under way was not found on the server: dropped");
            forget(q, it);
        }
    }
}

}  // namespace vcuda::client
