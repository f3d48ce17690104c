// The NVML functions vcuda answers, for the vGPUs this process holds: the same devices, order, UUIDs and PCI
// ids as vcuda's libcuda.so.1; memory total = the vGPU's size, used = what this process holds; live values
// (utilization, temperature, power, clocks, modes, driver version) from the server's NVML. Every other
// exported symbol is a generated stub (tools/gen_nvml_exports.py) answering NVML_ERROR_NOT_SUPPORTED.
// A function counts as implemented when it is defined here as `extern "C" ... nvmlName(` at the start of a
// line: the generator reads this file.
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <type_traits>

#include "client/nvml/unsupported.hpp"
#include "client/nvml/vgpu.hpp"

using vcuda::gpu_field;
using vcuda::gpu_status;
using vcuda::nvml::vgpu;
using vcuda::nvml::vgpu_device;

namespace {

// The device behind `h`, for a call made between nvmlInit and nvmlShutdown.
nvmlReturn_t device_of(nvmlDevice_t h, const vgpu_device*& d) {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    d = vgpu::get().from_handle(h);
    return d ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t copy_string(const std::string& s, char* out, unsigned length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (s.size() + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    std::memcpy(out, s.c_str(), s.size() + 1);
    return NVML_SUCCESS;
}

// One live value of the physical GPU: NOT_SUPPORTED when the server's NVML did not give it.
template <class T>
nvmlReturn_t live_value(nvmlDevice_t h, gpu_field f, T* out) {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(h, d); rc != NVML_SUCCESS) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_status st;
    if (nvmlReturn_t rc = vgpu::get().status(*d, st); rc != NVML_SUCCESS) return rc;
    if (!st.has(f)) return NVML_ERROR_NOT_SUPPORTED;
    *out = static_cast<T>(st.get(f));
    return NVML_SUCCESS;
}

gpu_field clock_field(gpu_field first, nvmlClockType_t type) {
    return static_cast<gpu_field>(static_cast<unsigned>(first) + static_cast<unsigned>(type));
}

// A system-wide string from the server's NVML (asked of the first GPU: one server serves them all).
template <size_t N>
nvmlReturn_t system_string(char (gpu_status::*field)[N], char* out, unsigned length) {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    auto& devices = vgpu::get().devices();
    if (devices.empty()) return NVML_ERROR_NOT_SUPPORTED;
    gpu_status st;
    if (nvmlReturn_t rc = vgpu::get().status(devices.front(), st); rc != NVML_SUCCESS) return rc;
    const char* s = st.*field;
    if (!*s) return NVML_ERROR_NOT_SUPPORTED;
    return copy_string(s, out, length);
}

nvmlReturn_t handle_by_index(unsigned index, nvmlDevice_t* device) {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    auto& devices = vgpu::get().devices();
    if (!device || index >= devices.size()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = vgpu::handle_of(devices[index]);
    return NVML_SUCCESS;
}

nvmlReturn_t device_count(unsigned* count) {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = static_cast<unsigned>(vgpu::get().devices().size());
    return NVML_SUCCESS;
}

// "domain:bus:device.function" (domain optional, any case, any width) as NVML accepts it.
nvmlReturn_t handle_by_pci_bus_id(const char* bus_id, nvmlDevice_t* device) {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    int n = std::sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    if (n < 3) {
        domain = 0;
        if (std::sscanf(bus_id, "%x:%x.%x", &bus, &dev, &fn) < 2) return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (auto& d : vgpu::get().devices())
        if (d.pci_domain == domain && d.pci_bus == bus && d.pci_device == dev) {
            *device = vgpu::handle_of(d);
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

// The first 36 bytes, common to every nvmlPciInfo layout.
template <class Pci>
void fill_pci_common(const vgpu_device& d, Pci* pci) {
    pci->domain = d.pci_domain;
    pci->bus = d.pci_bus;
    pci->device = d.pci_device;
    pci->pciDeviceId = d.pci_device_id;
    pci->pciSubSystemId = d.pci_subsystem_id;
}

nvmlReturn_t pci_info_legacy(nvmlDevice_t h, vcuda_nvmlPciInfo_legacy_t* pci) {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(h, d); rc != NVML_SUCCESS) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    std::snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, d->pci_domain, d->pci_bus,
                  d->pci_device);
    fill_pci_common(*d, pci);
    return NVML_SUCCESS;
}

// This process, on devices where it holds memory or a context (compute); nobody else is visible (graphics,
// MPS: other processes of the VM have sessions of their own).
template <class Info>
nvmlReturn_t running_processes(nvmlDevice_t h, unsigned* count, Info* infos, bool compute) {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(h, d); rc != NVML_SUCCESS) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t bytes = 0;
    bool has_context = false;
    if (compute)
        if (nvmlReturn_t rc = vgpu::get().usage(*d, bytes, has_context); rc != NVML_SUCCESS) return rc;
    unsigned n = (compute && (has_context || bytes > 0)) ? 1 : 0;
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    if (n == 0) return NVML_SUCCESS;
    if (!infos) return NVML_ERROR_INVALID_ARGUMENT;
    Info info{};
    info.pid = static_cast<unsigned>(getpid());
    info.usedGpuMemory = bytes;
    if constexpr (std::is_same_v<Info, nvmlProcessInfo_v2_t>) {
        info.gpuInstanceId = 0xFFFFFFFFu;
        info.computeInstanceId = 0xFFFFFFFFu;
    }
    infos[0] = info;
    return NVML_SUCCESS;
}

nvmlReturn_t memory(nvmlDevice_t h, uint64_t& total, uint64_t& used) {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(h, d); rc != NVML_SUCCESS) return rc;
    bool has_context;
    if (nvmlReturn_t rc = vgpu::get().usage(*d, used, has_context); rc != NVML_SUCCESS) return rc;
    total = d->total_memory;
    used = std::min(used, total);
    return NVML_SUCCESS;
}

}  // namespace

// ---------------------------------------------------------------- init, errors, system

extern "C" const char* nvmlErrorString(nvmlReturn_t result) noexcept {
    switch (result) {
        case NVML_SUCCESS:
            return "Success";
        case NVML_ERROR_UNINITIALIZED:
            return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT:
            return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED:
            return "Not Supported";
        case NVML_ERROR_NO_PERMISSION:
            return "Insufficient Permissions";
        case NVML_ERROR_ALREADY_INITIALIZED:
            return "Already Initialized";
        case NVML_ERROR_NOT_FOUND:
            return "Not Found";
        case NVML_ERROR_INSUFFICIENT_SIZE:
            return "Insufficient Size";
        case NVML_ERROR_INSUFFICIENT_POWER:
            return "Insufficient External Power";
        case NVML_ERROR_DRIVER_NOT_LOADED:
            return "Driver Not Loaded";
        case NVML_ERROR_TIMEOUT:
            return "Timeout";
        case NVML_ERROR_IRQ_ISSUE:
            return "Interrupt Request Issue";
        case NVML_ERROR_LIBRARY_NOT_FOUND:
            return "NVML Shared Library Not Found";
        case NVML_ERROR_FUNCTION_NOT_FOUND:
            return "Function Not Found";
        case NVML_ERROR_CORRUPTED_INFOROM:
            return "Corrupted infoROM";
        case NVML_ERROR_GPU_IS_LOST:
            return "GPU is lost";
        case NVML_ERROR_RESET_REQUIRED:
            return "GPU requires restart";
        case NVML_ERROR_OPERATING_SYSTEM:
            return "The operating system has blocked the request.";
        case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            return "Driver/library version mismatch";
        case NVML_ERROR_IN_USE:
            return "In use by another client";
        case NVML_ERROR_MEMORY:
            return "Insufficient Memory";
        case NVML_ERROR_NO_DATA:
            return "No data";
        case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
            return "The requested vgpu operation is not available on target device, because ECC is enabled";
        case NVML_ERROR_INSUFFICIENT_RESOURCES:
            return "Ran out of critical resources, other than memory";
        case NVML_ERROR_FREQ_NOT_SUPPORTED:
            return "The requested frequency is not supported";
        case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
            return "The provided version is invalid/unsupported";
        case NVML_ERROR_DEPRECATED:
            return "The requested functionality has been deprecated";
        case NVML_ERROR_NOT_READY:
            return "The system is not ready for the request";
        case NVML_ERROR_GPU_NOT_FOUND:
            return "The GPU was not found";
        case NVML_ERROR_INVALID_STATE:
            return "Resource not in correct state to perform requested operation";
        case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED:
            return "Reset not supported for given device/parameters";
        default:
            return "Unknown Error";
    }
}

// NVML_INIT_FLAG_NO_GPUS / NO_ATTACH change nothing here: no GPU is ever attached locally, and vcuda's cuInit
// refuses a server without GPUs already.
extern "C" nvmlReturn_t nvmlInitWithFlags(unsigned int) noexcept { return vgpu::get().init(); }
extern "C" nvmlReturn_t nvmlInit_v2(void) noexcept { return vgpu::get().init(); }
extern "C" nvmlReturn_t nvmlInit(void) noexcept { return vgpu::get().init(); }
extern "C" nvmlReturn_t nvmlShutdown(void) noexcept { return vgpu::get().shutdown(); }

extern "C" nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) noexcept {
    return system_string(&gpu_status::driver_version, version, length);
}

