// vcuda_nvml_probe: an NVML user and a CUDA user in one process, as PyTorch is. Loads vcuda's
// libnvidia-ml.so.1 and libcuda.so.1 from the build's lib/vcuda/ and prints what both say as key=value
// lines, for tests/nvml/nvml_test.cpp (which runs it as a child, so each run starts with a fresh client).
//   probe init            nvmlInit's result and how long it took
//   probe query           devices seen by NVML and by CUDA; memory and processes around a cuMemAlloc
//   probe lost SERVER_PID queries, then kills the server and queries again
//   probe listing         the GPUs NVML lists and those CUDA sees (CUDA_VISIBLE_DEVICES applies to CUDA
//   only),
//                         and NVML's memory use of each after a cuMemAlloc on CUDA device 0
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "common/nvml_api.hpp"

namespace {

void* nvml_lib = nullptr;
void* cuda_lib = nullptr;

template <class F>
F nvml(const char* name) {
    auto f = reinterpret_cast<F>(dlsym(nvml_lib, name));
    if (!f) {
        std::printf("missing=%s\n", name);
        std::exit(3);
    }
    return f;
}
#define NVML(name) nvml<decltype(&::name)>(#name)

template <class F>
F cuda(const char* name) {
    auto f = reinterpret_cast<F>(dlsym(cuda_lib, name));
    if (!f) {
        std::printf("missing=%s\n", name);
        std::exit(3);
    }
    return f;
}

void print(const char* key, long long v) { std::printf("%s=%lld\n", key, v); }
void print(const char* key, const char* v) { std::printf("%s=%s\n", key, v); }

void memory_and_processes(nvmlDevice_t h, const char* when) {
    nvmlMemory_t m{};
    std::string k = std::string(when);
    print((k + ".memory.rc").c_str(), NVML(nvmlDeviceGetMemoryInfo)(h, &m));
    print((k + ".memory.total").c_str(), static_cast<long long>(m.total));
    print((k + ".memory.used").c_str(), static_cast<long long>(m.used));
    print((k + ".memory.free").c_str(), static_cast<long long>(m.free));
    nvmlMemory_v2_t m2{};
    m2.version = nvmlMemory_v2;
    print((k + ".memory_v2.rc").c_str(), NVML(nvmlDeviceGetMemoryInfo_v2)(h, &m2));
    print((k + ".memory_v2.used").c_str(), static_cast<long long>(m2.used));
    nvmlProcessInfo_t procs[4]{};
    unsigned n = 4;
    print((k + ".processes.rc").c_str(), NVML(nvmlDeviceGetComputeRunningProcesses_v3)(h, &n, procs));
    print((k + ".processes.count").c_str(), n);
    if (n > 0) {
        print((k + ".processes.pid").c_str(), procs[0].pid);
        print((k + ".processes.used").c_str(), static_cast<long long>(procs[0].usedGpuMemory));
    }
}

int query() {
    print("pid", getpid());
    print("init.rc", NVML(nvmlInit_v2)());
    unsigned count = 0;
    print("count.rc", NVML(nvmlDeviceGetCount_v2)(&count));
    print("count", count);
    int cuda_count = 0;
    cuda<CUresult (*)(unsigned)>("cuInit")(0);
    cuda<CUresult (*)(int*)>("cuDeviceGetCount")(&cuda_count);
    print("cuda.count", cuda_count);
    int version = 0, cuda_version = 0;
    print("cuda_version.rc", NVML(nvmlSystemGetCudaDriverVersion_v2)(&version));
    print("cuda_version", version);
    cuda<CUresult (*)(int*)>("cuDriverGetVersion")(&cuda_version);
    print("cuda.cuda_version", cuda_version);
    char text[96];
    print("driver_version.rc", NVML(nvmlSystemGetDriverVersion)(text, sizeof text));

    for (unsigned i = 0; i < count; ++i) {
        std::string p = "dev" + std::to_string(i) + ".";
        auto key = [&](const char* k) { return p + k; };
        nvmlDevice_t h = nullptr;
        print(key("handle.rc").c_str(), NVML(nvmlDeviceGetHandleByIndex_v2)(i, &h));
        print(key("name.rc").c_str(), NVML(nvmlDeviceGetName)(h, text, sizeof text));
        print(key("name").c_str(), text);
        print(key("uuid.rc").c_str(), NVML(nvmlDeviceGetUUID)(h, text, sizeof text));
        print(key("uuid").c_str(), text);
        nvmlDevice_t by = nullptr;
        print(key("by_uuid.rc").c_str(), NVML(nvmlDeviceGetHandleByUUID)(text, &by));
        print(key("by_uuid.same").c_str(), by == h);
        nvmlPciInfo_t pci{};
        print(key("pci.rc").c_str(), NVML(nvmlDeviceGetPciInfo_v3)(h, &pci));
        print(key("pci.bus_id").c_str(), pci.busId);
        print(key("pci.bus_id_legacy").c_str(), pci.busIdLegacy);
        print(key("pci.device_id").c_str(), pci.pciDeviceId);
        by = nullptr;
        print(key("by_pci.rc").c_str(), NVML(nvmlDeviceGetHandleByPciBusId_v2)(pci.busId, &by));
        print(key("by_pci.same").c_str(), by == h);
        unsigned index = 99;
        print(key("index.rc").c_str(), NVML(nvmlDeviceGetIndex)(h, &index));
        print(key("index").c_str(), index);
        int major = 0, minor = 0;
        print(key("cc.rc").c_str(), NVML(nvmlDeviceGetCudaComputeCapability)(h, &major, &minor));
        print(key("cc").c_str(), major * 10 + minor);
        nvmlUtilization_t u{};
        print(key("utilization.rc").c_str(), NVML(nvmlDeviceGetUtilizationRates)(h, &u));
        unsigned t = 0;
        print(key("temperature.rc").c_str(), NVML(nvmlDeviceGetTemperature)(h, NVML_TEMPERATURE_GPU, &t));
        print(key("power.rc").c_str(), NVML(nvmlDeviceGetPowerUsage)(h, &t));
        print(key("serial.rc").c_str(), NVML(nvmlDeviceGetSerial)(h, text, sizeof text));
        auto vbios = nvml<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(
            "nvmlDeviceGetVbiosVersion");  // a generated stub
        print(key("vbios.rc").c_str(), vbios(h, text, sizeof text));
        nvmlFieldValue_t field{};
        field.fieldId = 1;
        print(key("fields.rc").c_str(), NVML(nvmlDeviceGetFieldValues)(h, 1, &field));
        print(key("fields.field_rc").c_str(), field.nvmlReturn);
        unsigned is_mig = 7;
        print(key("is_mig.rc").c_str(), NVML(nvmlDeviceIsMigDeviceHandle)(h, &is_mig));
        print(key("is_mig").c_str(), is_mig);
        nvmlGpuP2PStatus_t p2p = NVML_P2P_STATUS_UNKNOWN;
        print(key("p2p_self.rc").c_str(), NVML(nvmlDeviceGetP2PStatus)(h, h, NVML_P2P_CAPS_INDEX_READ, &p2p));
        print(key("p2p_self").c_str(), p2p);
        print(key("p2p_loopback.rc").c_str(),
              NVML(nvmlDeviceGetP2PStatus)(h, h, NVML_P2P_CAPS_INDEX_LOOPBACK, &p2p));
        print(key("p2p_loopback").c_str(), p2p);
        print(key("p2p_bad_index.rc").c_str(),
              NVML(nvmlDeviceGetP2PStatus)(h, h, static_cast<nvmlGpuP2PCapsIndex_t>(99), &p2p));

        // The same device as CUDA sees it.
        CUdevice dev = 0;
        cuda<CUresult (*)(CUdevice*, int)>("cuDeviceGet")(&dev, static_cast<int>(i));
        cuda<CUresult (*)(char*, int, CUdevice)>("cuDeviceGetName")(text, sizeof text, dev);
        print(key("cuda.name").c_str(), text);
        CUuuid id{};
        cuda<CUresult (*)(CUuuid*, CUdevice)>("cuDeviceGetUuid_v2")(&id, dev);
        char uuid[41];
        vcuda::nvml::format_gpu_uuid(id.bytes, uuid);
        print(key("cuda.uuid").c_str(), uuid);
        cuda<CUresult (*)(char*, int, CUdevice)>("cuDeviceGetPCIBusId")(text, sizeof text, dev);
        print(key("cuda.bus_id").c_str(), text);
        size_t total = 0;
        cuda<CUresult (*)(size_t*, CUdevice)>("cuDeviceTotalMem_v2")(&total, dev);
        print(key("cuda.total").c_str(), static_cast<long long>(total));

        memory_and_processes(h, (p + "before").c_str());
        CUcontext ctx = nullptr;
        cuda<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain")(&ctx, dev);
        cuda<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(ctx);
        CUdeviceptr ptr = 0;
        print(key("cuda.alloc.rc").c_str(),
              cuda<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc_v2")(&ptr, 64u << 20));
        memory_and_processes(h, (p + "allocated").c_str());
        cuda<CUresult (*)(CUdeviceptr)>("cuMemFree_v2")(ptr);
        memory_and_processes(h, (p + "freed").c_str());
    }
    print("shutdown.rc", NVML(nvmlShutdown)());
    print("after_shutdown.rc", NVML(nvmlDeviceGetCount_v2)(&count));
    return 0;
}

int listing() {
    print("init.rc", NVML(nvmlInit_v2)());
    unsigned count = 0;
    print("count.rc", NVML(nvmlDeviceGetCount_v2)(&count));
    print("count", count);
    char text[96];
    for (unsigned i = 0; i < count; ++i) {
        nvmlDevice_t h = nullptr;
        NVML(nvmlDeviceGetHandleByIndex_v2)(i, &h);
        NVML(nvmlDeviceGetUUID)(h, text, sizeof text);
        print(("nvml" + std::to_string(i) + ".uuid").c_str(), text);
    }
    int cuda_count = 0;
    cuda<CUresult (*)(unsigned)>("cuInit")(0);
    cuda<CUresult (*)(int*)>("cuDeviceGetCount")(&cuda_count);
    print("cuda.count", cuda_count);
    for (int i = 0; i < cuda_count; ++i) {
        CUdevice dev = 0;
        cuda<CUresult (*)(CUdevice*, int)>("cuDeviceGet")(&dev, i);
        CUuuid id{};
        cuda<CUresult (*)(CUuuid*, CUdevice)>("cuDeviceGetUuid_v2")(&id, dev);
        char uuid[41];
        vcuda::nvml::format_gpu_uuid(id.bytes, uuid);
        print(("cuda" + std::to_string(i) + ".uuid").c_str(), uuid);
    }
    CUcontext ctx = nullptr;
    cuda<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain")(&ctx, 0);
    cuda<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(ctx);
    CUdeviceptr ptr = 0;
    print("cuda.alloc.rc", cuda<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc_v2")(&ptr, 64u << 20));
    for (unsigned i = 0; i < count; ++i) {
        nvmlDevice_t h = nullptr;
        NVML(nvmlDeviceGetHandleByIndex_v2)(i, &h);
        memory_and_processes(h, ("nvml" + std::to_string(i)).c_str());
    }
    return 0;
}

long long ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
        .count();
}

int init() {
    auto t0 = std::chrono::steady_clock::now();
    print("init.rc", NVML(nvmlInit_v2)());
    print("init.ms", ms_since(t0));
    unsigned count = 0;
    print("count.rc", NVML(nvmlDeviceGetCount_v2)(&count));
    return 0;
}

int lost(pid_t server) {
    print("init.rc", NVML(nvmlInit_v2)());
    nvmlDevice_t h = nullptr;
    NVML(nvmlDeviceGetHandleByIndex_v2)(0, &h);
    nvmlUtilization_t u{};
    print("before.utilization.rc", NVML(nvmlDeviceGetUtilizationRates)(h, &u));
    kill(server, SIGKILL);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(1200));  // the server is gone and the cached status stale
    auto t0 = std::chrono::steady_clock::now();
    print("after.utilization.rc", NVML(nvmlDeviceGetUtilizationRates)(h, &u));
    nvmlMemory_t m{};
    print("after.memory.rc", NVML(nvmlDeviceGetMemoryInfo)(h, &m));
    char name[96];
    print("after.name.rc", NVML(nvmlDeviceGetName)(h, name, sizeof name));
    print("after.ms", ms_since(t0));
    return 0;
}

}  // namespace

