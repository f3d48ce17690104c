// Op gpu_status: the live state of one of the session's GPUs, read from the host's NVML
// (libnvidia-ml.so.1, loaded once with dlopen; optional). Layout of the reply: common/gpu_status.hpp.
// runs on: any lane thread (NVML is thread-safe; loading happens once).
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>

#include "common/gpu_status.hpp"
#include "common/log.hpp"
#include "common/nvml_api.hpp"
#include "server/call_context.hpp"
#include "server/server.hpp"

namespace vcuda::server {
namespace {

// The host's NVML, reached only through the entry points below.
class host_nvml {
  public:
    static host_nvml& get() {
        static host_nvml n;  // loads on first use
        return n;
    }
    bool usable() const { return usable_; }
    const std::string& why() const { return why_; }

    // The NVML device of the CUDA device with this UUID: a whole GPU ("GPU-...") or the parent of a MIG
    // instance ("MIG-..."). Null when NVML knows neither.
    nvmlDevice_t find(const CUuuid& uuid) const {
        char text[41];
        nvml::format_gpu_uuid(uuid.bytes, text);
        nvmlDevice_t h = nullptr;
        if (get_by_uuid_ && get_by_uuid_(text, &h) == NVML_SUCCESS) return h;
        std::copy_n("MIG", 3, text);  // the prefix only: "GPU-..." becomes "MIG-..."
        nvmlDevice_t mig = nullptr;
        if (get_by_uuid_ && get_by_uuid_(text, &mig) == NVML_SUCCESS && parent_of_mig_ &&
            parent_of_mig_(mig, &h) == NVML_SUCCESS)
            return h;
        return nullptr;
    }

    std::optional<uint32_t> utilization(nvmlDevice_t h) const {
        if (nvmlUtilization_t u{}; call(utilization_, h, &u)) return u.gpu;
        return std::nullopt;
    }