extern "C" nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) noexcept {
    return system_string(&gpu_status::nvml_version, version, length);
}

// The CUDA version vcuda's libcuda.so.1 reports (cuDriverGetVersion): what this process's CUDA sees.
extern "C" nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* cudaDriverVersion) noexcept {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = vgpu::get().cuda_driver_version();
    return NVML_SUCCESS;
}
extern "C" nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* cudaDriverVersion) noexcept {
    return nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion);
}

// A local process's name (its command's path, as NVML gives it); only this process uses the vGPU.
extern "C" nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char* name, unsigned int length) noexcept {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!name || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
    std::string base = "/proc/" + std::to_string(pid);
    std::ifstream cmdline(base + "/cmdline");
    if (!cmdline) return NVML_ERROR_NOT_FOUND;
    std::string text;
    std::getline(cmdline, text, '\0');
    if (text.empty()) {
        std::ifstream comm(base + "/comm");
        std::getline(comm, text);
    }
    if (text.size() + 1 > length) text.resize(length - 1);  // NVML truncates names that do not fit
    return copy_string(text, name, length);
}

// nvidia-smi refuses to run ("Mismatch in versions between nvidia-smi and NVML") unless NVML hands it its
// private table c4fe3e6c-c98f-6c4e-a327-ee696e12f7c4, an undocumented interface of about 270 entry points.
// vcuda answers with a table that holds no entry point: nvidia-smi checks the table's size word before every
// use and shows "N/A" for what only the table could tell (observed with driver 580's nvidia-smi). Any other
// table is refused.
extern "C" nvmlReturn_t nvmlInternalGetExportTable(const void** table,
                                                   const unsigned char* table_id) noexcept {
    static constexpr unsigned char smi_table_id[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
                                                       0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
    static const size_t empty_table[1] = {sizeof empty_table};
    if (!table || !table_id) return NVML_ERROR_INVALID_ARGUMENT;
    if (std::memcmp(table_id, smi_table_id, 16) != 0)
        return static_cast<nvmlReturn_t>(
            vcuda::nvml::unsupported("nvmlInternalGetExportTable for a table other than nvidia-smi's"));
    *table = empty_table;
    return NVML_SUCCESS;
}

// ---------------------------------------------------------------- enumeration

extern "C" nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) noexcept {
    return device_count(deviceCount);
}
extern "C" nvmlReturn_t nvmlDeviceGetCount(unsigned int* deviceCount) noexcept {
    return device_count(deviceCount);
}

