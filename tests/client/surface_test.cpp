// The client library's surface as applications and cudart see it.
#include <dlfcn.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <cuda.h>

namespace {

std::vector<std::string> run_lines(const std::string& cmd) {
    std::vector<std::string> out;
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p);
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) {
        std::string s(buf);
        while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
        out.push_back(s);
    }
    pclose(p);
    return out;
}

std::set<std::string> dynamic_symbols(const std::string& lib) {
    std::set<std::string> s;
    for (auto& line : run_lines("nm -D --defined-only " + lib)) {
        auto pos = line.rfind(' ');
        std::string name = line.substr(pos + 1);
        s.insert(name.substr(0, name.find('@')));
    }
    return s;
}

void* client() {
    static void* h = dlopen(VCUDA_CLIENT_LIB, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(h);
    return h;
}

using get_proc_fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct expected_entry {
    std::vector<std::pair<int, std::string>> versions, ptds;
    bool has_ptds = false;
};

std::map<std::string, expected_entry> read_tsv() {
    std::map<std::string, expected_entry> t;
    std::ifstream in(VCUDA_PROCADDRESS_TSV);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream cols(line);
        std::string name, col;
        std::getline(cols, name, '\t');
        expected_entry e;
        while (std::getline(cols, col, '\t')) {
            bool ptds = col.rfind("ptds:", 0) == 0;
            if (ptds) {
                col = col.substr(5);
                e.has_ptds = true;
            }
            std::istringstream words(col);
            std::string w;
            while (words >> w) {
                auto colon = w.find(':');
                (ptds ? e.ptds : e.versions).emplace_back(std::stoi(w.substr(0, colon)), w.substr(colon + 1));
            }
        }
        t[name] = e;
    }
    return t;
}

}  // namespace

TEST_CASE("libcuda.so.1 exports exactly the driver's symbols", "[unit]") {
    auto stub = dynamic_symbols(VCUDA_CUDA_STUB);
    auto ours = dynamic_symbols(VCUDA_CLIENT_LIB);
    REQUIRE(stub.size() == 637);
    std::vector<std::string> missing, extra;
    for (auto& s : stub)
        if (!ours.count(s)) missing.push_back(s);
    for (auto& s : ours)
        if (!stub.count(s)) extra.push_back(s);
    INFO("missing: " << (missing.empty() ? "" : missing.front())
                     << " extra: " << (extra.empty() ? "" : extra.front()));
    CHECK(missing.empty());
    CHECK(extra.empty());
}

TEST_CASE("libcuda.so.1 needs nothing but the C library", "[unit]") {
    auto lines = run_lines(std::string("ldd ") + VCUDA_CLIENT_LIB);
    REQUIRE(!lines.empty());
    for (auto& l : lines) {
        bool allowed = l.find("linux-vdso") != std::string::npos || l.find("libc.so") != std::string::npos ||
                       l.find("ld-linux") != std::string::npos || l.find("libdl.so") != std::string::npos ||
                       l.find("libpthread.so") != std::string::npos ||
                       l.find("libm.so") != std::string::npos;  // glibc's math part, present wherever libc is
        // Sanitizer builds link their runtimes; that is the only exception.
        bool sanitizer = l.find("libasan") != std::string::npos || l.find("libubsan") != std::string::npos ||
                         l.find("libtsan") != std::string::npos || l.find("libstdc++") != std::string::npos ||
                         l.find("libgcc_s") != std::string::npos || l.find("libm.so") != std::string::npos;
#ifndef VCUDA_SANITIZED
        sanitizer = false;
#endif
        INFO(l);
        CHECK((allowed || sanitizer));
    }
}