    void query(nvmlDevice_t h, gpu_status& st) const {
        if (nvmlUtilization_t u{}; call(utilization_, h, &u)) {
            st.set(gpu_field::utilization_gpu, u.gpu);
            st.set(gpu_field::utilization_memory, u.memory);
        }
        if (unsigned t = 0; call(temperature_, h, NVML_TEMPERATURE_GPU, &t))
            st.set(gpu_field::temperature, t);
        read_uint(power_usage_, h, st, gpu_field::power_usage);
        read_uint(power_limit_, h, st, gpu_field::power_limit);
        read_uint(power_default_limit_, h, st, gpu_field::power_default_limit);
        read_uint(enforced_power_limit_, h, st, gpu_field::enforced_power_limit);
        for (unsigned c = 0; c < NVML_CLOCK_COUNT; ++c) {
            auto type = static_cast<nvmlClockType_t>(c);
            if (unsigned mhz = 0; call(clock_, h, type, &mhz))
                st.set(static_cast<gpu_field>(static_cast<unsigned>(gpu_field::clock_graphics) + c), mhz);
            if (unsigned mhz = 0; call(max_clock_, h, type, &mhz))
                st.set(static_cast<gpu_field>(static_cast<unsigned>(gpu_field::max_clock_graphics) + c), mhz);
        }
        if (nvmlComputeMode_t m{}; call(compute_mode_, h, &m)) st.set(gpu_field::compute_mode, m);
        if (unsigned cur = 0, pending = 0; call(mig_mode_, h, &cur, &pending)) {
            st.set(gpu_field::mig_current, cur);
            st.set(gpu_field::mig_pending, pending);
        }
        read_uint(fan_speed_, h, st, gpu_field::fan_speed);
        if (nvmlPstates_t p{}; call(performance_state_, h, &p)) st.set(gpu_field::performance_state, p);
        read_enable(persistence_mode_, h, st, gpu_field::persistence_mode);
        read_enable(display_mode_, h, st, gpu_field::display_mode);
        read_enable(display_active_, h, st, gpu_field::display_active);
        if (nvmlBAR1Memory_t b{}; call(bar1_, h, &b)) {
            st.set(gpu_field::bar1_total, b.bar1Total);
            st.set(gpu_field::bar1_free, b.bar1Free);
            st.set(gpu_field::bar1_used, b.bar1Used);
        }
        nvmlPciInfoExt_t pci{};
        pci.version = nvmlPciInfoExt_v1;
        if (call(pci_ext_, h, &pci)) {
            st.set(gpu_field::pci_base_class, pci.baseClass);
            st.set(gpu_field::pci_sub_class, pci.subClass);
        }
        if (nvmlEnableState_t cur{}, pending{}; call(ecc_mode_, h, &cur, &pending)) {
            st.set(gpu_field::ecc_current, cur);
            st.set(gpu_field::ecc_pending, pending);
        }
        read_uint(virtualization_mode_, h, st, gpu_field::virtualization_mode);
        read_uint(brand_, h, st, gpu_field::brand);
        read_uint(architecture_, h, st, gpu_field::architecture);
        read_uint(max_mig_devices_, h, st, gpu_field::max_mig_devices);
        read_uint(pcie_gen_, h, st, gpu_field::pcie_gen_current);
        read_uint(pcie_width_, h, st, gpu_field::pcie_width_current);
        read_uint(max_pcie_gen_, h, st, gpu_field::pcie_gen_max);
        read_uint(max_pcie_width_, h, st, gpu_field::pcie_width_max);
        read_uint(gpu_max_pcie_gen_, h, st, gpu_field::pcie_gen_gpu_max);
        read_uint(pcie_speed_, h, st, gpu_field::pcie_speed);
        if (validate_inforom_) {
            nvmlReturn_t rc = validate_inforom_(h);
            if (rc == NVML_SUCCESS || rc == NVML_ERROR_CORRUPTED_INFOROM)
                st.set(gpu_field::inforom_valid, rc == NVML_SUCCESS);
        }
        if (driver_version_) driver_version_(st.driver_version, sizeof st.driver_version);
        if (nvml_version_) nvml_version_(st.nvml_version, sizeof st.nvml_version);
        if (serial_) serial_(h, st.serial, sizeof st.serial);
        // NVLinks that are up and carry P2P traffic, with their far ends (NCCL builds its topology from
        // them).
        if (nvlink_cap_ && nvlink_state_ && nvlink_remote_) {
            unsigned n = 0;
            for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; ++l) {
                unsigned p2p = 0;
                nvmlEnableState_t up{};
                nvmlPciInfo_t far{};
                if (call(nvlink_cap_, h, l, NVML_NVLINK_CAP_P2P_SUPPORTED, &p2p) && p2p &&
                    call(nvlink_state_, h, l, &up) && up == NVML_FEATURE_ENABLED &&
                    call(nvlink_remote_, h, l, &far))
                    std::snprintf(st.nvlink_remote[n++], sizeof st.nvlink_remote[0], "%s", far.busId);
            }
            st.set(gpu_field::nvlinks, n);
        }
    }