extern "C" nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) noexcept {
    return handle_by_index(index, device);
}
extern "C" nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) noexcept {
    return handle_by_index(index, device);
}

extern "C" nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) noexcept {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (auto& d : vgpu::get().devices())
        if (strcasecmp(d.uuid, uuid) == 0) {
            *device = vgpu::handle_of(d);
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

extern "C" nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId,
                                                         nvmlDevice_t* device) noexcept {
    return handle_by_pci_bus_id(pciBusId, device);
}
extern "C" nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* pciBusId, nvmlDevice_t* device) noexcept {
    return handle_by_pci_bus_id(pciBusId, device);
}

// ---------------------------------------------------------------- identity (from libcuda's device list)

extern "C" nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    return copy_string(d->name, name, length);
}

extern "C" nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    return copy_string(d->uuid, uuid, length);
}

extern "C" nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char* serial, unsigned int length) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (!serial) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_status st;
    if (nvmlReturn_t rc = vgpu::get().status(*d, st); rc != NVML_SUCCESS) return rc;
    if (!st.serial[0]) return NVML_ERROR_NOT_SUPPORTED;
    return copy_string(st.serial, serial, length);
}

extern "C" nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

// There are no /dev/nvidiaN nodes on a vcuda client: the vGPU's index stands in for the minor number.
extern "C" nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minorNumber) noexcept {
    return nvmlDeviceGetIndex(device, minorNumber);
}

