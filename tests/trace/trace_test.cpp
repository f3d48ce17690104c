// The record mode (VCUDA_TRACE): libcuda.so.1 forwards every call to a real driver — here the software test
// driver or the fake driver — and writes one line per call. Each case loads the client in a child process
// (the mode is chosen when the library is loaded), which reports what it saw as "key value" lines; this
// process checks those and the trace file.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "client/trace_log.hpp"
#include "client/trace_tables.hpp"

namespace {

using report = std::map<std::string, std::string>;

class reporter {
  public:
    explicit reporter(int fd) : fd_(fd) {}
    template <class T>
    void put(const std::string& key, const T& v) {
        std::ostringstream s;
        s << key << ' ' << v << '\n';
        auto text = s.str();
        (void)!::write(fd_, text.data(), text.size());
    }

  private:
    int fd_;
};

// Runs `body` in a child process after setting `env`; returns what it reported. The child must exit normally.
report in_child(const std::vector<std::pair<std::string, std::string>>& env,
                const std::function<void(reporter&)>& body) {
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        for (const char* v :
             {"VCUDA_SERVER", "VCUDA_TRACE", "VCUDA_TRACE_DRIVER", "VCUDA_TRACE_ENTER", "VCUDA_TRACE_DEREF"})
            unsetenv(v);
        for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        reporter r(p[1]);
        body(r);
        close(p[1]);
        _exit(0);
    }
    close(p[1]);
    std::string all;
    char buf[4096];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
    close(p[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    INFO("child output:\n" << all);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    report r;
    std::istringstream in(all);
    std::string line;
    while (std::getline(in, line)) {
        auto sp = line.find(' ');
        r[line.substr(0, sp)] = sp == std::string::npos ? "" : line.substr(sp + 1);
    }
    return r;
}

std::string temp_trace(const char* tag) {
    std::string path = "/tmp/vcuda-trace-test-" + std::to_string(getpid()) + "-" + tag + ".log";
    unlink(path.c_str());
    return path;
}

std::vector<std::string> read_lines(const std::string& path) {
    std::vector<std::string> out;
    std::ifstream in(path);
    std::string l;
    while (std::getline(in, l)) out.push_back(l);
    return out;
}

// The call lines (not the "# ..." comments).
std::vector<std::string> call_lines(const std::vector<std::string>& all) {
    std::vector<std::string> out;
    for (auto& l : all)
        if (!l.empty() && l[0] != '#') out.push_back(l);
    return out;
}

// The lines in which the call part starts with `head`.
std::vector<std::string> lines_of(const std::vector<std::string>& all, const std::string& head) {
    std::vector<std::string> out;
    static const std::regex prefix(R"(^\d+\.\d{6} pid=\d+ tid=\d+ (depth=\d+ )?)");
    for (auto& l : all) {
        std::smatch m;
        if (std::regex_search(l, m, prefix) && l.compare(m.length(0), head.size(), head) == 0)
            out.push_back(l);
    }
    return out;
}

std::string hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return b;
}

template <class F>
F entry(void* lib, const char* name) {
    void* p = dlsym(lib, name);
    if (!p) {
        std::fprintf(stderr, "missing %s\n", name);
        _exit(3);
    }
    return reinterpret_cast<F>(p);
}

void* load_client() {
    void* h = dlopen(VCUDA_CLIENT_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        std::fprintf(stderr, "dlopen: %s\n", dlerror());
        _exit(2);
    }
    return h;
}

std::string tid_of(const std::string& line) {
    auto p = line.find("tid=");
    return line.substr(p + 4, line.find(' ', p) - p - 4);
}

const std::regex call_line(R"(^\d+\.\d{6} pid=\d+ tid=\d+ (depth=\d+ )?\w+\(.*\) = \w+ \d+\.\dus( .*)?$)");

}  // namespace