  private:
    host_nvml() {
        const char* path = "libnvidia-ml.so.1";
        lib_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib_) {
            why_ = std::string("no NVML on this server (") + dlerror() + ")";
            VCUDA_LOG_INFO("{}: GPU status queries (nvidia-smi in clients) will answer 'not supported'",
                           why_);
            return;
        }
        auto init = sym<decltype(&nvmlInit_v2)>("nvmlInit_v2");
        nvmlReturn_t rc = init ? init() : NVML_ERROR_FUNCTION_NOT_FOUND;
        if (rc != NVML_SUCCESS) {
            why_ = "the host's NVML did not initialize (nvmlReturn_t " + std::to_string(rc) + ")";
            VCUDA_LOG_WARN("{}: GPU status queries will answer 'not supported'", why_);
            return;
        }
        get_by_uuid_ = sym<decltype(&nvmlDeviceGetHandleByUUID)>("nvmlDeviceGetHandleByUUID");
        parent_of_mig_ = sym<decltype(&nvmlDeviceGetDeviceHandleFromMigDeviceHandle)>(
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
        utilization_ = sym<decltype(&nvmlDeviceGetUtilizationRates)>("nvmlDeviceGetUtilizationRates");
        temperature_ = sym<decltype(&nvmlDeviceGetTemperature)>("nvmlDeviceGetTemperature");
        power_usage_ = sym<decltype(&nvmlDeviceGetPowerUsage)>("nvmlDeviceGetPowerUsage");
        power_limit_ = sym<decltype(&nvmlDeviceGetPowerManagementLimit)>("nvmlDeviceGetPowerManagementLimit");
        power_default_limit_ = sym<decltype(&nvmlDeviceGetPowerManagementDefaultLimit)>(
            "nvmlDeviceGetPowerManagementDefaultLimit");
        enforced_power_limit_ =
            sym<decltype(&nvmlDeviceGetEnforcedPowerLimit)>("nvmlDeviceGetEnforcedPowerLimit");
        clock_ = sym<decltype(&nvmlDeviceGetClockInfo)>("nvmlDeviceGetClockInfo");
        max_clock_ = sym<decltype(&nvmlDeviceGetMaxClockInfo)>("nvmlDeviceGetMaxClockInfo");
        compute_mode_ = sym<decltype(&nvmlDeviceGetComputeMode)>("nvmlDeviceGetComputeMode");
        mig_mode_ = sym<decltype(&nvmlDeviceGetMigMode)>("nvmlDeviceGetMigMode");
        fan_speed_ = sym<decltype(&nvmlDeviceGetFanSpeed)>("nvmlDeviceGetFanSpeed");
        performance_state_ = sym<decltype(&nvmlDeviceGetPerformanceState)>("nvmlDeviceGetPerformanceState");
        persistence_mode_ = sym<decltype(&nvmlDeviceGetPersistenceMode)>("nvmlDeviceGetPersistenceMode");
        display_mode_ = sym<decltype(&nvmlDeviceGetDisplayMode)>("nvmlDeviceGetDisplayMode");
        display_active_ = sym<decltype(&nvmlDeviceGetDisplayActive)>("nvmlDeviceGetDisplayActive");
        bar1_ = sym<decltype(&nvmlDeviceGetBAR1MemoryInfo)>("nvmlDeviceGetBAR1MemoryInfo");
        driver_version_ = sym<decltype(&nvmlSystemGetDriverVersion)>("nvmlSystemGetDriverVersion");
        nvml_version_ = sym<decltype(&nvmlSystemGetNVMLVersion)>("nvmlSystemGetNVMLVersion");
        serial_ = sym<decltype(&nvmlDeviceGetSerial)>("nvmlDeviceGetSerial");
        pci_ext_ = sym<decltype(&nvmlDeviceGetPciInfoExt)>("nvmlDeviceGetPciInfoExt");
        ecc_mode_ = sym<decltype(&nvmlDeviceGetEccMode)>("nvmlDeviceGetEccMode");
        virtualization_mode_ =
            sym<decltype(&nvmlDeviceGetVirtualizationMode)>("nvmlDeviceGetVirtualizationMode");
        brand_ = sym<decltype(&nvmlDeviceGetBrand)>("nvmlDeviceGetBrand");
        architecture_ = sym<decltype(&nvmlDeviceGetArchitecture)>("nvmlDeviceGetArchitecture");
        max_mig_devices_ = sym<decltype(&nvmlDeviceGetMaxMigDeviceCount)>("nvmlDeviceGetMaxMigDeviceCount");
        validate_inforom_ = sym<decltype(&nvmlDeviceValidateInforom)>("nvmlDeviceValidateInforom");
        pcie_gen_ =
            sym<decltype(&nvmlDeviceGetCurrPcieLinkGeneration)>("nvmlDeviceGetCurrPcieLinkGeneration");
        pcie_width_ = sym<decltype(&nvmlDeviceGetCurrPcieLinkWidth)>("nvmlDeviceGetCurrPcieLinkWidth");
        max_pcie_gen_ =
            sym<decltype(&nvmlDeviceGetMaxPcieLinkGeneration)>("nvmlDeviceGetMaxPcieLinkGeneration");
        max_pcie_width_ = sym<decltype(&nvmlDeviceGetMaxPcieLinkWidth)>("nvmlDeviceGetMaxPcieLinkWidth");
        gpu_max_pcie_gen_ =
            sym<decltype(&nvmlDeviceGetGpuMaxPcieLinkGeneration)>("nvmlDeviceGetGpuMaxPcieLinkGeneration");
        pcie_speed_ = sym<decltype(&nvmlDeviceGetPcieSpeed)>("nvmlDeviceGetPcieSpeed");
        nvlink_cap_ = sym<decltype(&nvmlDeviceGetNvLinkCapability)>("nvmlDeviceGetNvLinkCapability");
        nvlink_state_ = sym<decltype(&nvmlDeviceGetNvLinkState)>("nvmlDeviceGetNvLinkState");
        nvlink_remote_ =
            sym<decltype(&nvmlDeviceGetNvLinkRemotePciInfo_v2)>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
        usable_ = get_by_uuid_ != nullptr;
        if (!usable_) why_ = "the host's NVML lacks nvmlDeviceGetHandleByUUID";
        VCUDA_LOG_INFO("NVML loaded: clients' nvidia-smi sees this host's GPU status");
    }