extern "C" nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, d->pci_domain,
                  d->pci_bus, d->pci_device);
    std::snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, d->pci_domain, d->pci_bus,
                  d->pci_device);
    fill_pci_common(*d, pci);
    return NVML_SUCCESS;
}
extern "C" nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device,
                                                vcuda_nvmlPciInfo_legacy_t* pci) noexcept {
    return pci_info_legacy(device, pci);
}
extern "C" nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, vcuda_nvmlPciInfo_legacy_t* pci) noexcept {
    return pci_info_legacy(device, pci);
}

// The class codes come from the server's NVML; without it they read 0.
extern "C" nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t* pci) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (pci->version != nvmlPciInfoExt_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    gpu_status st;
    nvmlReturn_t rc = vgpu::get().status(*d, st);
    if (rc != NVML_SUCCESS && rc != NVML_ERROR_NOT_SUPPORTED) return rc;
    std::snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, d->pci_domain, d->pci_bus,
                  d->pci_device);
    fill_pci_common(*d, pci);
    pci->baseClass =
        st.has(gpu_field::pci_base_class) ? static_cast<unsigned>(st.get(gpu_field::pci_base_class)) : 0;
    pci->subClass =
        st.has(gpu_field::pci_sub_class) ? static_cast<unsigned>(st.get(gpu_field::pci_sub_class)) : 0;
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major,
                                                           int* minor) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = d->cc_major;
    *minor = d->cc_minor;
    return NVML_SUCCESS;
}

// ---------------------------------------------------------------- memory and processes (this process's view)

extern "C" nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* mem) noexcept {
    uint64_t total = 0, used = 0;
    if (nvmlReturn_t rc = memory(device, total, used); rc != NVML_SUCCESS) return rc;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    *mem = nvmlMemory_t{total, total - used, used};
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* mem) noexcept {
    uint64_t total = 0, used = 0;
    if (nvmlReturn_t rc = memory(device, total, used); rc != NVML_SUCCESS) return rc;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mem->total = total;
    mem->reserved = 0;
    mem->free = total - used;
    mem->used = used;
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* infoCount,
                                                                nvmlProcessInfo_t* infos) noexcept {
    return running_processes(device, infoCount, infos, true);
}
extern "C" nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int* infoCount,
                                                                nvmlProcessInfo_v2_t* infos) noexcept {
    return running_processes(device, infoCount, infos, true);
}
extern "C" nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int* infoCount,
                                                             nvmlProcessInfo_v1_t* infos) noexcept {
    return running_processes(device, infoCount, infos, true);
}
extern "C" nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int* infoCount,
                                                                 nvmlProcessInfo_t* infos) noexcept {
    return running_processes(device, infoCount, infos, false);
}
extern "C" nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int* infoCount,
                                                                 nvmlProcessInfo_v2_t* infos) noexcept {
    return running_processes(device, infoCount, infos, false);
}
extern "C" nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int* infoCount,
                                                              nvmlProcessInfo_v1_t* infos) noexcept {
    return running_processes(device, infoCount, infos, false);
}
extern "C" nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                   unsigned int* infoCount,
                                                                   nvmlProcessInfo_t* infos) noexcept {
    return running_processes(device, infoCount, infos, false);
}
extern "C" nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                   unsigned int* infoCount,
                                                                   nvmlProcessInfo_v2_t* infos) noexcept {
    return running_processes(device, infoCount, infos, false);
}
extern "C" nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int* infoCount,
                                                                nvmlProcessInfo_v1_t* infos) noexcept {
    return running_processes(device, infoCount, infos, false);
}