TEST_CASE("record mode forwards to the real driver and writes one line per call", "[unit]") {
    auto path = temp_trace("soft");
    auto r = in_child({{"VCUDA_TRACE", path}, {"VCUDA_TRACE_DRIVER", VCUDA_SOFTDRIVER}}, [](reporter& out) {
        void* h = load_client();
        auto cuInit_ = entry<CUresult (*)(unsigned)>(h, "cuInit");
        auto cuDeviceGetCount_ = entry<CUresult (*)(int*)>(h, "cuDeviceGetCount");
        auto cuDeviceGet_ = entry<CUresult (*)(CUdevice*, int)>(h, "cuDeviceGet");
        auto cuDeviceGetName_ = entry<CUresult (*)(char*, int, CUdevice)>(h, "cuDeviceGetName");
        auto cuCtxCreate_ = entry<CUresult (*)(CUcontext*, unsigned, CUdevice)>(h, "cuCtxCreate_v2");
        auto cuCtxDestroy_ = entry<CUresult (*)(CUcontext)>(h, "cuCtxDestroy_v2");
        auto cuMemAlloc_ = entry<CUresult (*)(CUdeviceptr*, size_t)>(h, "cuMemAlloc_v2");
        auto cuMemcpyHtoD_ = entry<CUresult (*)(CUdeviceptr, const void*, size_t)>(h, "cuMemcpyHtoD_v2");
        auto cuMemcpyDtoH_ = entry<CUresult (*)(void*, CUdeviceptr, size_t)>(h, "cuMemcpyDtoH_v2");
        auto cuGetProcAddress_v2_ =
            entry<CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*)>(
                h, "cuGetProcAddress_v2");
        auto cuGetProcAddress_ =
            entry<CUresult (*)(const char*, void**, int, cuuint64_t)>(h, "cuGetProcAddress");

        out.put("init", cuInit_(0));
        int count = -1;
        out.put("count_rc", cuDeviceGetCount_(&count));
        out.put("count", count);
        CUdevice dev = -1;
        out.put("get_rc", cuDeviceGet_(&dev, 0));
        char name[128] = {0};
        out.put("name_rc", cuDeviceGetName_(name, sizeof name, dev));
        out.put("name", name);
        CUcontext ctx = nullptr;
        out.put("ctx_rc", cuCtxCreate_(&ctx, 0, dev));
        out.put("ctx", hex(reinterpret_cast<uintptr_t>(ctx)));
        CUdeviceptr p = 0;
        out.put("alloc_rc", cuMemAlloc_(&p, 4096));
        out.put("ptr", hex(p));
        std::vector<uint32_t> in(1024), back(1024);
        std::iota(in.begin(), in.end(), 7u);
        out.put("htod_rc", cuMemcpyHtoD_(p, in.data(), 4096));
        // The software driver's device memory is host memory: the bytes are at p if it did the copy.
        out.put("device_bytes", std::memcmp(reinterpret_cast<void*>(p), in.data(), 4096) == 0);
        out.put("dtoh_rc", cuMemcpyDtoH_(back.data(), p, 4096));
        out.put("round_trip", back == in);
        void* fn = nullptr;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        out.put("gpa_rc", cuGetProcAddress_v2_("cuMemFree", &fn, 12000, 0, &st));
        out.put("gpa_status", static_cast<int>(st));
        out.put("gpa_ours", fn == dlsym(h, "cuMemFree_v2"));
        out.put("free_rc", fn ? reinterpret_cast<CUresult (*)(CUdeviceptr)>(fn)(p) : -1);
        std::thread other([&] {
            int c = 0;
            cuDeviceGetCount_(&c);
        });
        other.join();
        out.put("destroy_rc", cuCtxDestroy_(ctx));
        void* fn1 = nullptr;
        out.put("gpa1_rc",
                cuGetProcAddress_("cuInit", &fn1, 12000, 0));  // the soft driver has no cuGetProcAddress
    });

    CHECK(r["init"] == "0");
    CHECK(r["count_rc"] == "0");
    CHECK(r["count"] == "1");
    CHECK(r["name_rc"] == "0");
    CHECK(r["name"] == "vcuda software test driver (CPU)");
    CHECK(r["ctx_rc"] == "0");
    CHECK(r["alloc_rc"] == "0");
    CHECK(r["htod_rc"] == "0");
    CHECK(r["device_bytes"] == "1");
    CHECK(r["dtoh_rc"] == "0");
    CHECK(r["round_trip"] == "1");
    CHECK(r["gpa_rc"] == "0");
    CHECK(r["gpa_status"] == "0");
    CHECK(r["gpa_ours"] == "1");
    CHECK(r["free_rc"] == "0");
    CHECK(r["destroy_rc"] == "0");
    CHECK(r["gpa1_rc"] == "801");

    auto all = read_lines(path);
    INFO("trace:\n"
         << [&] {
                std::string s;
                for (auto& l : all) s += l + "\n";
                return s;
            }());
    REQUIRE(!all.empty());
    CHECK(all[0].rfind("# vcuda trace: pid=", 0) == 0);
    bool driver_line = false;
    for (auto& l : all)
        driver_line |= l.rfind(std::string("# real driver: ") + VCUDA_SOFTDRIVER + " (", 0) == 0;
    CHECK(driver_line);

    auto calls = call_lines(all);
    CHECK(calls.size() == 13);  // one line per call, the one through the cuGetProcAddress pointer included
    for (auto& l : calls) {
        INFO(l);
        CHECK(std::regex_match(l, call_line));
    }
    auto one = [&](const std::string& head) {
        auto v = lines_of(all, head);
        INFO(head);
        REQUIRE(v.size() == 1);
        return v[0];
    };
    CHECK(one("cuInit(").find("cuInit(Flags=0x0) = CUDA_SUCCESS ") != std::string::npos);
    CHECK(std::regex_search(one("cuDeviceGet("),
                            std::regex(R"(cuDeviceGet\(device=0x[0-9a-f]+->0, ordinal=0\) = CUDA_SUCCESS)")));
    CHECK(std::regex_search(
        one("cuDeviceGetName("),
        std::regex(
            R"re(cuDeviceGetName\(name=0x[0-9a-f]+->"vcuda software test driver \(CPU\)", len=128, dev=0\) = CUDA_SUCCESS)re")));
    CHECK(std::regex_search(one("cuCtxCreate_v2("),
                            std::regex("cuCtxCreate_v2\\(pctx=0x[0-9a-f]+->" + r["ctx"] +
                                       ", flags=0x0, dev=0\\) = CUDA_SUCCESS")));
    CHECK(std::regex_search(
        one("cuMemAlloc_v2("),
        std::regex("cuMemAlloc_v2\\(dptr=0x[0-9a-f]+->" + r["ptr"] + ", bytesize=4096\\) = CUDA_SUCCESS")));
    CHECK(std::regex_search(one("cuMemcpyHtoD_v2("),
                            std::regex("cuMemcpyHtoD_v2\\(dstDevice=" + r["ptr"] +
                                       ", srcHost=0x[0-9a-f]+, ByteCount=4096\\) = CUDA_SUCCESS")));
    CHECK(std::regex_search(one("cuMemcpyDtoH_v2("),
                            std::regex("cuMemcpyDtoH_v2\\(dstHost=0x[0-9a-f]+, srcDevice=" + r["ptr"] +
                                       ", ByteCount=4096\\) = CUDA_SUCCESS")));
    CHECK(std::regex_search(
        one("cuGetProcAddress_v2("),
        std::regex(
            R"re(cuGetProcAddress_v2\(symbol="cuMemFree", pfn=0x[0-9a-f]+->0x[0-9a-f]+, cudaVersion=12000, flags=0x0, symbolStatus=0x[0-9a-f]+->0\) = CUDA_SUCCESS \d+\.\dus -> cuMemFree_v2)re")));
    CHECK(std::regex_search(one("cuMemFree_v2("),
                            std::regex("cuMemFree_v2\\(dptr=" + r["ptr"] + "\\) = CUDA_SUCCESS")));
    CHECK(one("cuCtxDestroy_v2(").find("cuCtxDestroy_v2(ctx=" + r["ctx"] + ") = CUDA_SUCCESS") !=
          std::string::npos);
    CHECK(std::regex_search(
        one("cuGetProcAddress("),
        std::regex(
            R"re(cuGetProcAddress\(symbol="cuInit", pfn=0x[0-9a-f]+, cudaVersion=12000, flags=0x0\) = CUDA_ERROR_NOT_SUPPORTED \d+\.\dus \(the real driver lacks it\)$)re")));

    auto counts = lines_of(all, "cuDeviceGetCount(");
    REQUIRE(counts.size() == 2);
    CHECK(counts[0].find("cuDeviceGetCount(count=0x") != std::string::npos);
    CHECK(counts[0].find("->1) = CUDA_SUCCESS") != std::string::npos);
    CHECK(tid_of(counts[0]) != tid_of(counts[1]));  // the second came from another thread
    unlink(path.c_str());
}

