// What vcuda's libnvidia-ml.so.1 knows: the vGPUs of this process's sessions, as vcuda's libcuda.so.1 lists
// them for NVML (all of them: like the real NVML, it ignores CUDA_VISIBLE_DEVICES). It opens no connection of
// its own: it loads the libcuda.so.1 that sits beside it, initializes it and reads the devices, this
// process's memory use and the physical GPU's live state through vcuda's private export table
// (client/private_table.hpp). Live state is cached for a second, so that a tool's many queries cost one round
// trip. locks: `mu_` guards the init count and the status cache; the device list is written once, under it.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "client/private_table.hpp"
#include "common/gpu_status.hpp"
#include "common/nvml_api.hpp"

namespace vcuda::nvml {

struct vgpu_device {
    unsigned index = 0;     // NVML's index: the position in the list
    int cuda_ordinal = -1;  // the CUDA ordinal in this process; -1: hidden by CUDA_VISIBLE_DEVICES
    std::string name;
    char uuid[41] = {};  // "GPU-..."
    unsigned pci_domain = 0, pci_bus = 0, pci_device = 0;
    unsigned pci_device_id = 0, pci_subsystem_id = 0;
    int cc_major = 0, cc_minor = 0;
    uint64_t total_memory = 0;  // the vGPU's size (the session's quota)
    std::vector<bool>
        can_access_peer;  // by NVML index: cuDeviceCanAccessPeer (false for itself and hidden GPUs)
};

class vgpu {
  public:
    static vgpu& get();

    // nvmlInit*: the first call loads and initializes libcuda; later ones count.
    nvmlReturn_t init();
    nvmlReturn_t shutdown();
    bool initialized();

    const std::vector<vgpu_device>& devices() const { return devices_; }
    int cuda_driver_version() const { return cuda_version_; }

    // The device behind a handle, or null: handles are pointers into devices().
    const vgpu_device* from_handle(nvmlDevice_t h) const;
    static nvmlDevice_t handle_of(const vgpu_device& d) {
        return reinterpret_cast<nvmlDevice_t>(const_cast<vgpu_device*>(&d));
    }

    // This process's memory on `d` and whether it has a context there (from libcuda's mirror).
    nvmlReturn_t usage(const vgpu_device& d, uint64_t& bytes, bool& has_context);
    // The physical GPU's live state (cached for a second; failures too).
    nvmlReturn_t status(const vgpu_device& d, gpu_status& out);

  private:
    vgpu() = default;
    nvmlReturn_t load();

    struct cached_status {
        std::chrono::steady_clock::time_point at{};
        bool valid = false;
        nvmlReturn_t result = NVML_SUCCESS;
        gpu_status status;
    };

    std::mutex mu_;
    int init_count_ = 0;
    bool loaded_ = false;
    nvmlReturn_t load_result_ = NVML_ERROR_UNINITIALIZED;
    const private_table* table_ = nullptr;
    std::vector<vgpu_device> devices_;
    std::vector<cached_status> cache_;
    int cuda_version_ = 0;
};

// CUresult from libcuda -> the nvmlReturn_t a tool expects.
nvmlReturn_t from_cuda(int cuda_result);

}  // namespace vcuda::nvml
