#include "server/driver.hpp"

#include <dlfcn.h>

#include "common/log.hpp"

namespace vcuda::server {

bool driver::load(const std::string& path, std::string& why) {
    path_ = path.empty() ? "libcuda.so.1" : path;
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
        why = "cannot load the CUDA driver '" + path_ + "': " + dlerror() +
              " (is the NVIDIA driver installed? point --driver at libcuda.so.1)";
        return false;
    }
    int found = table_.load([&](const char* name) { return dlsym(handle_, name); });
    VCUDA_LOG_INFO("driver {}: {} of {} entry points found", path_, found, driver_table::size);
    if (!table_.cuInit || !table_.cuDeviceGetCount || !table_.cuDeviceGet) {
        why = path_ + " is not a CUDA driver (cuInit/cuDeviceGet missing)";
        return false;
    }
    if (CUresult rc = table_.cuInit(0); rc != CUDA_SUCCESS) {
        why = "cuInit failed with error " + std::to_string(rc) +
              " (no usable GPU, or the driver is not loaded)";
        return false;
    }
    if (table_.cuDriverGetVersion) table_.cuDriverGetVersion(&version_);
    int n = 0;
    table_.cuDeviceGetCount(&n);
    for (int i = 0; i < n; ++i) {
        gpu_info g;
        table_.cuDeviceGet(&g.device, i);
        char name[256] = {};
        if (table_.cuDeviceGetName) table_.cuDeviceGetName(name, sizeof name, g.device);
        g.name = name;
        if (table_.cuDeviceGetUuid_v2) table_.cuDeviceGetUuid_v2(&g.uuid, g.device);
        if (table_.cuDeviceTotalMem_v2) table_.cuDeviceTotalMem_v2(&g.total_memory, g.device);
        g.attributes.assign(CU_DEVICE_ATTRIBUTE_MAX, 0);
        for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
            int v = 0;
            if (table_.cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), g.device) == CUDA_SUCCESS)
                g.attributes[a] = v;
        }
        VCUDA_LOG_INFO("GPU {}: {} ({} MiB)", i, g.name, g.total_memory >> 20);
        gpus_.push_back(std::move(g));
    }
    return true;
}

}  // namespace vcuda::server
