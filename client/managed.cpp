// Managed memory's CPU view and its coherence with the device (client/managed.hpp says how and why).
#include "client/managed.hpp"

#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "client/copy_paths.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "common/log.hpp"

namespace vcuda::client {

namespace {

// The unit of fetches and write-backs: large enough that sequential CPU access faults rarely, small enough
// that touching one element of a large array does not copy all of it. A multiple of every page size.
constexpr size_t chunk_bytes = 1u << 20;
constexpr size_t max_ranges = 4096;

enum chunk_state : uint8_t {
    device_only = 0,  // the CPU view is PROT_NONE
    cpu_clean = 1,    // the CPU holds the device's bytes, read-only
    cpu_dirty = 2,    // the CPU wrote it: writable, to be written back
};

// What cuMemAdvise and cuMemPrefetchAsync recorded for one page (queries answer per page, as the driver's).
struct page_advice {
    uint8_t read_mostly = 0;
    int16_t preferred = CU_DEVICE_INVALID;  // a client ordinal, CU_DEVICE_CPU, or CU_DEVICE_INVALID (none)
    int16_t last_prefetch = CU_DEVICE_INVALID;
    uint32_t accessed_by = 0;  // bit d: device d; bit 31: the CPU
};
constexpr uint32_t cpu_bit = 1u << 31;

// Bytes of a view that are the device's: an allocation's are one extent from its start; a __managed__
// variable's view holds the whole pages around it (and around variables that share them), each variable an
// extent that names its library. Only extents are copied: the rest of those pages is not the session's.
struct extent {
    size_t off = 0, len = 0;
    uint64_t owner = 0;  // 0: an allocation; else the library of a __managed__ variable
};

struct managed_range {
    uint64_t base = 0;
    size_t size = 0, view = 0;  // bytes up to the end of the last extent; bytes of the CPU view (whole pages)
    std::vector<extent> extents;
    int device = 0;
    uint64_t ctx = 0;
    unsigned flags = 0;
    int fd = -1;
    std::byte* alias = nullptr;  // the memfd mapped again, always writable: fetches land here
    std::vector<uint8_t> chunks;
    size_t resident = 0;  // chunks not device_only
    size_t slot = 0;
    std::vector<page_advice> advice;  // per page, made at the first advice or prefetch
};

size_t page_size() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

// ---------------------------------------------------------------- what the signal handler reads

// The ranges as [lo, hi) pairs, written under `mu` and read without a lock by the handler. lo is written last
// (release) when a slot is filled and cleared first when it is emptied.
struct fault_slot {
    std::atomic<uint64_t> lo{0}, hi{0};
};
fault_slot fault_slots[max_ranges];
std::atomic<size_t> slots_used{0};

struct fault_request {
    uint64_t addr = 0;
    int write = -1;                    // 1 write, 0 read, -1 unknown
    std::atomic<int>* done = nullptr;  // 1 served, 2 not: the handler chains
};

int request_pipe[2] = {-1, -1};
std::atomic<pid_t> fault_thread_tid{0};
pid_t owner_pid = 0;
struct sigaction previous_action {};

// ---------------------------------------------------------------- ranges (under mu)

std::mutex mu;
// Never destroyed: the fault thread may serve a fault while the process exits.
std::map<uint64_t, managed_range>& ranges = *new std::map<uint64_t, managed_range>();
std::atomic<size_t> resident_total{
    0};  // chunks the CPU holds, over all ranges: launches skip everything at 0

// Set while this thread does managed memory's own copies: the copy paths' hooks must not come back in.
thread_local bool in_managed = false;

struct managed_scope {
    bool was = in_managed;
    managed_scope() { in_managed = true; }
    ~managed_scope() { in_managed = was; }
    managed_scope(const managed_scope&) = delete;
    managed_scope& operator=(const managed_scope&) = delete;
};

managed_range* range_of(uint64_t p) {
    auto it = ranges.upper_bound(p);
    if (it == ranges.begin()) return nullptr;
    --it;
    return p - it->second.base < it->second.view ? &it->second : nullptr;
}

// The range holding all of [p, p+n), n > 0.
managed_range* range_of(uint64_t p, size_t n) {
    managed_range* r = range_of(p);
    if (!r || n == 0 || n > r->size - (p - r->base)) return nullptr;
    return r;
}

size_t chunk_count(const managed_range& r) { return (r.view + chunk_bytes - 1) / chunk_bytes; }
size_t chunk_offset(size_t c) { return c * chunk_bytes; }
// Applies fn(offset, length) to each run of the device's bytes in chunks [a, b): the view's last page may
// reach past an allocation, and a variable's pages hold bytes that are not the session's.
template <class Fn>
CUresult for_device_bytes(const managed_range& r, size_t a, size_t b, Fn fn) {
    const size_t lo = chunk_offset(a), hi = std::min(r.view, chunk_offset(b));
    for (const extent& e : r.extents) {
        const size_t s = std::max(lo, e.off), t = std::min(hi, e.off + e.len);
        if (s < t)
            if (CUresult rc = fn(s, t - s); rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

// Applies fn(first, end) to each run of consecutive chunks in [c0, c1) for which want(state) holds.
template <class Want, class Fn>
CUresult for_runs(const managed_range& r, size_t c0, size_t c1, Want want, Fn fn) {
    for (size_t c = c0; c < c1;) {
        if (!want(r.chunks[c])) {
            ++c;
            continue;
        }
        size_t e = c + 1;
        while (e < c1 && want(r.chunks[e])) ++e;
        if (CUresult rc = fn(c, e); rc != CUDA_SUCCESS) return rc;
        c = e;
    }
    return CUDA_SUCCESS;
}

void protect(const managed_range& r, size_t c0, size_t c1, int prot) {
    const size_t off = chunk_offset(c0), end = std::min(r.view, chunk_offset(c1));
    if (mprotect(reinterpret_cast<void*>(r.base + off), end - off, prot) != 0)
        VCUDA_LOG_ERROR("managed memory: mprotect of [{:#x}, +{}) failed: errno {}", r.base + off, end - off,
                        errno);
}

void set_state(managed_range& r, size_t c, uint8_t s) {
    if ((r.chunks[c] == device_only) != (s == device_only)) {
        if (s == device_only) {
            --r.resident;
            resident_total.fetch_sub(1, std::memory_order_relaxed);
        } else {
            ++r.resident;
            resident_total.fetch_add(1, std::memory_order_relaxed);
        }
    }
    r.chunks[c] = s;
}

// Chunks [c0, c1) that the CPU holds: dirty ones made read-only (or inaccessible, when `drop`) before their
// bytes are copied to the device, so that no write slips in between; with `drop`, clean ones become
// inaccessible too.
CUresult write_back(managed_range& r, size_t c0, size_t c1, bool drop) {
    auto held = [](uint8_t s) { return s != device_only; };
    auto dirty = [](uint8_t s) { return s == cpu_dirty; };
    if (drop)
        for_runs(r, c0, c1, held, [&](size_t a, size_t b) {
            protect(r, a, b, PROT_NONE);
            return CUDA_SUCCESS;
        });
    else
        for_runs(r, c0, c1, dirty, [&](size_t a, size_t b) {
            protect(r, a, b, PROT_READ);
            return CUDA_SUCCESS;
        });
    managed_scope scope;
    context_scope ctx(r.ctx);
    CUresult rc = for_runs(r, c0, c1, dirty, [&](size_t a, size_t b) {
        return for_device_bytes(r, a, b, [&](size_t off, size_t len) {
            return copy_htod(r.base + off, r.alias + off, len, nullptr, mode::sync);
        });
    });
    if (rc != CUDA_SUCCESS) {
        VCUDA_LOG_ERROR("managed memory: writing [{:#x}, +{}) back to the device failed: {}", r.base, r.size,
                        static_cast<int>(rc));
        // Dirty chunks stay dirty (a later write-back tries again) and the CPU keeps what it holds.
        for (size_t c = c0; c < c1; ++c)
            if (held(r.chunks[c]))
                protect(r, c, c + 1, dirty(r.chunks[c]) ? PROT_READ | PROT_WRITE : PROT_READ);
        return rc;
    }
    for (size_t c = c0; c < c1; ++c)
        if (r.chunks[c] != device_only) set_state(r, c, drop ? device_only : cpu_clean);
    return CUDA_SUCCESS;
}

// Copies chunks [c0, c1) the CPU does not hold from the device and opens them read-only.
CUresult fetch(managed_range& r, size_t c0, size_t c1) {
    managed_scope scope;
    context_scope ctx(r.ctx);
    auto copy_in = [&](size_t off, size_t len) {
        CUresult rc = copy_dtoh(r.alias + off, r.base + off, len, nullptr, mode::sync);
        if (rc != CUDA_SUCCESS)
            VCUDA_LOG_ERROR("managed memory: fetching [{:#x}, +{}) from the device failed: {}", r.base + off,
                            len, static_cast<int>(rc));
        return rc;
    };
    return for_runs(
        r, c0, c1, [](uint8_t s) { return s == device_only; },
        [&](size_t a, size_t b) {
            if (CUresult rc = for_device_bytes(r, a, b, copy_in); rc != CUDA_SUCCESS) return rc;
            protect(r, a, b, PROT_READ);
            for (size_t c = a; c < b; ++c) set_state(r, c, cpu_clean);
            return CUDA_SUCCESS;
        });
}

// ---------------------------------------------------------------- faults

// A CPU access at `addr` faulted. Runs on the fault thread. True when the access can be retried.
bool serve_fault(uint64_t addr, int write) {
    std::lock_guard lock(mu);
    managed_range* r = range_of(addr);
    if (!r) return false;
    const size_t c = (addr - r->base) / chunk_bytes;
    switch (r->chunks[c]) {
        case device_only:
            if (fetch(*r, c, c + 1) != CUDA_SUCCESS) return false;
            if (write == 1) {
                protect(*r, c, c + 1, PROT_READ | PROT_WRITE);
                set_state(*r, c, cpu_dirty);
            }
            return true;
        case cpu_clean:
            if (write == 0) return true;  // another thread's fault opened it meanwhile
            protect(*r, c, c + 1, PROT_READ | PROT_WRITE);
            set_state(*r, c, cpu_dirty);
            return true;
        default:
            return true;  // opened meanwhile
    }
}

void fault_thread() {
    fault_thread_tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
    for (;;) {
        fault_request rq;
        ssize_t got = read(request_pipe[0], &rq, sizeof rq);
        if (got < 0 && errno == EINTR) continue;
        if (got != static_cast<ssize_t>(sizeof rq)) {
            VCUDA_LOG_ERROR(
                "managed memory: the fault thread's pipe failed; CPU faults are no longer served");
            return;
        }
        const int result = serve_fault(rq.addr, rq.write) ? 1 : 2;
        rq.done->store(result, std::memory_order_release);
        syscall(SYS_futex, reinterpret_cast<int*>(rq.done), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
}

bool in_managed_range(uint64_t a) {
    const size_t n = slots_used.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
        const uint64_t lo = fault_slots[i].lo.load(std::memory_order_acquire);
        if (lo != 0 && a >= lo && a < fault_slots[i].hi.load(std::memory_order_relaxed)) return true;
    }
    return false;
}

int fault_is_write(void* uc) {
#if defined(__x86_64__)
    return (static_cast<ucontext_t*>(uc)->uc_mcontext.gregs[REG_ERR] & 2) != 0 ? 1 : 0;
#else
    (void)uc;
    return -1;  // a write then faults once more on the read-only chunk, which marks it dirty
#endif
}

// Faults outside managed memory (or that could not be served) go to the handler installed before ours; the
// default action is restored and the access retried, so the process ends as it would have without vcuda.
void chain(int sig, siginfo_t* si, void* uc) {
    if (previous_action.sa_flags & SA_SIGINFO) {
        if (previous_action.sa_sigaction) previous_action.sa_sigaction(sig, si, uc);
        return;
    }
    if (previous_action.sa_handler == SIG_DFL || previous_action.sa_handler == SIG_IGN) {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, nullptr);
        return;
    }
    previous_action.sa_handler(sig);
}

// The SIGSEGV handler: async-signal-safe (atomics, write(2), futex(2) only).
void on_fault(int sig, siginfo_t* si, void* uc) {
    const int saved_errno = errno;
    const auto addr = reinterpret_cast<uint64_t>(si->si_addr);
    if (si->si_code == SEGV_ACCERR && in_managed_range(addr) && getpid() == owner_pid &&
        static_cast<pid_t>(syscall(SYS_gettid)) != fault_thread_tid.load()) {
        std::atomic<int> done{0};
        fault_request rq{addr, fault_is_write(uc), &done};
        if (write(request_pipe[1], &rq, sizeof rq) == static_cast<ssize_t>(sizeof rq)) {
            int r = 0;
            while ((r = done.load(std::memory_order_acquire)) == 0)
                syscall(SYS_futex, reinterpret_cast<int*>(&done), FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr, 0);
            if (r == 1) {
                errno = saved_errno;
                return;
            }
        }
    }
    chain(sig, si, uc);
    errno = saved_errno;
}

// The pipe, the fault thread and the handler, at the first managed allocation.
bool start_fault_service() {
    static const bool ok = [] {
        static_assert(sizeof(fault_request) <= PIPE_BUF, "a request is written atomically");
        if (pipe2(request_pipe, O_CLOEXEC) != 0) return false;
        owner_pid = getpid();
        std::thread(fault_thread).detach();
        struct sigaction sa {};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGSEGV, &sa, &previous_action) != 0) return false;
        while (fault_thread_tid.load() == 0) std::this_thread::yield();
        return true;
    }();
    return ok;
}

}  // namespace

// ---------------------------------------------------------------- views

namespace {

// The memfd behind r's view (r.view bytes), its always-writable alias, and the view itself at r.base with
// `prot`, mapped over what is there (the reservation, or the views it replaces), registered for the fault
// handler. Under mu. False, with nothing left behind, when any of it fails.
bool open_view(managed_range& r, int prot) {
    r.fd = memfd_create("vcuda-managed", MFD_CLOEXEC);
    if (r.fd < 0 || ftruncate(r.fd, static_cast<off_t>(r.view)) != 0) {
        if (r.fd >= 0) close(r.fd);
        return false;
    }
    void* alias = mmap(nullptr, r.view, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
    if (alias == MAP_FAILED) {
        close(r.fd);
        return false;
    }
    r.alias = static_cast<std::byte*>(alias);
    size_t slot = 0;
    const size_t used = slots_used.load();
    while (slot < used && fault_slots[slot].lo.load() != 0) ++slot;
    if (slot == max_ranges ||
        mmap(reinterpret_cast<void*>(r.base), r.view, prot, MAP_SHARED | MAP_FIXED, r.fd, 0) == MAP_FAILED) {
        VCUDA_LOG_WARN("managed memory: no CPU view for [{:#x}, +{}) ({})", r.base, r.size,
                       slot == max_ranges ? "4096 managed ranges live" : "mmap failed");
        munmap(alias, r.view);
        close(r.fd);
        return false;
    }
    r.slot = slot;
    r.chunks.assign(chunk_count(r), prot == PROT_NONE ? device_only : cpu_clean);
    r.resident = prot == PROT_NONE ? 0 : r.chunks.size();
    resident_total.fetch_add(r.resident);
    fault_slots[slot].hi.store(r.base + r.view, std::memory_order_relaxed);
    fault_slots[slot].lo.store(r.base, std::memory_order_release);
    if (slot == used) slots_used.store(used + 1, std::memory_order_release);
    return true;
}

// Forgets r's view. Its pages become a plain reservation again (`reserve`: an allocation's, which
// client/state.cpp releases with it) or are unmapped (a variable's, or when a larger view took them: `keep`).
enum class view_end { reserve, unmap, keep };
void close_view(managed_range& r, view_end end) {
    fault_slots[r.slot].lo.store(0, std::memory_order_release);
    fault_slots[r.slot].hi.store(0, std::memory_order_relaxed);
    if (end == view_end::reserve &&
        mmap(reinterpret_cast<void*>(r.base), r.view, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
        VCUDA_LOG_WARN("managed memory at {:#x}: its reservation could not be restored (errno {})", r.base,
                       errno);
    if (end == view_end::unmap) munmap(reinterpret_cast<void*>(r.base), r.view);
    munmap(r.alias, r.view);
    close(r.fd);
    resident_total.fetch_sub(r.resident);
}

size_t extents_end(const managed_range& r) {
    size_t end = 0;
    for (const extent& e : r.extents) end = std::max(end, e.off + e.len);
    return end;
}

bool is_variable(const managed_range& r) { return !r.extents.empty() && r.extents.front().owner != 0; }

}  // namespace

CUresult managed_adopt(uint64_t base, size_t size, int device, uint64_t ctx, unsigned flags) {
    const size_t page = page_size(), view = (size + page - 1) / page * page;
    if (base % page != 0 || !state::get().reserved(base, view)) {
        VCUDA_LOG_WARN(
            "managed memory at {:#x} cannot have a CPU view here (the address is taken or unaligned)", base);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!start_fault_service()) {
        VCUDA_LOG_ERROR("managed memory: the fault handler could not be installed (errno {})", errno);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // The device side starts zeroed, as the CPU view does (a fresh memfd), so neither needs a copy.
    {
        managed_scope scope;
        if (CUresult rc = memset_2d(base, size, 0, 1, size, 1, nullptr, mode::post); rc != CUDA_SUCCESS)
            return rc;
    }
    managed_range r;
    r.base = base;
    r.size = size;
    r.view = view;
    r.extents = {{0, size, 0}};
    r.device = device;
    r.ctx = ctx;
    r.flags = flags;
    std::lock_guard lock(mu);
    if (!open_view(r, PROT_READ)) return CUDA_ERROR_OUT_OF_MEMORY;
    ranges.emplace(base, std::move(r));
    return CUDA_SUCCESS;
}

CUresult managed_adopt_variable(uint64_t p, size_t size, int device, uint64_t ctx, uint64_t library) {
    if (size == 0) return CUDA_SUCCESS;
    if (!start_fault_service()) {
        VCUDA_LOG_ERROR("managed memory: the fault handler could not be installed (errno {})", errno);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const size_t page = page_size();
    uint64_t lo = p / page * page, hi = (p + size + page - 1) / page * page;
    std::lock_guard lock(mu);
    if (managed_range* r = range_of(p))
        for (const extent& e : r->extents)
            if (r->base + e.off == p && e.len == size) return CUDA_SUCCESS;  // looked up before
    // The views whose pages this variable's pages meet (a page may hold several variables): one view replaces
    // them all.
    std::vector<std::map<uint64_t, managed_range>::iterator> met;
    auto it = ranges.upper_bound(lo);
    if (it != ranges.begin()) --it;
    for (; it != ranges.end() && it->first < hi; ++it) {
        if (it->first + it->second.view <= lo) continue;
        if (!is_variable(it->second)) {
            VCUDA_LOG_ERROR("__managed__ variable at {:#x}: its pages meet managed allocation {:#x}", p,
                            it->first);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        met.push_back(it);
        lo = std::min<uint64_t>(lo, it->first);
        hi = std::max<uint64_t>(hi, it->first + it->second.view);
    }
    // The pages no view holds yet must be free in this process: the driver chose the address in the server's.
    std::vector<std::pair<uint64_t, uint64_t>> claimed;
    auto claim = [&](uint64_t a, uint64_t b) {
        if (a >= b) return true;
        void* q = mmap(reinterpret_cast<void*>(a), b - a, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (q == MAP_FAILED) return false;
        if (reinterpret_cast<uint64_t>(q) != a) {  // a kernel without MAP_FIXED_NOREPLACE took it as a hint
            munmap(q, b - a);
            return false;
        }
        claimed.emplace_back(a, b);
        return true;
    };
    uint64_t at = lo;
    bool free_here = true;
    for (auto m : met) {
        free_here = free_here && claim(at, m->first);
        at = m->first + m->second.view;
    }
    free_here = free_here && claim(at, hi);
    auto unclaim = [&] {
        for (auto [a, b] : claimed) munmap(reinterpret_cast<void*>(a), b - a);
    };
    if (!free_here) {
        unclaim();
        VCUDA_LOG_ERROR(
            "__managed__ variable at {:#x} (+{}) cannot have a CPU view: the address is taken in this "
            "process "
            "(the server's driver chose it)",
            p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    managed_range r;
    r.base = lo;
    r.view = hi - lo;
    r.device = device;
    r.ctx = ctx;
    r.flags = CU_MEM_ATTACH_GLOBAL;
    // What the CPU wrote in the views it replaces goes to the device first; the new view starts empty.
    for (auto m : met) {
        if (CUresult rc = write_back(m->second, 0, m->second.chunks.size(), true); rc != CUDA_SUCCESS) {
            unclaim();
            return rc;
        }
        for (extent e : m->second.extents) {
            e.off += m->first - lo;
            r.extents.push_back(e);
        }
    }
    r.extents.push_back({p - lo, size, library});
    std::sort(r.extents.begin(), r.extents.end(),
              [](const extent& x, const extent& y) { return x.off < y.off; });
    r.size = extents_end(r);
    if (!open_view(r, PROT_NONE)) {
        unclaim();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (auto m : met) {
        close_view(m->second, view_end::keep);
        ranges.erase(m);
    }
    ranges.emplace(lo, std::move(r));
    return CUDA_SUCCESS;
}

bool managed_release(uint64_t base) {
    std::lock_guard lock(mu);
    auto it = ranges.find(base);
    if (it == ranges.end() || is_variable(it->second)) return false;
    close_view(it->second, view_end::reserve);
    ranges.erase(it);
    return true;
}

void managed_release_library(uint64_t library) {
    std::lock_guard lock(mu);
    for (auto it = ranges.begin(); it != ranges.end();) {
        managed_range& r = it->second;
        if (!std::erase_if(r.extents, [&](const extent& e) { return e.owner == library; })) {
            ++it;
            continue;
        }
        if (!r.extents.empty()) {  // variables of another library share its pages: they keep the view
            write_back(r, 0, r.chunks.size(), true);
            r.size = extents_end(r);
            ++it;
            continue;
        }
        close_view(r, view_end::unmap);
        it = ranges.erase(it);
    }
}

bool managed_contains(uint64_t p) {
    // in_managed: this thread's own copies (it may hold mu), whose host side is never a managed view.
    if (in_managed || slots_used.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard lock(mu);
    return range_of(p) != nullptr;
}

// ---------------------------------------------------------------- coherence with GPU work

// While a stream capture is under way, work is recorded, not run, and a synchronous copy on the legacy stream
// would invalidate the capture: the write-back waits for the graph's launch.
CUresult managed_before_launch() {
    if (in_managed || resident_total.load(std::memory_order_relaxed) == 0 || capture_under_way())
        return CUDA_SUCCESS;
    std::lock_guard lock(mu);
    for (auto& [base, r] : ranges)
        if (r.resident)
            if (CUresult rc = write_back(r, 0, r.chunks.size(), true); rc != CUDA_SUCCESS) return rc;
    return CUDA_SUCCESS;
}

CUresult managed_before_device_access(uint64_t p, size_t n, bool writes) {
    if (in_managed || n == 0 || resident_total.load(std::memory_order_relaxed) == 0 || capture_under_way())
        return CUDA_SUCCESS;
    std::lock_guard lock(mu);
    uint64_t end = 0;
    if (__builtin_add_overflow(p, n, &end)) return CUDA_SUCCESS;  // the copy itself refuses it
    // Every range overlapping [p, end): copies may span neighbouring allocations.
    auto it = ranges.upper_bound(p);
    if (it != ranges.begin()) --it;
    for (; it != ranges.end() && it->first < end; ++it) {
        managed_range& r = it->second;
        if (!r.resident || r.base + r.view <= p) continue;
        const uint64_t lo = std::max(p, r.base), hi = std::min(end, r.base + r.view);
        const size_t c0 = (lo - r.base) / chunk_bytes, c1 = (hi - r.base + chunk_bytes - 1) / chunk_bytes;
        if (CUresult rc = write_back(r, c0, c1, writes); rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- prefetch, advice, attributes

namespace {

// A location as a client ordinal, CU_DEVICE_CPU, or CU_DEVICE_INVALID when it names neither.
int location_ordinal(const CUmemLocation& l) {
    switch (l.type) {
        case CU_MEM_LOCATION_TYPE_DEVICE:
            return l.id >= 0 && l.id < state::get().device_count() ? l.id : CU_DEVICE_INVALID;
        case CU_MEM_LOCATION_TYPE_HOST:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
            return CU_DEVICE_CPU;
        default:
            return CU_DEVICE_INVALID;
    }
}

// The pages [first, last] of [p, p+n) in r, with r's advice table made.
std::pair<size_t, size_t> advice_pages(managed_range& r, uint64_t p, size_t n) {
    const size_t page = page_size();
    if (r.advice.empty()) r.advice.resize(r.view / page);
    return {(p - r.base) / page, (p - r.base + n - 1) / page};
}

}  // namespace

CUresult managed_prefetch(uint64_t p, size_t n, const CUmemLocation& to, CUstream stream) {
    const int where = location_ordinal(to);
    if (where == CU_DEVICE_INVALID) return CUDA_ERROR_INVALID_DEVICE;
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    if (where == CU_DEVICE_CPU) {  // the stream's earlier work may write the range: it must be done first
        managed_scope scope;
        if (CUresult rc = remote(op::cuStreamSynchronize, {reinterpret_cast<uint64_t>(stream)});
            rc != CUDA_SUCCESS)
            return rc;
    }
    std::lock_guard lock(mu);
    managed_range* r = range_of(p, n);
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    const size_t c0 = (p - r->base) / chunk_bytes, c1 = (p - r->base + n - 1) / chunk_bytes + 1;
    CUresult rc = where == CU_DEVICE_CPU ? fetch(*r, c0, c1) : write_back(*r, c0, c1, true);
    if (rc != CUDA_SUCCESS) return rc;
    auto [first, last] = advice_pages(*r, p, n);
    for (size_t i = first; i <= last; ++i) r->advice[i].last_prefetch = static_cast<int16_t>(where);
    return CUDA_SUCCESS;
}

CUresult managed_advise(uint64_t p, size_t n, CUmem_advise advice, const CUmemLocation& where) {
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    const bool needs_location = advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION ||
                                advice == CU_MEM_ADVISE_SET_ACCESSED_BY ||
                                advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY;
    const int at = location_ordinal(where);
    if (needs_location && at == CU_DEVICE_INVALID) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(mu);
    managed_range* r = range_of(p, n);
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    auto [first, last] = advice_pages(*r, p, n);
    const uint32_t bit = at == CU_DEVICE_CPU ? cpu_bit : (at >= 0 ? 1u << at : 0u);
    for (size_t i = first; i <= last; ++i) {
        page_advice& a = r->advice[i];
        switch (advice) {
            case CU_MEM_ADVISE_SET_READ_MOSTLY:
                a.read_mostly = 1;
                break;
            case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
                a.read_mostly = 0;
                break;
            case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
                a.preferred = static_cast<int16_t>(at);
                break;
            case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
                a.preferred = CU_DEVICE_INVALID;
                break;
            case CU_MEM_ADVISE_SET_ACCESSED_BY:
                a.accessed_by |= bit;
                break;
            case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
                a.accessed_by &= ~bit;
                break;
            default:
                return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

CUresult managed_range_attribute(void* data, size_t data_size, CUmem_range_attribute attr, uint64_t p,
                                 size_t n) {
    if (!data || n == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(mu);
    managed_range* r = range_of(p, n);
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    const auto pages = advice_pages(*r, p, n);
    const size_t first = pages.first, last = pages.second;
    // The value every page of the range agrees on, else `mixed`.
    auto uniform = [&](auto field, int mixed) {
        const int v = static_cast<int>(r->advice[first].*field);
        for (size_t i = first + 1; i <= last; ++i)
            if (static_cast<int>(r->advice[i].*field) != v) return mixed;
        return v;
    };
    auto put_int = [&](int v) {
        if (data_size != sizeof(int)) return CUDA_ERROR_INVALID_VALUE;
        *static_cast<int*>(data) = v;
        return CUDA_SUCCESS;
    };
    // The *_TYPE and *_ID forms of a location.
    auto location_type = [](int v) {
        return v == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST
                                  : (v >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_INVALID);
    };
    auto location_id = [](int v) { return v >= 0 ? v : (v == CU_DEVICE_CPU ? 0 : CU_DEVICE_INVALID); };
    switch (attr) {
        case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY:
            return put_int(uniform(&page_advice::read_mostly, 0));
        case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION:
            return put_int(uniform(&page_advice::preferred, CU_DEVICE_INVALID));
        case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
            return put_int(uniform(&page_advice::last_prefetch, CU_DEVICE_INVALID));
        case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE:
            return put_int(location_type(uniform(&page_advice::preferred, CU_DEVICE_INVALID)));
        case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID:
            return put_int(location_id(uniform(&page_advice::preferred, CU_DEVICE_INVALID)));
        case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE:
            return put_int(location_type(uniform(&page_advice::last_prefetch, CU_DEVICE_INVALID)));
        case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID:
            return put_int(location_id(uniform(&page_advice::last_prefetch, CU_DEVICE_INVALID)));
        case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY: {
            // The devices (and the CPU) with the advice on every page, then CU_DEVICE_INVALID.
            if (data_size == 0 || data_size % sizeof(int) != 0) return CUDA_ERROR_INVALID_VALUE;
            uint32_t all = ~0u;
            for (size_t i = first; i <= last; ++i) all &= r->advice[i].accessed_by;
            auto* out = static_cast<int*>(data);
            const size_t slots = data_size / sizeof(int);
            size_t k = 0;
            for (int d = 0; d < state::get().device_count() && k < slots; ++d)
                if (all & (1u << d)) out[k++] = d;
            if ((all & cpu_bit) && k < slots) out[k++] = CU_DEVICE_CPU;
            while (k < slots) out[k++] = CU_DEVICE_INVALID;
            return CUDA_SUCCESS;
        }
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult managed_attach(uint64_t p, size_t n, unsigned flags) {
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST && flags != CU_MEM_ATTACH_SINGLE)
        return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(mu);
    managed_range* r = range_of(p);
    // Length 0 means the whole allocation, which p must then start; otherwise the range must lie in it.
    if (!r || (n == 0 ? p != r->base : n > r->size - (p - r->base))) return CUDA_ERROR_INVALID_VALUE;
    r->flags = flags;
    return CUDA_SUCCESS;
}

}  // namespace vcuda::client