    template <class F>
    F sym(const char* name) const {
        return reinterpret_cast<F>(dlsym(lib_, name));
    }
    template <class F, class... A>
    static bool call(F f, A... a) {
        return f && f(a...) == NVML_SUCCESS;
    }
    template <class F>
    static void read_uint(F f, nvmlDevice_t h, gpu_status& st, gpu_field field) {
        if (unsigned v = 0; call(f, h, &v)) st.set(field, v);
    }
    template <class F>
    static void read_enable(F f, nvmlDevice_t h, gpu_status& st, gpu_field field) {
        if (nvmlEnableState_t v{}; call(f, h, &v)) st.set(field, v);
    }

    void* lib_ = nullptr;
    bool usable_ = false;
    std::string why_;
    decltype(&nvmlDeviceGetHandleByUUID) get_by_uuid_ = nullptr;
    decltype(&nvmlDeviceGetDeviceHandleFromMigDeviceHandle) parent_of_mig_ = nullptr;
    decltype(&nvmlDeviceGetUtilizationRates) utilization_ = nullptr;
    decltype(&nvmlDeviceGetTemperature) temperature_ = nullptr;
    decltype(&nvmlDeviceGetPowerUsage) power_usage_ = nullptr;
    decltype(&nvmlDeviceGetPowerManagementLimit) power_limit_ = nullptr;
    decltype(&nvmlDeviceGetPowerManagementDefaultLimit) power_default_limit_ = nullptr;
    decltype(&nvmlDeviceGetEnforcedPowerLimit) enforced_power_limit_ = nullptr;
    decltype(&nvmlDeviceGetClockInfo) clock_ = nullptr;
    decltype(&nvmlDeviceGetMaxClockInfo) max_clock_ = nullptr;
    decltype(&nvmlDeviceGetComputeMode) compute_mode_ = nullptr;
    decltype(&nvmlDeviceGetMigMode) mig_mode_ = nullptr;
    decltype(&nvmlDeviceGetFanSpeed) fan_speed_ = nullptr;
    decltype(&nvmlDeviceGetPerformanceState) performance_state_ = nullptr;
    decltype(&nvmlDeviceGetPersistenceMode) persistence_mode_ = nullptr;
    decltype(&nvmlDeviceGetDisplayMode) display_mode_ = nullptr;
    decltype(&nvmlDeviceGetDisplayActive) display_active_ = nullptr;
    decltype(&nvmlDeviceGetBAR1MemoryInfo) bar1_ = nullptr;
    decltype(&nvmlSystemGetDriverVersion) driver_version_ = nullptr;
    decltype(&nvmlSystemGetNVMLVersion) nvml_version_ = nullptr;
    decltype(&nvmlDeviceGetSerial) serial_ = nullptr;
    decltype(&nvmlDeviceGetPciInfoExt) pci_ext_ = nullptr;
    decltype(&nvmlDeviceGetEccMode) ecc_mode_ = nullptr;
    decltype(&nvmlDeviceGetVirtualizationMode) virtualization_mode_ = nullptr;
    decltype(&nvmlDeviceGetBrand) brand_ = nullptr;
    decltype(&nvmlDeviceGetArchitecture) architecture_ = nullptr;
    decltype(&nvmlDeviceGetMaxMigDeviceCount) max_mig_devices_ = nullptr;
    decltype(&nvmlDeviceValidateInforom) validate_inforom_ = nullptr;
    decltype(&nvmlDeviceGetCurrPcieLinkGeneration) pcie_gen_ = nullptr;
    decltype(&nvmlDeviceGetCurrPcieLinkWidth) pcie_width_ = nullptr;
    decltype(&nvmlDeviceGetMaxPcieLinkGeneration) max_pcie_gen_ = nullptr;
    decltype(&nvmlDeviceGetMaxPcieLinkWidth) max_pcie_width_ = nullptr;
    decltype(&nvmlDeviceGetGpuMaxPcieLinkGeneration) gpu_max_pcie_gen_ = nullptr;
    decltype(&nvmlDeviceGetPcieSpeed) pcie_speed_ = nullptr;
    decltype(&nvmlDeviceGetNvLinkCapability) nvlink_cap_ = nullptr;
    decltype(&nvmlDeviceGetNvLinkState) nvlink_state_ = nullptr;
    decltype(&nvmlDeviceGetNvLinkRemotePciInfo_v2) nvlink_remote_ = nullptr;
};

template <size_t N>
void out_string(call_context& cx, const char (&s)[N]) {
    cx.out_blob({reinterpret_cast<const std::byte*>(s), ::strnlen(s, N)});
}

}  // namespace