TEST_CASE("record mode: every exported symbol forwards to the real driver's", "[unit]") {
    auto path = temp_trace("all");
    auto r = in_child({{"VCUDA_TRACE", path}, {"VCUDA_TRACE_DRIVER", VCUDA_FAKE_DRIVER}}, [](reporter& out) {
        void* h = load_client();
        std::ifstream in(VCUDA_EXPORT_LIST);
        std::string name;
        int n = 0, wrong = 0;
        std::string wrong_names;
        void* fake = nullptr;
        for (; in >> name; ++n) {
            using any_fn = int (*)(long, long, long, long, long, long, long, long);
            auto f = entry<any_fn>(h, name.c_str());
            int rc = f(0, 0, 0, 0, 0, 0, 0, 0);  // all arguments zero: the fake looks at none of them
            if (!fake) fake = dlopen(VCUDA_FAKE_DRIVER, RTLD_NOW | RTLD_NOLOAD);
            const char* last = fake ? *static_cast<const char**>(dlsym(fake, "fake_last_call")) : nullptr;
            int expected = name == "cuInit"                                               ? 0
                           : (name == "cuDriverGetVersion" || name == "cuGetExportTable") ? 1
                                                                                          : 999;
            if (!last || name != last || rc != expected) {
                ++wrong;
                wrong_names += " " + name + "=" + std::to_string(rc);
            }
        }
        out.put("symbols", n);
        out.put("wrong", wrong);
        out.put("wrong_names", wrong_names);
    });
    CHECK(r["symbols"] == "637");
    CHECK(r["wrong"] == "0");
    CHECK(r["wrong_names"] == "");

    auto calls = call_lines(read_lines(path));
    CHECK(calls.size() == 637);
    std::set<std::string> seen;
    static const std::regex name_re(R"(^\d+\.\d{6} pid=\d+ tid=\d+ (\w+)\()");
    for (auto& l : calls) {
        std::smatch m;
        if (std::regex_search(l, m, name_re)) seen.insert(m[1]);
    }
    CHECK(seen.size() == 637);
    unlink(path.c_str());
}

