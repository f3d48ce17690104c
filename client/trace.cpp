// The record mode: activation, the real driver, and the three trace functions that rewrite what the driver
// answers (cuGetProcAddress[_v2]: our traced entry points instead of the driver's; cuGetExportTable: tables
// of logging shims). See client/TRACE.md.
#include "client/trace.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "client/procaddress.hpp"
#include "client/trace_log.hpp"
#include "client/trace_tables.hpp"

namespace vcuda::client::trace {

bool enabled = false;

namespace {

void* real_fns[symbol_count];
std::atomic<int> driver_state{0};  // 0: not loaded yet, 1: loaded, 2: none could be loaded
std::once_flag driver_once;
std::vector<std::pair<uintptr_t, uintptr_t>> code_ranges;  // the real driver's executable segments

bool env_true(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
}

// Runs when the library is loaded, before any of its functions can be called.
__attribute__((constructor(101))) void read_environment() {
    const char* spec = std::getenv("VCUDA_TRACE");
    if (!spec || !*spec || std::strcmp(spec, "0") == 0) return;
    enter_lines = env_true("VCUDA_TRACE_ENTER");
    if (const char* d = std::getenv("VCUDA_TRACE_DEREF"); d && *d) {
        int n = std::atoi(d);
        deref_args = n < 0 ? 0 : n > 6 ? 6 : n;
    }
    if (const char* w = std::getenv("VCUDA_TRACE_WORDS"); w && *w) {
        int n = std::atoi(w);
        deref_words = n < 1 ? 1 : n > 64 ? 64 : n;
    }
    open_output(spec);  // when it cannot be opened, calls still go to the real driver, unlogged
    enabled = true;
}

Dl_info self_info() {
    Dl_info self{};
    dladdr(reinterpret_cast<void*>(&read_environment), &self);
    return self;
}

bool is_ours(const void* p) {
    static const Dl_info self = self_info();
    Dl_info i{};
    return p && dladdr(p, &i) && i.dli_fbase == self.dli_fbase;
}

std::vector<std::string> candidates() {
    if (const char* d = std::getenv("VCUDA_TRACE_DRIVER"); d && *d) return {d};
    std::vector<std::string> c = {
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/local/nvidia/lib/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/lib/libcuda.so.1",
        "/usr/lib/wsl/lib/libcuda.so.1",
    };
    if (const char* lp = std::getenv("LD_LIBRARY_PATH")) {
        std::string all(lp);
        size_t start = 0;
        while (start <= all.size()) {
            size_t end = all.find(':', start);
            if (end == std::string::npos) end = all.size();
            std::string dir = all.substr(start, end - start);
            if (!dir.empty() && dir.find("/stubs") == std::string::npos) c.push_back(dir + "/libcuda.so.1");
            start = end + 1;
        }
    }
    return c;
}

struct range_search {
    uintptr_t probe;
    std::vector<std::pair<uintptr_t, uintptr_t>>* out;
};

int collect_code(dl_phdr_info* info, size_t, void* data) {
    auto* s = static_cast<range_search*>(data);
    bool mine = false;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const auto& ph = info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && s->probe >= lo && s->probe < lo + ph.p_memsz) mine = true;
    }
    if (!mine) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const auto& ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
            uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
            s->out->emplace_back(lo, lo + ph.p_memsz);
        }
    }
    return 1;
}

void load_driver() {
    Dl_info self = self_info();
    struct stat self_st {};
    bool have_self = self.dli_fname && stat(self.dli_fname, &self_st) == 0;
    std::string tried;
    void* handle = nullptr;
    std::string path;
    for (const auto& c : candidates()) {
        struct stat st {};
        if (stat(c.c_str(), &st) != 0) continue;
        if (have_self && st.st_dev == self_st.st_dev && st.st_ino == self_st.st_ino) {
            tried += " " + c + " (vcuda itself)";
            continue;
        }
        void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char* e = dlerror();
            tried += " " + c + " (" + (e ? e : "dlopen failed") + ")";
            continue;
        }
        void* init = dlsym(h, "cuInit");
        if (!init || is_ours(init)) {  // a link or copy of vcuda's own library: never forward to ourselves
            tried += " " + c + (init ? " (vcuda itself)" : " (no cuInit)");
            if (!is_ours(init)) dlclose(h);
            continue;
        }
        handle = h;
        path = c;
        break;
    }
    if (!handle) {
        std::string msg =
            "vcuda: VCUDA_TRACE: no real libcuda.so.1 could be loaded (set VCUDA_TRACE_DRIVER to its path);"
            " tried:" +
            (tried.empty() ? std::string(" nothing found") : tried);
        std::fprintf(stderr, "%s\n", msg.c_str());
        write_raw(("# " + msg).c_str());
        driver_state.store(2, std::memory_order_release);
        return;
    }
    int found = 0;
    void* probe = nullptr;
    for (int i = 0; i < symbol_count; ++i) {
        void* f = dlsym(handle, symbol_names[i]);
        if (f && is_ours(f)) f = nullptr;
        real_fns[i] = f;
        if (f) {
            ++found;
            probe = f;
        }
    }
    if (probe) {
        range_search s{reinterpret_cast<uintptr_t>(probe), &code_ranges};
        dl_iterate_phdr(&collect_code, &s);
    }
    std::string head = "# real driver: " + path + " (" + std::to_string(found) + " of " +
                       std::to_string(symbol_count) + " symbols)";
    write_raw(head.c_str());
    driver_state.store(1, std::memory_order_release);
}