TEST_CASE("cuGetProcAddress_v2 answers as driver 580 does", "[unit]") {
    auto gpa = reinterpret_cast<get_proc_fn>(dlsym(client(), "cuGetProcAddress_v2"));
    REQUIRE(gpa);
    int driver_version = 0;
    auto dgv = reinterpret_cast<CUresult (*)(int*)>(dlsym(client(), "cuDriverGetVersion"));
    REQUIRE(dgv(&driver_version) == CUDA_SUCCESS);
    auto table = read_tsv();
    REQUIRE(table.size() == 450);
    size_t checked = 0;
    for (auto& [name, e] : table) {
        for (int flags : {0, 1, 2}) {
            const auto& list = (flags == 2 && e.has_ptds) ? e.ptds : e.versions;
            for (int v = 1000; v <= 13000; v += 10) {
                void* pfn = reinterpret_cast<void*>(0x1);
                CUdriverProcAddressQueryResult st = static_cast<CUdriverProcAddressQueryResult>(99);
                CUresult rc = gpa(name.c_str(), &pfn, v, static_cast<cuuint64_t>(flags), &st);
                const std::string* want = nullptr;
                for (auto& [from, sym] : list)
                    if (from <= v) want = &sym;
                bool ok = rc == CUDA_SUCCESS &&
                          (want ? st == CU_GET_PROC_ADDRESS_SUCCESS && pfn == dlsym(client(), want->c_str())
                                : st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && pfn == nullptr);
                if (!ok) FAIL(name << " v" << v << " flags " << flags << ": rc " << rc << " status " << st);
                ++checked;
            }
        }
    }
    CHECK(checked == 450u * 3u * 1201u);

    SECTION("a version above the driver's is refused and leaves *pfn alone") {
        void* pfn = reinterpret_cast<void*>(0x1234);
        CUdriverProcAddressQueryResult st{};
        CHECK(gpa("cuMemAlloc", &pfn, driver_version + 10, 0, &st) == CUDA_ERROR_INVALID_VALUE);
        CHECK(pfn == reinterpret_cast<void*>(0x1234));
    }
    SECTION("versioned, empty and unknown names are not found") {
        for (const char* n : {"cuMemAlloc_v2", "", "cuNoSuchFunction", "cuCtxCreate_v4"}) {
            void* pfn = reinterpret_cast<void*>(0x1234);
            CUdriverProcAddressQueryResult st{};
            INFO(n);
            CHECK(gpa(n, &pfn, 12000, 0, &st) == CUDA_SUCCESS);
            CHECK(pfn == nullptr);
            CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
        }
    }
}

TEST_CASE("cuInit without a reachable server fails cleanly and fast", "[unit]") {
    // A fresh process, so the client's one-time initialization runs with the environment set here.
    auto lines = run_lines(std::string("env VCUDA_SERVER=127.0.0.1:1 VCUDA_CONNECT_TIMEOUT_MS=2000 ") +
                           "python3 -c \"import ctypes,time; l=ctypes.CDLL('" VCUDA_CLIENT_LIB
                           "'); t=time.time(); "
                           "r=l.cuInit(0); print(r, round(time.time()-t, 3))\" 2>&1");
    REQUIRE(!lines.empty());
    std::string last = lines.back();
    INFO(last);
    CHECK(last.rfind("100 ", 0) == 0);  // CUDA_ERROR_NO_DEVICE
    CHECK(std::stod(last.substr(4)) < 2.5);
    bool said_why = false;
    for (auto& l : lines) said_why |= l.find("cannot connect to vcuda-server") != std::string::npos;
    CHECK(said_why);
}

TEST_CASE("cuGetErrorName and cuGetErrorString answer locally", "[unit]") {
    auto name = reinterpret_cast<CUresult (*)(CUresult, const char**)>(dlsym(client(), "cuGetErrorName"));
    auto text = reinterpret_cast<CUresult (*)(CUresult, const char**)>(dlsym(client(), "cuGetErrorString"));
    const char* s = nullptr;
    REQUIRE(name(CUDA_ERROR_OUT_OF_MEMORY, &s) == CUDA_SUCCESS);
    CHECK(std::string(s) == "CUDA_ERROR_OUT_OF_MEMORY");
    REQUIRE(text(CUDA_ERROR_INVALID_VALUE, &s) == CUDA_SUCCESS);
    CHECK(std::string(s).size() > 10);
    CHECK(name(static_cast<CUresult>(123456), &s) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("functions vcuda does not implement answer CUDA_ERROR_NOT_SUPPORTED", "[unit]") {
    // Texture references: deprecated since CUDA 11, not served.
    auto f = reinterpret_cast<CUresult (*)(CUtexref*)>(dlsym(client(), "cuTexRefCreate"));
    REQUIRE(f);
    CUtexref t = nullptr;
    CHECK(f(&t) == CUDA_ERROR_NOT_SUPPORTED);
}