namespace {

constexpr unsigned char id_tools[16] = {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48,
                                        0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2};
constexpr unsigned char id_cls[16] = {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11,
                                      0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93};
constexpr unsigned char id_cudart[16] = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                         0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};
constexpr unsigned char id_integrity[16] = {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b,
                                            0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2};
constexpr unsigned char id_callbacks[16] = {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74,
                                            0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66};
constexpr unsigned char id_unlisted_sized[16] = {0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
constexpr unsigned char id_unlisted_plain[16] = {0x05, 0x06, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
constexpr unsigned char id_unknown[16] = {0xee, 0xee, 0xee, 0xee, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3};

using word = uintptr_t;
using slot_fn = word (*)(word, word, word, word, word, word);
using get_table_fn = int (*)(const void**, const unsigned char*);

}  // namespace

TEST_CASE("record mode: export tables are copies whose slots are logging shims", "[unit]") {
    auto path = temp_trace("tables");
    auto r = in_child({{"VCUDA_TRACE", path}, {"VCUDA_TRACE_DRIVER", VCUDA_FAKE_DRIVER}}, [](reporter& out) {
        void* h = load_client();
        auto get = entry<get_table_fn>(h, "cuGetExportTable");
        auto init = entry<int (*)(unsigned)>(h, "cuInit");
        init(0);  // loads the fake driver
        void* fake = dlopen(VCUDA_FAKE_DRIVER, RTLD_NOW | RTLD_NOLOAD);
        auto real_get = entry<get_table_fn>(fake, "cuGetExportTable");
        auto both = [&](const unsigned char* id, const word*& copy, const word*& real) {
            const void* c = nullptr;
            const void* rl = nullptr;
            int rc = get(&c, id);
            real_get(&rl, id);
            copy = static_cast<const word*>(c);
            real = static_cast<const word*>(rl);
            return rc;
        };
        const word *c, *rl;

        out.put("tools_rc", both(id_tools, c, rl));
        out.put("tools_copied", c != rl);
        out.put("tools_size", c[0] == rl[0] && c[0] == 93 * sizeof(word));
        out.put("tools_wrapped", c[4] != rl[4] && c[92] != rl[92]);
        word buf[4] = {0, 0, 0, 0};
        out.put("tools_4", reinterpret_cast<slot_fn>(c[4])(reinterpret_cast<word>(buf), 7, 3, 0, 0, 0));
        out.put("tools_4_wrote", buf[0] == 7 && buf[1] == 8 && buf[2] == 9 && buf[3] == 10);
        out.put("buf", hex(reinterpret_cast<word>(buf)));
        // An argument that looks like a pointer but is not readable: not dumped, nothing breaks.
        void* page = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        munmap(page, 4096);
        out.put("gone", hex(reinterpret_cast<word>(page)));
        out.put("tools_92", reinterpret_cast<slot_fn>(c[92])(0, 0, 1, reinterpret_cast<word>(page), 0, 0));
        const word* again = nullptr;
        const void* a = nullptr;
        get(&a, id_tools);
        again = static_cast<const word*>(a);
        out.put("tools_same_copy", again == c);

        out.put("cls_rc", both(id_cls, c, rl));
        out.put("cls_wrapped", c != rl && c[0] != rl[0] && c[1] != rl[1] && c[2] != rl[2]);
        word value = 0;
        out.put("cls_get", reinterpret_cast<slot_fn>(c[2])(reinterpret_cast<word>(&value), 0, 21, 0, 0, 0));
        out.put("cls_value", value);

        both(id_cudart, c, rl);
        out.put("cudart_untouched", c == rl);
        both(id_integrity, c, rl);
        out.put("integrity_untouched", c == rl);

        both(id_callbacks, c, rl);
        bool listed = c != rl && c[0] == 9 * sizeof(word);
        for (int i = 1; i < 7; ++i) listed = listed && c[i] != rl[i];
        out.put("callbacks_listed_wrapped", listed);
        out.put("callbacks_beyond_untouched", c[7] == rl[7] && c[8] == rl[8]);

        both(id_unlisted_sized, c, rl);
        out.put("sized_layout",
                c != rl && c[0] == rl[0] && c[1] != rl[1] && c[2] == rl[2] && c[3] != rl[3] && c[4] == 0);
        out.put("sized_sum", reinterpret_cast<slot_fn>(c[1])(1, 2, 3, 4, 5, 6));

        both(id_unlisted_plain, c, rl);
        out.put("plain_layout", c != rl && c[0] != rl[0] && c[1] != rl[1] && c[2] != rl[2]);
        out.put("plain_sum", reinterpret_cast<slot_fn>(c[2])(1, 1, 1, 1, 1, 1));

        const void* untouched = &out;
        out.put("unknown_rc", get(&untouched, id_unknown));
        out.put("unknown_left", untouched == &out);
    });
    CHECK(r["tools_rc"] == "0");
    CHECK(r["tools_copied"] == "1");
    CHECK(r["tools_size"] == "1");
    CHECK(r["tools_wrapped"] == "1");
    CHECK(r["tools_4"] == "107");
    CHECK(r["tools_4_wrote"] == "1");
    CHECK(r["tools_92"] == "193");
    CHECK(r["tools_same_copy"] == "1");
    CHECK(r["cls_rc"] == "0");
    CHECK(r["cls_wrapped"] == "1");
    CHECK(r["cls_get"] == "0");
    CHECK(r["cls_value"] == "42");
    CHECK(r["cudart_untouched"] == "1");
    CHECK(r["integrity_untouched"] == "1");
    CHECK(r["callbacks_listed_wrapped"] == "1");
    CHECK(r["callbacks_beyond_untouched"] == "1");
    CHECK(r["sized_layout"] == "1");
    CHECK(r["sized_sum"] == "21");
    CHECK(r["plain_layout"] == "1");
    CHECK(r["plain_sum"] == "6");
    CHECK(r["unknown_rc"] == "500");
    CHECK(r["unknown_left"] == "1");

    auto all = read_lines(path);
    INFO("trace:\n"
         << [&] {
                std::string s;
                for (auto& l : all) s += l + "\n";
                return s;
            }());
    auto slot4 = lines_of(all, "export 21318c60[4](");
    REQUIRE(slot4.size() == 1);
    CHECK(slot4[0].find("export 21318c60[4](" + r["buf"] + ", 0x7, 0x3, 0x0, 0x0, 0x0) = 0x6b ") !=
          std::string::npos);
    CHECK(slot4[0].find(" *a0=[0x7<-0x0, 0x8<-0x0, 0x9<-0x0, 0xa<-0x0]") !=
          std::string::npos);  // written: old values shown
    auto slot92 = lines_of(all, "export 21318c60[92](");
    REQUIRE(slot92.size() == 1);
    CHECK(slot92[0].find(", " + r["gone"] + ", ") != std::string::npos);
    CHECK(slot92[0].find("*a3=") == std::string::npos);
    auto cls = lines_of(all, "export c693336e[2](");
    REQUIRE(cls.size() == 1);
    CHECK(cls[0].find(", 0x0, 0x15, ") != std::string::npos);
    CHECK(cls[0].find(") = 0x0 ") != std::string::npos);
    CHECK(cls[0].find(" *a0=[0x2a<-0x0, 0x7, ") !=
          std::string::npos);  // only the written word shows its old value
    CHECK(lines_of(all, "export 01020304[1](0x1, 0x2, 0x3, 0x4, 0x5, 0x6) = 0x15 ").size() == 1);
    CHECK(lines_of(all, "export 05060708[2](0x1, 0x1, 0x1, 0x1, 0x1, 0x1) = 0x6 ").size() == 1);
    CHECK(lines_of(all, "export 6bd5fb6c").empty());

    auto tables = lines_of(all, "cuGetExportTable(");
    auto with = [&](const std::string& text) {
        int n = 0;
        for (auto& l : tables) n += l.find(text) != std::string::npos;
        return n;
    };
    CHECK(with("pExportTableId=0x") == static_cast<int>(tables.size()));
    CHECK(with("->21318c60-9714-3248-8ca6-41ff7324c8f2) = CUDA_SUCCESS") == 2);
    CHECK(with("copy of 93 words (size word kept): 92 entry points traced") == 1);
    CHECK(with("copy made before") == 1);
    CHECK(with("copy of 3 words (no size word): 3 entry points traced") == 2);  // c693336e, 05060708
    CHECK(with("untouched (cudart interface") == 1);
    CHECK(with("untouched (integrity check") == 1);
    CHECK(with("6 entry points traced, 2 words past the listed slots copied untraced") == 1);
    CHECK(with("copy of 5 words (size word kept): 2 entry points traced, 1 words that are not code copied as "
               "they are") == 1);
    CHECK(with(") = CUDA_ERROR_NOT_FOUND ") == 1);
    unlink(path.c_str());
}

TEST_CASE("record mode never forwards to vcuda itself", "[unit]") {
    auto path = temp_trace("self");
    auto r = in_child({{"VCUDA_TRACE", path}, {"VCUDA_TRACE_DRIVER", VCUDA_CLIENT_LIB}}, [](reporter& out) {
        void* h = load_client();
        out.put("init", entry<int (*)(unsigned)>(h, "cuInit")(0));
        int n = -1;
        out.put("count_rc", entry<int (*)(int*)>(h, "cuDeviceGetCount")(&n));
    });
    CHECK(r["init"] == "100");  // CUDA_ERROR_NO_DEVICE
    CHECK(r["count_rc"] == "100");
    auto all = read_lines(path);
    bool said = false;
    for (auto& l : all)
        said |= l.find("no real libcuda.so.1 could be loaded") != std::string::npos &&
                l.find("(vcuda itself)") != std::string::npos;
    CHECK(said);
    auto init = lines_of(all, "cuInit(Flags=0x0) = CUDA_ERROR_NO_DEVICE ");
    REQUIRE(init.size() == 1);
    CHECK(init[0].find("us (no real driver)") != std::string::npos);
    auto count = lines_of(all, "cuDeviceGetCount(count=0x");
    REQUIRE(count.size() == 1);
    CHECK(count[0].find(") = CUDA_ERROR_NO_DEVICE ") != std::string::npos);
    unlink(path.c_str());
}

TEST_CASE("record mode: VCUDA_TRACE_ENTER writes a line before each call", "[unit]") {
    auto path = temp_trace("enter");
    in_child({{"VCUDA_TRACE", path}, {"VCUDA_TRACE_DRIVER", VCUDA_FAKE_DRIVER}, {"VCUDA_TRACE_ENTER", "1"}},
             [](reporter&) {
                 void* h = load_client();
                 entry<int (*)(unsigned)>(h, "cuInit")(0);
             });
    auto calls = call_lines(read_lines(path));
    REQUIRE(calls.size() == 2);
    CHECK(lines_of(calls, "> cuInit").size() == 1);
    CHECK(calls[0].find("> cuInit") != std::string::npos);
    CHECK(calls[1].find("cuInit(Flags=0x0) = CUDA_SUCCESS") != std::string::npos);
    unlink(path.c_str());
}

TEST_CASE("record mode is off without VCUDA_TRACE", "[unit]") {
    auto r = in_child({}, [](reporter& out) {
        void* h = load_client();
        out.put("init",
                entry<int (*)(unsigned)>(h, "cuInit")(0));  // no server configured: vcuda's own answer
    });
    CHECK(r["init"] == "100");
}

// ------------------------------------------------------------------ the pieces, built into this test

TEST_CASE("trace lines: formatting, safe reads", "[unit]") {
    using namespace vcuda::client::trace;
    uint64_t v[4] = {1, 2, 3, 4};
    uint64_t got[4] = {};
    CHECK(safe_read(v, got, sizeof got));
    CHECK(got[3] == 4);
    CHECK_FALSE(safe_read(nullptr, got, 8));
    void* page = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(page != MAP_FAILED);
    munmap(static_cast<char*>(page) + 4096, 4096);
    CHECK(safe_read(static_cast<char*>(page) + 4096 - 8, got, 8));
    CHECK_FALSE(safe_read(static_cast<char*>(page) + 4096 - 8, got, 16));  // crosses into the unmapped page
    munmap(page, 4096);
    CHECK_FALSE(plausible_pointer(0));
    CHECK_FALSE(plausible_pointer(4096));
    CHECK(plausible_pointer(reinterpret_cast<uintptr_t>(v)));
    CHECK(std::string(result_name(0)) == "CUDA_SUCCESS");
    CHECK(std::string(result_name(801)) == "CUDA_ERROR_NOT_SUPPORTED");
    CHECK(result_name(123456) == nullptr);

    int p[2];
    REQUIRE(pipe(p) == 0);
    set_output_fd(p[1]);
    {
        call c("cuExample");
        c.done();
        int out = 5;
        float f = 0.5f;
        struct two {
            uint32_t a, b;
        } s{1, 2};
        c.arg("n", -3);
        c.str("s", "a\"b\n");
        c.str("none", nullptr);
        c.out("out", &out, true);
        c.out("notwritten", &out, false);
        c.hex("flags", 0x10);
        c.arg("f", f);
        c.arg("st", s);
        c.end(1);
    }
    set_output_fd(-1);
    close(p[1]);
    char buf[1024] = {0};
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    REQUIRE(n > 0);
    std::string line(buf, static_cast<size_t>(n));
    CHECK(std::regex_match(
        line,
        std::regex(
            R"re(\d+\.\d{6} pid=\d+ tid=\d+ cuExample\(n=-3, s="a\\"b\\x0a", none=null, out=0x[0-9a-f]+->5, notwritten=0x[0-9a-f]+, flags=0x10, f=0.5, st=\{0x200000001\}\) = CUDA_ERROR_INVALID_VALUE \d+\.\dus\n)re")));
}

TEST_CASE("export-table shims built in this process", "[unit]") {
    using namespace vcuda::client::trace;
    static word table[4];
    struct fns {
        static word twice(word a0, word, word, word, word, word) { return 2 * a0; }
    };
    table[0] = sizeof table;
    table[1] = reinterpret_cast<word>(&fns::twice);
    table[2] = reinterpret_cast<word>(&table[3]);  // data: not code
    table[3] = 0;
    static const void* code_fn = reinterpret_cast<const void*>(&fns::twice);
    int p[2];
    REQUIRE(pipe(p) == 0);
    set_output_fd(p[1]);
    std::string note;
    constexpr unsigned char id[16] = {0xab, 0xcd, 0xef, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9};
    auto* copy = static_cast<const word*>(wrap_export_table(
        id, table, [](const void* q) { return q == code_fn; }, note));
    REQUIRE(copy != table);
    CHECK(copy[0] == table[0]);
    CHECK(copy[2] == table[2]);
    CHECK(copy[1] != table[1]);
    CHECK(reinterpret_cast<slot_fn>(copy[1])(21, 0, 0, 0, 0, 0) == 42);
    CHECK(note ==
          "copy of 4 words (size word kept): 1 entry points traced, 1 words that are not code copied as they "
          "are");
    set_output_fd(-1);
    close(p[1]);
    char buf[1024] = {0};
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    REQUIRE(n > 0);
    CHECK(std::string(buf).find("export abcdef01[1](0x15, 0x0, 0x0, 0x0, 0x0, 0x0) = 0x2a ") !=
          std::string::npos);
}