const char* chosen_name(void* ours) {
    Dl_info i{};
    if (ours && dladdr(ours, &i) && i.dli_sname) return i.dli_sname;
    return nullptr;
}

}  // namespace

void* real_fn(int index) {
    if (driver_state.load(std::memory_order_acquire) == 0) std::call_once(driver_once, load_driver);
    return real_fns[index];
}

int missing(call& c) {
    bool no_driver = driver_state.load(std::memory_order_acquire) == 2;
    c.note(no_driver ? " (no real driver)" : " (the real driver lacks it)");
    return no_driver ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_NOT_SUPPORTED;
}

bool in_real_driver_code(const void* p) {
    auto a = reinterpret_cast<uintptr_t>(p);
    for (auto& [lo, hi] : code_ranges)
        if (a >= lo && a < hi) return true;
    return false;
}

// ---------------------------------------------------------------- trace functions written by hand

namespace {

// Puts our traced entry point where the driver answered its own, when vcuda's table (the real 580 driver's
// answers) names the same function. Returns the note for the line.
std::string substitute(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags) {
    void* real = *pfn;
    void* ours = nullptr;
    int st = 0;
    int version = cuda_version > driver_version ? driver_version : cuda_version;
    if (get_proc_address(symbol, &ours, version, flags, &st) != 0 || !ours)
        return " untraced: not in vcuda's table";
    const char* name = chosen_name(ours);
    int i = name ? symbol_index(name) : -1;
    if (i < 0) return " untraced: no traced twin";
    bool same = real_fns[i] == real;
    if (!same && cuda_version > driver_version)
        return std::string(" untraced: version newer than vcuda's table, driver's answer is not ") + name;
    *pfn = ours;
    std::string note = std::string(" -> ") + name;
    if (!same) {
        char b[64];
        std::snprintf(b, sizeof b, " (driver answered %p, its export is %p)", real, real_fns[i]);
        note += b;
    }
    return note;
}

}  // namespace

// Both cuGetProcAddress versions: swap the driver's answer for our traced entry point, then log the call.
// `status` is null for the first version, which has none.
static CUresult finish_proc_address(call& c, CUresult rc, const char* symbol, void** pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
    c.done();
    bool ok = rc == CUDA_SUCCESS;
    std::string note;
    if (ok && pfn && *pfn && symbol) note = substitute(symbol, pfn, cudaVersion, flags);
    c.str("symbol", symbol);
    c.hex("pfn", reinterpret_cast<uintptr_t>(pfn));
    if (ok && pfn) {
        c.text().put("->");
        c.text().hex(reinterpret_cast<uintptr_t>(*pfn));
    }
    c.arg("cudaVersion", cudaVersion);
    c.hex("flags", flags);
    if (status) c.out("symbolStatus", status, ok);
    c.result(rc);
    c.text().put(note.c_str());
    c.emit();
    return rc;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) noexcept {
    using fn_t = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    auto f = reinterpret_cast<fn_t>(real_fn(idx::cuGetProcAddress_v2));
    call c(symbol_names[idx::cuGetProcAddress_v2]);
    CUresult rc = f ? f(symbol, pfn, cudaVersion, flags, symbolStatus) : static_cast<CUresult>(missing(c));
    return finish_proc_address(c, rc, symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) noexcept {
    using fn_t = CUresult (*)(const char*, void**, int, cuuint64_t);
    auto f = reinterpret_cast<fn_t>(real_fn(idx::cuGetProcAddress));
    call c(symbol_names[idx::cuGetProcAddress]);
    CUresult rc = f ? f(symbol, pfn, cudaVersion, flags) : static_cast<CUresult>(missing(c));
    return finish_proc_address(c, rc, symbol, pfn, cudaVersion, flags, nullptr);
}

CUresult cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) noexcept {
    using fn_t = CUresult (*)(const void**, const CUuuid*);
    auto f = reinterpret_cast<fn_t>(real_fn(idx::cuGetExportTable));
    call c(symbol_names[idx::cuGetExportTable]);
    CUresult rc = f ? f(ppExportTable, pExportTableId) : static_cast<CUresult>(missing(c));
    c.done();
    bool ok = rc == CUDA_SUCCESS;
    const void* real = ok && ppExportTable ? *ppExportTable : nullptr;
    std::string note;
    if (real && pExportTableId) {
        *ppExportTable = wrap_export_table(reinterpret_cast<const unsigned char*>(pExportTableId->bytes),
                                           real, &in_real_driver_code, note);
    }
    c.out("ppExportTable", ppExportTable, ok);
    c.uuid("pExportTableId", pExportTableId);
    c.result(rc);
    if (real) {
        char b[48];
        std::snprintf(b, sizeof b, " real=%p ", real);
        c.text().put(b);
        c.text().put(note.c_str());
    }
    c.emit();
    return rc;
}

}  // namespace vcuda::client::trace
