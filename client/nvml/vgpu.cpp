#include "client/nvml/vgpu.hpp"

#include <cuda.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <unordered_set>

#include "client/nvml/unsupported.hpp"
#include "common/log.hpp"

namespace vcuda::nvml {

namespace {

constexpr auto status_lifetime = std::chrono::seconds(1);
constexpr unsigned status_timeout_ms = 2000;  // a query waits no longer for a slow server

// The libcuda.so.1 in this library's own folder (lib/vcuda/), so that both come from one vcuda install.
std::string cuda_library_path() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&unsupported), &info) && info.dli_fname) {
        std::string self = info.dli_fname;
        if (auto slash = self.rfind('/'); slash != std::string::npos)
            return self.substr(0, slash + 1) + "libcuda.so.1";
    }
    return "libcuda.so.1";
}

}  // namespace

int unsupported(const char* name) noexcept {
    static std::mutex mu;
    try {
        static auto* seen = new std::unordered_set<std::string>();  // inside the try: noexcept
        std::lock_guard lock(mu);
        if (seen->insert(name).second) {
            log::init("vcuda-nvml", {}, "warn");  // a tool may call a stub before nvmlInit
            VCUDA_LOG_INFO("{} is not implemented by vcuda: it returns NVML_ERROR_NOT_SUPPORTED", name);
        }
    } catch (...) {
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t from_cuda(int cuda_result) {
    switch (cuda_result) {
        case CUDA_SUCCESS:
            return NVML_SUCCESS;
        case CUDA_ERROR_NOT_SUPPORTED:
            return NVML_ERROR_NOT_SUPPORTED;
        case CUDA_ERROR_TIMEOUT:
            return NVML_ERROR_TIMEOUT;
        case CUDA_ERROR_DEVICE_UNAVAILABLE:
            return NVML_ERROR_GPU_IS_LOST;  // the server connection is gone
        case CUDA_ERROR_INVALID_DEVICE:
            return NVML_ERROR_INVALID_ARGUMENT;
        default:
            return NVML_ERROR_UNKNOWN;
    }
}

vgpu& vgpu::get() {
    static auto* v = new vgpu();  // never destroyed: tools call NVML from exit handlers too
    return *v;
}

nvmlReturn_t vgpu::load() {
    log::init("vcuda-nvml", {}, "warn");
    std::string path = cuda_library_path();
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        VCUDA_LOG_ERROR(
            "nvmlInit: cannot load vcuda's CUDA driver {}: {} (libnvidia-ml.so.1 and libcuda.so.1 of vcuda "
            "must "
            "sit in the same folder)",
            path, dlerror());
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    auto sym = [&](const char* name) { return dlsym(lib, name); };
    auto get_table = reinterpret_cast<CUresult (*)(const void**, const CUuuid*)>(sym("cuGetExportTable"));
    auto cu_init = reinterpret_cast<CUresult (*)(unsigned)>(sym("cuInit"));
    auto driver_version = reinterpret_cast<CUresult (*)(int*)>(sym("cuDriverGetVersion"));
    auto can_access = reinterpret_cast<CUresult (*)(int*, CUdevice, CUdevice)>(sym("cuDeviceCanAccessPeer"));
    CUuuid id;
    std::memcpy(id.bytes, vcuda_private_table_id, 16);
    const void* table = nullptr;
    if (!get_table || get_table(&table, &id) != CUDA_SUCCESS || !table ||
        static_cast<const private_table*>(table)->size < sizeof(private_table)) {
        VCUDA_LOG_ERROR(
            "nvmlInit: {} is not vcuda's CUDA driver (or not the same version as this libnvidia-ml.so.1)",
            path);
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    table_ = static_cast<const private_table*>(table);
    // A cuInit that failed only because CUDA_VISIBLE_DEVICES hid every GPU still lists them for NVML.
    if (CUresult rc = cu_init(0); rc != CUDA_SUCCESS && table_->listed_gpus(0, nullptr, 0) <= 0) {
        // libcuda has said why (no VCUDA_SERVER, server unreachable, no GPU there).
        VCUDA_LOG_ERROR("nvmlInit: vcuda's cuInit failed with error {}: no remote GPU to report",
                        static_cast<int>(rc));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    driver_version(&cuda_version_);
    // Every GPU of the sessions, also those CUDA_VISIBLE_DEVICES hides (as the real NVML lists them).
    int n = table_->listed_gpus(0, nullptr, 0);
    for (int i = 0; i < n; ++i) {
        listed_gpu g{};
        if (table_->listed_gpus(i, &g, sizeof g) != n) break;
        vgpu_device d;
        d.index = static_cast<unsigned>(i);
        d.cuda_ordinal = g.cuda_ordinal;
        d.name = std::string(g.name, ::strnlen(g.name, sizeof g.name));
        format_gpu_uuid(g.uuid, d.uuid);
        d.pci_domain = static_cast<unsigned>(g.pci_domain);
        d.pci_bus = static_cast<unsigned>(g.pci_bus);
        d.pci_device = static_cast<unsigned>(g.pci_device);
        d.pci_device_id = static_cast<unsigned>(g.pci_device_id);
        d.pci_subsystem_id = static_cast<unsigned>(g.pci_subsystem_id);
        d.cc_major = g.cc_major;
        d.cc_minor = g.cc_minor;
        d.total_memory = g.total_memory;
        devices_.push_back(std::move(d));
    }
    // Peer access between GPUs CUDA sees (cuDeviceCanAccessPeer); a hidden GPU has none to tell.
    for (auto& d : devices_) {
        d.can_access_peer.assign(devices_.size(), false);
        for (auto& peer : devices_) {
            int yes = 0;
            if (&peer != &d && d.cuda_ordinal >= 0 && peer.cuda_ordinal >= 0 && can_access &&
                can_access(&yes, static_cast<CUdevice>(d.cuda_ordinal),
                           static_cast<CUdevice>(peer.cuda_ordinal)) == CUDA_SUCCESS)
                d.can_access_peer[peer.index] = yes != 0;
        }
    }
    cache_.resize(devices_.size());
    return NVML_SUCCESS;
}

nvmlReturn_t vgpu::init() {
    std::lock_guard lock(mu_);
    if (!loaded_) {
        // Once per process: libcuda's cuInit answers once too, so a second try could only repeat the first.
        load_result_ = load();
        loaded_ = true;
    }
    if (load_result_ != NVML_SUCCESS) return load_result_;
    ++init_count_;
    return NVML_SUCCESS;
}

nvmlReturn_t vgpu::shutdown() {
    std::lock_guard lock(mu_);
    if (init_count_ == 0) return NVML_ERROR_UNINITIALIZED;
    --init_count_;
    return NVML_SUCCESS;
}

bool vgpu::initialized() {
    std::lock_guard lock(mu_);
    return init_count_ > 0;
}

const vgpu_device* vgpu::from_handle(nvmlDevice_t h) const {
    auto* p = reinterpret_cast<const vgpu_device*>(h);
    for (auto& d : devices_)
        if (&d == p) return p;
    return nullptr;
}

nvmlReturn_t vgpu::usage(const vgpu_device& d, uint64_t& bytes, bool& has_context) {
    unsigned long long b = 0;
    int c = 0;
    if (d.cuda_ordinal < 0) {  // hidden from CUDA in this process: it cannot have used it
        bytes = 0;
        has_context = false;
        return NVML_SUCCESS;
    }
    if (int rc = table_->device_usage(d.cuda_ordinal, &b, &c); rc != CUDA_SUCCESS) return from_cuda(rc);
    bytes = b;
    has_context = c != 0;
    return NVML_SUCCESS;
}

nvmlReturn_t vgpu::status(const vgpu_device& d, gpu_status& out) {
    auto now = std::chrono::steady_clock::now();
    {
        std::lock_guard lock(mu_);
        auto& c = cache_[d.index];
        if (c.valid && now - c.at < status_lifetime) {
            out = c.status;
            return c.result;
        }
    }
    gpu_status st;
    nvmlReturn_t rc =
        from_cuda(table_->listed_gpu_status(static_cast<int>(d.index), &st, sizeof st, status_timeout_ms));
    std::lock_guard lock(mu_);
    auto& c = cache_[d.index];
    c = cached_status{std::chrono::steady_clock::now(), true, rc, st};
    out = st;
    return rc;
}

}  // namespace vcuda::nvml
