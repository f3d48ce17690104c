// The NVML types vcuda declares (common/nvml_api.hpp) against the layouts NVIDIA documents for x86-64
// (docs.nvidia.com/deploy/nvml-api, nvml.h of driver 580): a wrong offset here would corrupt every caller.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>

#include "common/gpu_status.hpp"
#include "common/nvml_api.hpp"

TEST_CASE("NVML structs have the documented sizes and offsets", "[unit]") {
    CHECK(sizeof(nvmlPciInfo_t) == 68);
    CHECK(offsetof(nvmlPciInfo_t, busIdLegacy) == 0);
    CHECK(offsetof(nvmlPciInfo_t, domain) == 16);
    CHECK(offsetof(nvmlPciInfo_t, bus) == 20);
    CHECK(offsetof(nvmlPciInfo_t, device) == 24);
    CHECK(offsetof(nvmlPciInfo_t, pciDeviceId) == 28);
    CHECK(offsetof(nvmlPciInfo_t, pciSubSystemId) == 32);
    CHECK(offsetof(nvmlPciInfo_t, busId) == 36);

    // nvmlDeviceGetPciInfo / _v2 fill the first 36 bytes of the pre-NVML-9 layout.
    CHECK(sizeof(vcuda_nvmlPciInfo_legacy_t) == 36);
    CHECK(offsetof(vcuda_nvmlPciInfo_legacy_t, busId) == 0);
    CHECK(offsetof(vcuda_nvmlPciInfo_legacy_t, domain) == 16);
    CHECK(offsetof(vcuda_nvmlPciInfo_legacy_t, pciSubSystemId) == 32);

    CHECK(sizeof(nvmlPciInfoExt_t) == 64);
    CHECK(offsetof(nvmlPciInfoExt_t, domain) == 4);
    CHECK(offsetof(nvmlPciInfoExt_t, pciSubSystemId) == 20);
    CHECK(offsetof(nvmlPciInfoExt_t, baseClass) == 24);
    CHECK(offsetof(nvmlPciInfoExt_t, subClass) == 28);
    CHECK(offsetof(nvmlPciInfoExt_t, busId) == 32);
    CHECK(nvmlPciInfoExt_v1 == 0x01000040u);

    CHECK(sizeof(nvmlMemory_t) == 24);
    CHECK(offsetof(nvmlMemory_t, total) == 0);
    CHECK(offsetof(nvmlMemory_t, free) == 8);
    CHECK(offsetof(nvmlMemory_t, used) == 16);

    CHECK(sizeof(nvmlMemory_v2_t) == 40);
    CHECK(offsetof(nvmlMemory_v2_t, version) == 0);
    CHECK(offsetof(nvmlMemory_v2_t, total) == 8);
    CHECK(offsetof(nvmlMemory_v2_t, reserved) == 16);
    CHECK(offsetof(nvmlMemory_v2_t, free) == 24);
    CHECK(offsetof(nvmlMemory_v2_t, used) == 32);
    CHECK(nvmlMemory_v2 == 0x02000028u);

    CHECK(sizeof(nvmlBAR1Memory_t) == 24);
    CHECK(offsetof(nvmlBAR1Memory_t, bar1Free) == 8);
    CHECK(offsetof(nvmlBAR1Memory_t, bar1Used) == 16);

    CHECK(sizeof(nvmlUtilization_t) == 8);
    CHECK(offsetof(nvmlUtilization_t, memory) == 4);

    CHECK(sizeof(nvmlTemperature_t) == 12);
    CHECK(offsetof(nvmlTemperature_t, sensorType) == 4);
    CHECK(offsetof(nvmlTemperature_t, temperature) == 8);
    CHECK(nvmlTemperature_v1 == 0x0100000Cu);

    CHECK(sizeof(nvmlProcessInfo_v1_t) == 16);
    CHECK(offsetof(nvmlProcessInfo_v1_t, usedGpuMemory) == 8);
    CHECK(sizeof(nvmlProcessInfo_v2_t) == 24);
    CHECK(sizeof(nvmlProcessInfo_t) == 24);
    CHECK(offsetof(nvmlProcessInfo_t, usedGpuMemory) == 8);
    CHECK(offsetof(nvmlProcessInfo_t, gpuInstanceId) == 16);
    CHECK(offsetof(nvmlProcessInfo_t, computeInstanceId) == 20);

    CHECK(sizeof(nvmlValue_t) == 8);
    CHECK(sizeof(nvmlFieldValue_t) == 40);
    CHECK(offsetof(nvmlFieldValue_t, scopeId) == 4);
    CHECK(offsetof(nvmlFieldValue_t, timestamp) == 8);
    CHECK(offsetof(nvmlFieldValue_t, latencyUsec) == 16);
    CHECK(offsetof(nvmlFieldValue_t, valueType) == 24);
    CHECK(offsetof(nvmlFieldValue_t, nvmlReturn) == 28);
    CHECK(offsetof(nvmlFieldValue_t, value) == 32);

    CHECK(sizeof(nvmlDevice_t) == 8);
    CHECK(sizeof(nvmlReturn_t) == 4);
    CHECK(sizeof(nvmlEnableState_t) == 4);
    CHECK(sizeof(nvmlClockType_t) == 4);
    CHECK(sizeof(nvmlComputeMode_t) == 4);
    CHECK(sizeof(nvmlPstates_t) == 4);
    CHECK(sizeof(nvmlTemperatureSensors_t) == 4);
}

