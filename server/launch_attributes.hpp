// Launch attributes (CUlaunchAttribute) as launches, streams and kernel graph nodes take them: which ones the
// server passes to the driver as the client sent them. runs on: any thread (no state).
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

namespace vcuda::server {

// True for the attributes whose value holds no handle: the client's bytes can go to the driver as they are.
// The access policy window holds a device address (the same on both sides), which the driver only uses as a
// cache hint. The device-updatable node's device handle would need translating and is refused; so is any id
// this server does not know. Launches also take the two that hold an event (launch_attribute_event).
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

// The attributes a kernel graph node may hold that a suspend or a move carries (server/graph_image.cpp):
// the plain ones. A device-updatable node is refused there.
constexpr CUlaunchAttributeID kernel_node_attributes[] = {
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
    CU_LAUNCH_ATTRIBUTE_PRIORITY,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
    CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION,
    CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
};

// True when `a` and `b` hold the same value of attribute `id`, compared by the members it uses (the union's
// other bytes are undefined); false for an id not named here. Serves the rebuild of streams and kernel nodes
// (a value is set again only when it differs from a new object's).
constexpr bool same_launch_attribute(CUlaunchAttributeID id, const CUlaunchAttributeValue& a,
                                     const CUlaunchAttributeValue& b) {
    switch (id) {
        case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW: {
            const auto &x = a.accessPolicyWindow, &y = b.accessPolicyWindow;
            return x.base_ptr == y.base_ptr && x.num_bytes == y.num_bytes && x.hitRatio == y.hitRatio &&
                   x.hitProp == y.hitProp && x.missProp == y.missProp;
        }
        case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
            return a.cooperative == b.cooperative;
        case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
            return a.syncPolicy == b.syncPolicy;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            return a.clusterDim.x == b.clusterDim.x && a.clusterDim.y == b.clusterDim.y &&
                   a.clusterDim.z == b.clusterDim.z;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
            return a.clusterSchedulingPolicyPreference == b.clusterSchedulingPolicyPreference;
        case CU_LAUNCH_ATTRIBUTE_PRIORITY:
            return a.priority == b.priority;
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
            return a.memSyncDomainMap.default_ == b.memSyncDomainMap.default_ &&
                   a.memSyncDomainMap.remote == b.memSyncDomainMap.remote;
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
            return a.memSyncDomain == b.memSyncDomain;
        case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
            return a.preferredClusterDim.x == b.preferredClusterDim.x &&
                   a.preferredClusterDim.y == b.preferredClusterDim.y &&
                   a.preferredClusterDim.z == b.preferredClusterDim.z;
        case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
            return a.sharedMemCarveout == b.sharedMemCarveout;
        default:
            return false;
    }
}

// The event a launch attribute records (the programmatic event, the launch completion event), or null. The
// client sends its session handle there; the server puts the driver's event in its place.
inline CUevent* launch_attribute_event(CUlaunchAttribute& a) {
    switch (a.id) {
        case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT:
            return &a.value.programmaticEvent.event;
        case CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT:
            return &a.value.launchCompletionEvent.event;
        default:
            return nullptr;
    }
}

}  // namespace vcuda::server
