#include "server/deferred_copies.hpp"

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace vcuda::server {

namespace {

// The stream reached the callback put behind a copy: the copy is done, or failed with the stream.
void CUDA_CB reached(CUstream, CUresult status, void* data) {
    std::unique_ptr<std::shared_ptr<copy_done>> held(static_cast<std::shared_ptr<copy_done>*>(data));
    (*held)->status.store(status);
    (*held)->reached.store(true, std::memory_order_release);
}

}  // namespace

using deferred_copy::charge;
using deferred_copy::max_bytes;

deferred_copies::~deferred_copies() = default;  // clear() gave everything back (it needs the driver)

size_t deferred_copies::size_class(size_t n) {
    size_t k = 0;
    while ((size_t{4096} << k) < n) ++k;
    return k;
}

deferred_copies::in_flight deferred_copies::pages_for(const driver_table& drv, size_t n) {
    const size_t k = size_class(n), size = size_t{4096} << k;
    bool registering = false;
    {
        std::lock_guard lock(mu_);
        if (!free_[k].empty()) {
            in_flight f = free_[k].back();
            free_[k].pop_back();
            f.size = n;
            return f;
        }
        if (registered_ + size <= max_registered && drv.cuMemHostRegister_v2) {
            registered_ += size;
            registering = true;
        }
    }
    in_flight f;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        f = {p, n, size, false, nullptr};
        // Pinned, so that the copy is asynchronous.
        f.registered =
            registering && drv.cuMemHostRegister_v2(p, size, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
    }
    if (registering && !f.registered) {
        std::lock_guard lock(mu_);
        registered_ -= size;
    }
    return f;
}

void deferred_copies::release(in_flight& f) {
    f.done.reset();
    if (f.pages && f.registered) {
        free_[size_class(f.mapped)].push_back(f);
    } else if (f.pages) {
        ::munmap(f.pages, f.mapped);
    }
    f = {};
}

void deferred_copies::land(copy& c, CUresult status) {
    c.result.status = status;
    if (status == CUDA_SUCCESS && c.flight.pages) {
        const auto* b = static_cast<const std::byte*>(c.flight.pages);
        c.result.bytes.assign(b, b + c.flight.size);
    }
    release(c.flight);
    c.at = copy::phase::landed;
}

bool deferred_copies::land_if_reached(copy& c) {
    if (!c.flight.done || !c.flight.done->reached.load(std::memory_order_acquire)) return false;
    land(c, static_cast<CUresult>(c.flight.done->status.load()));
    return true;
}

CUresult deferred_copies::start(const driver_table& drv, uint64_t ticket, CUdeviceptr src, size_t n,
                                CUstream stream) {
    if (ticket == 0 || n == 0 || n > deferred_copy::max_copy) return CUDA_ERROR_INVALID_VALUE;
    {
        std::lock_guard lock(mu_);
        if (copies_.count(ticket) || bytes_ + charge(n) > max_bytes) return CUDA_ERROR_INVALID_VALUE;
        bytes_ += charge(n);
        copy& c = copies_[ticket];  // starting: collect() passes it by while the driver works
        c.charged = charge(n);
        c.result.ticket = ticket;
    }
    in_flight f = pages_for(drv, n);
    CUresult rc = f.pages ? drv.cuMemcpyDtoHAsync_v2(f.pages, src, n, stream) : CUDA_ERROR_OUT_OF_MEMORY;
    // The stream's callback marks the copy done (also with the stream's error). Without one, the copy is
    // waited for now, and collected as landed.
    CUresult waited = CUDA_ERROR_NOT_READY;
    if (rc == CUDA_SUCCESS) {
        f.done = std::make_shared<copy_done>();
        auto* held = new std::shared_ptr<copy_done>(f.done);  // the callback's, freed by it
        if (!drv.cuStreamAddCallback || drv.cuStreamAddCallback(stream, &reached, held, 0) != CUDA_SUCCESS) {
            delete held;
            f.done.reset();
            waited = drv.cuStreamSynchronize(stream);
        }
    }
    std::lock_guard lock(mu_);
    auto it = copies_.find(ticket);
    if (rc != CUDA_SUCCESS) {
        release(f);
        bytes_ -= it->second.charged;
        copies_.erase(it);
        return rc;
    }
    it->second.flight = f;
    it->second.at = copy::phase::flying;
    if (waited != CUDA_ERROR_NOT_READY) land(it->second, waited);
    return CUDA_SUCCESS;
}

bool deferred_copies::under_way(uint64_t ticket) {
    std::lock_guard lock(mu_);
    auto it = copies_.find(ticket);
    if (it == copies_.end() || it->second.at == copy::phase::landed) return false;
    if (it->second.at == copy::phase::starting) return true;
    return !land_if_reached(it->second);
}

void deferred_copies::collect(std::vector<std::byte>& out) {
    std::lock_guard lock(mu_);
    for (auto it = copies_.begin(); it != copies_.end();) {
        copy& c = it->second;
        if (c.at == copy::phase::flying) land_if_reached(c);
        if (c.at != copy::phase::landed) {
            ++it;
            continue;
        }
        const deferred_copy::record_head head{c.result.ticket, c.result.bytes.size(),
                                              static_cast<uint64_t>(c.result.status)};
        const size_t at = out.size();
        out.resize(at + sizeof head + c.result.bytes.size());
        std::memcpy(out.data() + at, &head, sizeof head);
        if (!c.result.bytes.empty())
            std::memcpy(out.data() + at + sizeof head, c.result.bytes.data(), c.result.bytes.size());
        bytes_ -= c.charged;
        it = copies_.erase(it);
    }
}

void deferred_copies::land_all(const driver_table& drv) {
    std::lock_guard lock(mu_);
    // The session's work is drained (or its contexts are gone): a callback still to come comes at once, or
    // never (its context went with its work); such a copy is lost, and reported so.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    for (auto& [ticket, c] : copies_) {
        if (c.at != copy::phase::flying) continue;
        while (!land_if_reached(c) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (c.at == copy::phase::flying) land(c, CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    // The session's work is drained: registrations are undone now, before the contexts they were made in go.
    for (auto& list : free_) {
        for (auto& f : list) {
            drv.cuMemHostUnregister(f.pages);
            ::munmap(f.pages, f.mapped);
        }
        list.clear();
    }
    registered_ = 0;
}

std::vector<deferred_copies::landed> deferred_copies::landed_copies() {
    std::lock_guard lock(mu_);
    std::vector<landed> out;
    for (auto& [ticket, c] : copies_)
        if (c.at == copy::phase::landed) out.push_back(c.result);
    return out;
}

void deferred_copies::keep_landed(landed l) {
    if (l.ticket == 0 || copies_.count(l.ticket)) return;
    copy& c = copies_[l.ticket];
    c.at = copy::phase::landed;
    c.charged = charge(l.bytes.size());
    bytes_ += c.charged;
    c.result = std::move(l);
}

void deferred_copies::add_landed(std::vector<landed> copies) {
    std::lock_guard lock(mu_);
    for (auto& l : copies) keep_landed(std::move(l));
}

void deferred_copies::refused(uint64_t ticket, CUresult why) {
    std::lock_guard lock(mu_);
    if (bytes_ + charge(0) <= max_bytes) keep_landed({ticket, why, {}});
}

void deferred_copies::clear(const driver_table& drv) {
    land_all(drv);
    std::lock_guard lock(mu_);
    copies_.clear();
    bytes_ = 0;
}

}  // namespace vcuda::server
