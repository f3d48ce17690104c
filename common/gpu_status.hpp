// What the `gpu_status` op returns: the live state of a physical GPU as the server's NVML reports it
// (utilization, temperature, power, clocks, modes, driver version), for vcuda's libnvidia-ml.so.1.
//
// Reply of op gpu_status (args {session device index}): outs[0] = bit mask of the fields the server's NVML
// answered (bit i = gpu_field i), outs[1 + i] = field i (0 when unanswered); blobs = {driver version, NVML
// version, serial, the far ends of the NVLinks `nvlinks` counts (PCI bus ids, one per line)}, each empty when
// unanswered. CUDA_ERROR_NOT_SUPPORTED when the server has no NVML or NVML
// does not know the GPU. Fields only grow: a new one goes before `count`, never in between.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vcuda {

enum class gpu_field : uint32_t {
    utilization_gpu,       // percent
    utilization_memory,    // percent
    temperature,           // degrees C
    power_usage,           // milliwatts
    power_limit,           // milliwatts (power management limit)
    power_default_limit,   // milliwatts
    enforced_power_limit,  // milliwatts
    clock_graphics,        // MHz, current ...
    clock_sm,
    clock_memory,
    clock_video,
    max_clock_graphics,  // ... and maximum
    max_clock_sm,
    max_clock_memory,
    max_clock_video,
    compute_mode,  // nvmlComputeMode_t
    mig_current,   // NVML_DEVICE_MIG_DISABLE (0) / ENABLE (1)
    mig_pending,
    fan_speed,          // percent
    performance_state,  // nvmlPstates_t
    persistence_mode,   // nvmlEnableState_t
    display_mode,
    display_active,
    bar1_total,  // bytes
    bar1_free,
    bar1_used,
    pci_base_class,  // PCI class code
    pci_sub_class,
    ecc_current,  // nvmlEnableState_t
    ecc_pending,
    virtualization_mode,  // nvmlGpuVirtualizationMode_t
    brand,                // nvmlBrandType_t
    architecture,         // nvmlDeviceArchitecture_t
    max_mig_devices,
    inforom_valid,     // 1: nvmlDeviceValidateInforom succeeded, 0: the infoROM is corrupted
    pcie_gen_current,  // PCIe link generation and width, now and at most (device and system), ...
    pcie_width_current,
    pcie_gen_max,
    pcie_width_max,
    pcie_gen_gpu_max,  // ... the most the GPU itself supports
    pcie_speed,        // MB/s per lane (nvmlDeviceGetPcieSpeed)
    nvlinks,  // NVLinks up and able to carry P2P traffic; their far ends in gpu_status::nvlink_remote
    count
};
inline constexpr size_t gpu_field_count = static_cast<size_t>(gpu_field::count);
static_assert(gpu_field_count <= 64, "the answered mask is one 64-bit word");

// The decoded reply. Plain data: it crosses from libcuda.so.1 to libnvidia-ml.so.1 through vcuda's private
// export table (client/private_table.hpp), which checks its size.
struct gpu_status {
    uint64_t answered = 0;
    uint64_t values[gpu_field_count] = {};
    char driver_version[80] = {};
    char nvml_version[80] = {};
    char serial[32] = {};
    char nvlink_remote[18][32] =
        {};  // the PCI bus id ("%08X:%02X:%02X.0") at the far end of each counted link

    bool has(gpu_field f) const { return (answered >> static_cast<uint32_t>(f)) & 1; }
    uint64_t get(gpu_field f) const { return values[static_cast<uint32_t>(f)]; }
    void set(gpu_field f, uint64_t v) {
        values[static_cast<uint32_t>(f)] = v;
        answered |= uint64_t{1} << static_cast<uint32_t>(f);
    }
};

}  // namespace vcuda
