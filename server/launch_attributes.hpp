// Launch attributes (CUlaunchAttribute) as launches, streams and kernel graph nodes take them: which ones the
// server passes to the driver as the client sent them. runs on: any thread (no state).
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

namespace vcuda::server {

// True for the attributes whose value holds no handle: the client's bytes can go to the driver as they are.
// The access policy window holds a device address (the same on both sides), which the driver only uses as a
// cache hint. Events (programmatic and completion events) and the device-updatable node's device handle
// would need translating and are refused; so is any id this server does not know.
constexpr bool plain_launch_attribute(CUlaunchAttributeID id) {
    switch (id) {
        case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
        case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
        case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
        case CU_LAUNCH_ATTRIBUTE_PRIORITY:
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
        case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
        case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING:
            return true;
        default:
            return false;
    }
}

}  // namespace vcuda::server
