// A stand-in for the host's libnvidia-ml.so.1, for vcuda-server on the software driver in CI (the real one
// needs NVIDIA's driver): every GPU it is asked about by UUID has two NVLinks, up and able to carry P2P
// traffic, whose far end is an NVSwitch-like "FFFFFFFF:FF:FF.0" (what the H200 pair reports); everything
// else is absent, so the server leaves those fields unanswered. Loaded by the server through
// LD_LIBRARY_PATH (tests/nvml/nvml_test.cpp).
#include <cstdio>
#include <cstring>

#include "common/nvml_api.hpp"

namespace {
constexpr unsigned links = 2;
int device_token;  // every handle points here: the server only passes handles back
}  // namespace

extern "C" {

nvmlReturn_t nvmlInit_v2() noexcept { return NVML_SUCCESS; }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) noexcept {
    if (!uuid || !device || std::strncmp(uuid, "GPU-", 4) != 0) return NVML_ERROR_NOT_FOUND;
    *device = reinterpret_cast<nvmlDevice_t>(&device_token);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t, unsigned int link, nvmlNvLinkCapability_t capability,
                                           unsigned int* capResult) noexcept {
    if (link >= NVML_NVLINK_MAX_LINKS || !capResult) return NVML_ERROR_INVALID_ARGUMENT;
    *capResult = link < links && capability == NVML_NVLINK_CAP_P2P_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t, unsigned int link, nvmlEnableState_t* isActive) noexcept {
    if (link >= NVML_NVLINK_MAX_LINKS || !isActive) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = link < links ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t, unsigned int link,
                                                 nvmlPciInfo_t* pci) noexcept {
    if (link >= links || !pci) return NVML_ERROR_INVALID_ARGUMENT;
    *pci = {};
    std::snprintf(pci->busId, sizeof pci->busId, "FFFFFFFF:FF:FF.0");
    return NVML_SUCCESS;
}

}  // extern "C"