TEST_CASE("NVML constants have the documented values", "[unit]") {
    CHECK(NVML_ERROR_NOT_SUPPORTED == 3);
    CHECK(NVML_ERROR_DRIVER_NOT_LOADED == 9);
    CHECK(NVML_ERROR_TIMEOUT == 10);
    CHECK(NVML_ERROR_LIBRARY_NOT_FOUND == 12);
    CHECK(NVML_ERROR_GPU_IS_LOST == 15);
    CHECK(NVML_ERROR_LIB_RM_VERSION_MISMATCH == 18);
    CHECK(NVML_ERROR_ARGUMENT_VERSION_MISMATCH == 25);
    CHECK(NVML_ERROR_RESET_TYPE_NOT_SUPPORTED == 30);
    CHECK(NVML_ERROR_UNKNOWN == 999);
    CHECK(NVML_CLOCK_MEM == 2);
    CHECK(NVML_COMPUTEMODE_EXCLUSIVE_PROCESS == 3);
    CHECK(NVML_PSTATE_UNKNOWN == 32);

    char text[41];
    const unsigned char bytes[16] = {0x76, 0x63, 0x75, 0x64, 0x61, 0x2d, 0x73, 0x6f,
                                     0x66, 0x74, 0x2d, 0x67, 0x70, 0x75, 0xab, 0xcd};
    vcuda::nvml::format_gpu_uuid(bytes, text);
    CHECK(std::string(text) == "GPU-76637564-612d-736f-6674-2d677075abcd");
}

TEST_CASE("gpu_status fields keep their wire positions", "[unit]") {
    // Op gpu_status sends field i at outs[1 + i]: positions never move, new fields go at the end.
    CHECK(static_cast<int>(vcuda::gpu_field::utilization_gpu) == 0);
    CHECK(static_cast<int>(vcuda::gpu_field::temperature) == 2);
    CHECK(static_cast<int>(vcuda::gpu_field::clock_graphics) == 7);
    CHECK(static_cast<int>(vcuda::gpu_field::max_clock_graphics) == 11);
    CHECK(static_cast<int>(vcuda::gpu_field::compute_mode) == 15);
    CHECK(static_cast<int>(vcuda::gpu_field::bar1_used) == 25);
    CHECK(static_cast<int>(vcuda::gpu_field::pci_sub_class) == 27);
    CHECK(static_cast<int>(vcuda::gpu_field::inforom_valid) == 34);
    CHECK(static_cast<int>(vcuda::gpu_field::pcie_speed) == 40);
    CHECK(static_cast<int>(vcuda::gpu_field::nvlinks) == 41);
    CHECK(vcuda::gpu_field_count == 42);
    vcuda::gpu_status st;
    CHECK(!st.has(vcuda::gpu_field::fan_speed));
    st.set(vcuda::gpu_field::fan_speed, 40);
    CHECK(st.has(vcuda::gpu_field::fan_speed));
    CHECK(st.get(vcuda::gpu_field::fan_speed) == 40);
}