// NVLinks as NCCL asks for them (links 0 to 2 of each NVML device): capability, state, far end in both
// layouts, and the state as a field value.
int nvlinks() {
    print("init.rc", NVML(nvmlInit_v2)());
    cuda<CUresult (*)(unsigned)>("cuInit")(0);  // the peer answers come from CUDA's side
    unsigned count = 0;
    NVML(nvmlDeviceGetCount_v2)(&count);
    print("count", count);
    for (unsigned i = 0; i < count; ++i) {
        nvmlDevice_t h = nullptr;
        NVML(nvmlDeviceGetHandleByIndex_v2)(i, &h);
        for (unsigned l = 0; l < 3; ++l) {
            std::string p = "dev" + std::to_string(i) + ".link" + std::to_string(l) + ".";
            unsigned cap = 9;
            print((p + "cap.rc").c_str(),
                  NVML(nvmlDeviceGetNvLinkCapability)(h, l, NVML_NVLINK_CAP_P2P_SUPPORTED, &cap));
            print((p + "cap").c_str(), cap);
            nvmlEnableState_t up = NVML_FEATURE_DISABLED;
            print((p + "state.rc").c_str(), NVML(nvmlDeviceGetNvLinkState)(h, l, &up));
            print((p + "state").c_str(), up);
            nvmlPciInfo_t far{};
            print((p + "far.rc").c_str(), NVML(nvmlDeviceGetNvLinkRemotePciInfo_v2)(h, l, &far));
            print((p + "far").c_str(), far.busId);
            vcuda_nvmlPciInfo_legacy_t old{};
            print((p + "far_legacy.rc").c_str(), NVML(nvmlDeviceGetNvLinkRemotePciInfo)(h, l, &old));
            print((p + "far_legacy").c_str(), old.busId);
            nvmlFieldValue_t f{};
            f.fieldId = NVML_FI_DEV_NVLINK_GET_STATE;
            f.scopeId = l;
            NVML(nvmlDeviceGetFieldValues)(h, 1, &f);
            print((p + "field.rc").c_str(), f.nvmlReturn);
            print((p + "field").c_str(), f.value.uiVal);
        }
    }
    return 0;
}

int main(int argc, char** argv) {
    std::string dir = VCUDA_CLIENT_LIB_DIR;
    // libcuda first, by its full path: the libnvidia-ml.so.1 loaded next finds this same copy.
    cuda_lib = dlopen((dir + "/libcuda.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
    nvml_lib = dlopen((dir + "/libnvidia-ml.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!cuda_lib || !nvml_lib) {
        std::printf("load_error=%s\n", dlerror());
        return 2;
    }
    std::string mode = argc > 1 ? argv[1] : "";
    int rc = 2;
    if (mode == "init")
        rc = init();
    else if (mode == "query")
        rc = query();
    else if (mode == "listing")
        rc = listing();
    else if (mode == "nvlinks")
        rc = nvlinks();
    else if (mode == "lost" && argc > 2)
        rc = lost(static_cast<pid_t>(std::atoi(argv[2])));
    else
        std::fprintf(stderr, "usage: vcuda_nvml_probe init | query | listing | nvlinks | lost SERVER_PID\n");
    std::fflush(stdout);
    return rc;
}