// ---------------------------------------------------------------- live state of the physical GPU (server's
// NVML)

extern "C" nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                      nvmlUtilization_t* utilization) noexcept {
    nvmlUtilization_t u{};
    if (nvmlReturn_t rc = live_value(device, gpu_field::utilization_gpu, &u.gpu); rc != NVML_SUCCESS)
        return rc;
    if (nvmlReturn_t rc = live_value(device, gpu_field::utilization_memory, &u.memory); rc != NVML_SUCCESS)
        return rc;
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    *utilization = u;
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                                 unsigned int* temp) noexcept {
    if (sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    return live_value(device, gpu_field::temperature, temp);
}

extern "C" nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device,
                                                  nvmlTemperature_t* temperature) noexcept {
    if (!temperature) return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    return live_value(device, gpu_field::temperature, &temperature->temperature);
}

extern "C" nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) noexcept {
    return live_value(device, gpu_field::power_usage, power);
}
extern "C" nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int* limit) noexcept {
    return live_value(device, gpu_field::power_limit, limit);
}
extern "C" nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                                 unsigned int* defaultLimit) noexcept {
    return live_value(device, gpu_field::power_default_limit, defaultLimit);
}
extern "C" nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int* limit) noexcept {
    return live_value(device, gpu_field::enforced_power_limit, limit);
}

// The physical GPU's PCIe link (XLA reads it to estimate host transfer bandwidth).
extern "C" nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int* gen) noexcept {
    return live_value(device, gpu_field::pcie_gen_current, gen);
}
extern "C" nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int* width) noexcept {
    return live_value(device, gpu_field::pcie_width_current, width);
}
extern "C" nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int* gen) noexcept {
    return live_value(device, gpu_field::pcie_gen_max, gen);
}
extern "C" nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int* width) noexcept {
    return live_value(device, gpu_field::pcie_width_max, width);
}
extern "C" nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device,
                                                              unsigned int* gen) noexcept {
    return live_value(device, gpu_field::pcie_gen_gpu_max, gen);
}
extern "C" nvmlReturn_t nvmlDeviceGetPcieSpeed(nvmlDevice_t device, unsigned int* speed) noexcept {
    return live_value(device, gpu_field::pcie_speed, speed);
}

extern "C" nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                               unsigned int* clock) noexcept {
    if (static_cast<unsigned>(type) >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    return live_value(device, clock_field(gpu_field::clock_graphics, type), clock);
}
extern "C" nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                  unsigned int* clock) noexcept {
    if (static_cast<unsigned>(type) >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    return live_value(device, clock_field(gpu_field::max_clock_graphics, type), clock);
}

extern "C" nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t* mode) noexcept {
    return live_value(device, gpu_field::compute_mode, mode);
}

