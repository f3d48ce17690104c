// vcuda's own export table: what libnvidia-ml.so.1 (client/nvml/) asks libcuda.so.1 for, beyond the public
// driver API, so that both libraries share one session and report the same devices. Obtained with
// cuGetExportTable(&table, &vcuda_private_table_id); word 0 holds the table's size in bytes, then the slots.
// Both libraries are built from this header and shipped together in lib/vcuda/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/gpu_status.hpp"

namespace vcuda {

// "vcuda private 1" (random, stable): never reuse it for another layout; a new layout gets a new id.
inline constexpr unsigned char vcuda_private_table_id[16] = {0xec, 0xe5, 0x82, 0x8d, 0x6d, 0xcb, 0x49, 0x20,
                                                             0xaa, 0x06, 0x5e, 0x42, 0x1c, 0xf4, 0x5f, 0xe7};

// Slot 1: the device memory this process holds on client device `dev` (its allocations; module globals are
// part of their module) and whether it has a context there. CUDA_ERROR_DEVICE_UNAVAILABLE once the server
// connection is lost.
using device_usage_fn = int (*)(int dev, unsigned long long* bytes, int* has_context);

// Slot 2: the physical GPU's live state from the server's NVML (op gpu_status), waiting at most
// `timeout_ms`. `size` must be sizeof(gpu_status). Answers CUDA_ERROR_NOT_SUPPORTED when the server has no
// NVML, CUDA_ERROR_TIMEOUT when the server did not answer in time, CUDA_ERROR_DEVICE_UNAVAILABLE when the
// connection is lost.
using gpu_status_fn = int (*)(int dev, gpu_status* out, size_t size, unsigned timeout_ms);

// Slot 3: how many synchronous round trips and asynchronous calls this process has sent to its servers so far
// (every session together). Always CUDA_SUCCESS.
using call_counts_fn = int (*)(unsigned long long* round_trips, unsigned long long* posted);

// Slot 4: the GPUs as NVML lists them: every GPU of this process's sessions in the servers' order, also those
// CUDA_VISIBLE_DEVICES hides from CUDA (the real NVML ignores the variable; tools that honour it, such as
// PyTorch's device count, apply it themselves). Fills `out` (when not null; `size` must be
// sizeof(listed_gpu)) for listing index `index` and returns how many there are, or -1 when cuInit connected
// no session (a cuInit that failed only because CUDA_VISIBLE_DEVICES hid every GPU still has them listed).
struct listed_gpu {
    int cuda_ordinal;  // -1: hidden by CUDA_VISIBLE_DEVICES
    char name[256];
    unsigned char uuid[16];
    unsigned long long total_memory;
    int pci_domain, pci_bus, pci_device, pci_device_id, pci_subsystem_id, cc_major, cc_minor;
};
using listed_gpus_fn = int (*)(int index, listed_gpu* out, size_t size);

// Slot 5: slot 2's answer for listing index `index` (slot 4), hidden GPUs included.
using listed_gpu_status_fn = int (*)(int index, gpu_status* out, size_t size, unsigned timeout_ms);

// Slots are only ever appended: a reader checks `size` before using a later slot.
struct private_table {
    size_t size;  // bytes, this word included
    device_usage_fn device_usage;
    gpu_status_fn gpu_status;
    call_counts_fn call_counts;
    listed_gpus_fn listed_gpus;
    listed_gpu_status_fn listed_gpu_status;
};

namespace client {
const private_table& the_private_table();  // in libcuda.so.1 (client/private_table.cpp)
}

}  // namespace vcuda