std::optional<uint32_t> gpu_utilization(const CUuuid& u) {
    auto& nv = host_nvml::get();
    nvmlDevice_t h = nv.usable() ? nv.find(u) : nullptr;
    if (!h) return std::nullopt;
    return nv.utilization(h);
}

// args {session device index}; reply: common/gpu_status.hpp. Needs no context: NVML-only clients
// (nvidia-smi) never create one.
CUresult handle_gpu_status(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    uint64_t d = cx.arg(0);
    if (!cx.sess.allowed(d)) return cx.fail(CUDA_ERROR_INVALID_DEVICE, "no such device in this session");
    auto& nv = host_nvml::get();
    if (!nv.usable()) return cx.fail(CUDA_ERROR_NOT_SUPPORTED, nv.why());
    nvmlDevice_t h = nv.find(cx.sess.drv().gpus()[cx.sess.gpu_of(d)].uuid);
    if (!h) return cx.fail(CUDA_ERROR_NOT_SUPPORTED, "the host's NVML does not know this GPU's UUID");
    gpu_status st;
    nv.query(h, st);
    cx.out(st.answered);
    for (uint64_t v : st.values) cx.out(v);
    out_string(cx, st.driver_version);
    out_string(cx, st.nvml_version);
    out_string(cx, st.serial);
    std::string remotes;
    for (unsigned l = 0; st.has(gpu_field::nvlinks) && l < st.get(gpu_field::nvlinks); ++l)
        remotes += std::string(st.nvlink_remote[l]) + "\n";
    cx.out_blob({reinterpret_cast<const std::byte*>(remotes.data()), remotes.size()});
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