extern "C" nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int* currentMode,
                                             unsigned int* pendingMode) noexcept {
    if (!currentMode || !pendingMode) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned cur = 0, pending = 0;
    if (nvmlReturn_t rc = live_value(device, gpu_field::mig_current, &cur); rc != NVML_SUCCESS) return rc;
    if (nvmlReturn_t rc = live_value(device, gpu_field::mig_pending, &pending); rc != NVML_SUCCESS) return rc;
    *currentMode = cur;
    *pendingMode = pending;
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t* mode) noexcept {
    return live_value(device, gpu_field::persistence_mode, mode);
}
extern "C" nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t* display) noexcept {
    return live_value(device, gpu_field::display_mode, display);
}
extern "C" nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device,
                                                   nvmlEnableState_t* isActive) noexcept {
    return live_value(device, gpu_field::display_active, isActive);
}
extern "C" nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int* speed) noexcept {
    return live_value(device, gpu_field::fan_speed, speed);
}
extern "C" nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t* pState) noexcept {
    return live_value(device, gpu_field::performance_state, pState);
}
extern "C" nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t* pState) noexcept {
    return live_value(device, gpu_field::performance_state, pState);
}

extern "C" nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t* current,
                                             nvmlEnableState_t* pending) noexcept {
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEnableState_t cur{}, pend{};
    if (nvmlReturn_t rc = live_value(device, gpu_field::ecc_current, &cur); rc != NVML_SUCCESS) return rc;
    if (nvmlReturn_t rc = live_value(device, gpu_field::ecc_pending, &pend); rc != NVML_SUCCESS) return rc;
    *current = cur;
    *pending = pend;
    return NVML_SUCCESS;
}
extern "C" nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device,
                                                        unsigned int* pVirtualMode) noexcept {
    return live_value(device, gpu_field::virtualization_mode, pVirtualMode);
}
extern "C" nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int* type) noexcept {
    return live_value(device, gpu_field::brand, type);
}
extern "C" nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int* arch) noexcept {
    return live_value(device, gpu_field::architecture, arch);
}
extern "C" nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int* count) noexcept {
    return live_value(device, gpu_field::max_mig_devices, count);
}
extern "C" nvmlReturn_t nvmlDeviceValidateInforom(nvmlDevice_t device) noexcept {
    unsigned valid = 0;
    if (nvmlReturn_t rc = live_value(device, gpu_field::inforom_valid, &valid); rc != NVML_SUCCESS) return rc;
    return valid ? NVML_SUCCESS : NVML_ERROR_CORRUPTED_INFOROM;
}

// The handles vcuda gives are whole (v)GPUs, never MIG instances.
extern "C" nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int* isMigDevice) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (!isMigDevice) return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = 0;
    return NVML_SUCCESS;
}

// Peer-to-peer status between two vGPUs, as the CUDA side sees it (NCCL asks, a device with itself too).
// A GPU with itself answers as the real NVML does on the H100 (driver 580): NOT_SUPPORTED for reads, writes,
// NVLink, atomics and PCI, OK for loopback (index 5) and index 6.
extern "C" nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                               nvmlGpuP2PCapsIndex_t p2pIndex,
                                               nvmlGpuP2PStatus_t* p2pStatus) noexcept {
    const vgpu_device *a, *b;
    if (nvmlReturn_t rc = device_of(device1, a); rc != NVML_SUCCESS) return rc;
    if (nvmlReturn_t rc = device_of(device2, b); rc != NVML_SUCCESS) return rc;
    if (!p2pStatus || p2pIndex > NVML_P2P_CAPS_INDEX_UNKNOWN) return NVML_ERROR_INVALID_ARGUMENT;
    bool ok;
    if (a == b) {
        ok = p2pIndex >= NVML_P2P_CAPS_INDEX_LOOPBACK;
    } else {
        // Reads, writes, atomics and PCI follow from cuDeviceCanAccessPeer; NVLink is not known here.
        const bool peer = b->index < a->can_access_peer.size() && a->can_access_peer[b->index];
        ok = peer && (p2pIndex == NVML_P2P_CAPS_INDEX_READ || p2pIndex == NVML_P2P_CAPS_INDEX_WRITE ||
                      p2pIndex == NVML_P2P_CAPS_INDEX_ATOMICS || p2pIndex == NVML_P2P_CAPS_INDEX_PROP);
    }
    *p2pStatus = ok ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

// ---------------------------------------------------------------- NVLink
// The server's NVLinks that are up and carry P2P traffic (NCCL builds its topology from them and picks its
// P2P transport over NVLink, which through vcuda is cuMem IPC between sessions of one server: it works over
// TCP too, where host memory cannot be shared). Reported only where CUDA can use them: when this process sees
// at least two vGPUs and each is a peer of every other (one server's GPUs). Devices of two servers must not
// look linked: P2P between them cannot work. A vGPU alone reports none either: the process's peers may be on
// another server.
namespace {

bool nvlinks_usable() {
    std::vector<const vgpu_device*> seen;
    for (auto& d : vgpu::get().devices())
        if (d.cuda_ordinal >= 0) seen.push_back(&d);
    if (seen.size() < 2) return false;
    for (auto* a : seen)
        for (auto* b : seen)
            if (a != b && !(b->index < a->can_access_peer.size() && a->can_access_peer[b->index]))
                return false;
    return true;
}

// The far end of `link` of the device, when that link is reported.
nvmlReturn_t nvlink_far_end(nvmlDevice_t device, unsigned link, std::string& bus_id) {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (!nvlinks_usable()) return NVML_ERROR_NOT_SUPPORTED;
    gpu_status st;
    if (nvmlReturn_t rc = vgpu::get().status(*d, st); rc != NVML_SUCCESS) return rc;
    if (!st.has(gpu_field::nvlinks) || link >= st.get(gpu_field::nvlinks)) return NVML_ERROR_NOT_SUPPORTED;
    bus_id = st.nvlink_remote[link];
    return NVML_SUCCESS;
}

template <class Pci>
void fill_far_end(const std::string& bus_id, Pci& pci) {
    unsigned domain = 0, bus = 0, dev = 0;
    std::sscanf(bus_id.c_str(), "%x:%x:%x", &domain, &bus, &dev);
    pci.domain = domain;
    pci.bus = bus;
    pci.device = dev;
}

}  // namespace

extern "C" nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                      nvmlNvLinkCapability_t capability,
                                                      unsigned int* capResult) noexcept {
    if (!capResult) return NVML_ERROR_INVALID_ARGUMENT;
    std::string far;
    if (nvmlReturn_t rc = nvlink_far_end(device, link, far); rc != NVML_SUCCESS) return rc;
    // Counted links carry P2P traffic (what the server's NVML said); the rest is not known here.
    *capResult = capability == NVML_NVLINK_CAP_P2P_SUPPORTED || capability == NVML_NVLINK_CAP_VALID;
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                 nvmlEnableState_t* isActive) noexcept {
    if (!isActive) return NVML_ERROR_INVALID_ARGUMENT;
    std::string far;
    if (nvmlReturn_t rc = nvlink_far_end(device, link, far); rc != NVML_SUCCESS) return rc;
    *isActive = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                            nvmlPciInfo_t* pci) noexcept {
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    std::string far;
    if (nvmlReturn_t rc = nvlink_far_end(device, link, far); rc != NVML_SUCCESS) return rc;
    *pci = {};
    std::snprintf(pci->busId, sizeof pci->busId, "%s", far.c_str());
    std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", far.c_str());
    fill_far_end(far, *pci);
    return NVML_SUCCESS;
}

// The first NVML's layout (NCCL asks with it): the bus id in 16 bytes, cut short as that layout cuts it.
extern "C" nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                         vcuda_nvmlPciInfo_legacy_t* pci) noexcept {
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    std::string far;
    if (nvmlReturn_t rc = nvlink_far_end(device, link, far); rc != NVML_SUCCESS) return rc;
    std::snprintf(pci->busId, sizeof pci->busId, "%s", far.c_str());
    fill_far_end(far, *pci);
    pci->pciDeviceId = 0;
    pci->pciSubSystemId = 0;
    return NVML_SUCCESS;
}

// Field values (NVML_FI_*) are not forwarded, but for NVLink states (NCCL asks them on Hopper): each other
// requested field answers NOT_SUPPORTED in its own return code, as NVML reports fields a GPU lacks, so that
// tools show "N/A" rather than read an unset value.
extern "C" nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                                 nvmlFieldValue_t* values) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (valuesCount < 0 || (valuesCount > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
    for (int i = 0; i < valuesCount; ++i) {
        values[i].timestamp = now;
        values[i].latencyUsec = 0;
        values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        values[i].value.ullVal = 0;
        std::string far;
        if (values[i].fieldId == NVML_FI_DEV_NVLINK_GET_STATE &&
            nvlink_far_end(device, values[i].scopeId, far) == NVML_SUCCESS) {
            values[i].nvmlReturn = NVML_SUCCESS;
            values[i].valueType = 1;  // NVML_VALUE_TYPE_UNSIGNED_INT
            values[i].value.uiVal = NVML_FEATURE_ENABLED;
        }
    }
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device,
                                                    nvmlBAR1Memory_t* bar1Memory) noexcept {
    if (!bar1Memory) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlBAR1Memory_t b{};
    if (nvmlReturn_t rc = live_value(device, gpu_field::bar1_total, &b.bar1Total); rc != NVML_SUCCESS)
        return rc;
    if (nvmlReturn_t rc = live_value(device, gpu_field::bar1_free, &b.bar1Free); rc != NVML_SUCCESS)
        return rc;
    if (nvmlReturn_t rc = live_value(device, gpu_field::bar1_used, &b.bar1Used); rc != NVML_SUCCESS)
        return rc;
    *bar1Memory = b;
    return NVML_SUCCESS;
}

// ---------------------------------------------------------------- events

// Event sets exist (nvidia-smi creates one and stops with "Internal NVML error" otherwise), but no device
// supports an event type: registering any answers NOT_SUPPORTED, as NVML does for types a GPU lacks, and a
// wait times out.
struct nvmlEventSet_st {
    std::mutex mu;
    std::condition_variable freed;
    bool closing = false;
};

namespace {
std::mutex event_sets_mu;
std::set<nvmlEventSet_t> event_sets;

bool live(nvmlEventSet_t set) {
    std::lock_guard lock(event_sets_mu);
    return event_sets.count(set) != 0;
}

nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t* data, unsigned timeout_ms) {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!data || !live(set)) return NVML_ERROR_INVALID_ARGUMENT;
    std::unique_lock lock(set->mu);
    set->freed.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return set->closing; });
    return NVML_ERROR_TIMEOUT;
}
}  // namespace

extern "C" nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) noexcept {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    auto* s = new (std::nothrow) nvmlEventSet_st();
    if (!s) return NVML_ERROR_MEMORY;
    std::lock_guard lock(event_sets_mu);
    event_sets.insert(s);
    *set = s;
    return NVML_SUCCESS;
}

// A set being waited on is left allocated (its waiters wake with TIMEOUT); NVML forbids freeing it then
// anyway.
extern "C" nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) noexcept {
    if (!vgpu::get().initialized()) return NVML_ERROR_UNINITIALIZED;
    {
        std::lock_guard lock(event_sets_mu);
        if (!event_sets.erase(set)) return NVML_ERROR_INVALID_ARGUMENT;
    }
    std::lock_guard lock(set->mu);
    set->closing = true;
    set->freed.notify_all();
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data,
                                            unsigned int timeoutms) noexcept {
    return event_wait(set, data, timeoutms);
}
extern "C" nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t* data,
                                         unsigned int timeoutms) noexcept {
    return event_wait(set, data, timeoutms);
}

extern "C" nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                         unsigned long long* eventTypes) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (!eventTypes) return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = 0;
    return NVML_SUCCESS;
}

extern "C" nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                 nvmlEventSet_t set) noexcept {
    const vgpu_device* d;
    if (nvmlReturn_t rc = device_of(device, d); rc != NVML_SUCCESS) return rc;
    if (!live(set)) return NVML_ERROR_INVALID_ARGUMENT;
    return eventTypes == 0 ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}
