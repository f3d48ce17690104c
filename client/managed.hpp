// Managed memory (cuMemAllocManaged): device memory of the session, charged to its quota like any allocation,
// whose address the application may also touch from the CPU. The client keeps a CPU view at the same address
// (the range it reserves for every device pointer, client/state.cpp), coherent with the device the way the
// driver keeps it on a GPU without concurrent managed access (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
// 0, which is what the client reports): the CPU may touch managed memory while no GPU work that uses it runs.
//
// - The view is a memfd mapped at the device address, PROT_NONE while the device holds the only copy. The
//   first CPU touch of a chunk (1 MiB) faults; the SIGSEGV handler hands the address to the fault thread,
//   which copies the chunk from the device into a second, always writable mapping of the same memfd (so no
//   other thread sees a half-filled chunk) and opens the chunk read-only, or writable and dirty for a write.
//   A write to a read-only chunk marks it dirty.
// - Before any launch, graph launch, copy or memset that may read or write managed memory, dirty chunks are
//   made inaccessible, then copied back to the device, on the calling thread's lane, before the work is sent;
//   when the GPU may write the range, the CPU's copy is dropped too (the next touch fetches fresh bytes). Not
//   while a stream capture is under way (a synchronous copy would invalidate it): the graph's launch does it.
// - A copy whose host side is a managed pointer is a device-to-device copy.
// - New allocations start zeroed on both sides and readable here without a fetch.
//
// Why a signal handler and a thread, not userfaultfd: userfaultfd is refused in many containers (seccomp) and
// to unprivileged users, and it cannot see a write to a page already present. The handler itself only reads a
// lock-free table, writes one request to a pipe and waits on a futex (all async-signal-safe); everything else
// (locks, allocation, network) runs on the fault thread. That thread never needs a lock the faulting thread
// could hold: vcuda's own code never touches a managed view (copies go device to device), and the application
// faulting inside malloc or stdio holds nothing the fault thread takes.
//
// Limits (README): system calls that read into or write from a managed range the CPU does not hold (read(2)
// into it, for instance) fail with EFAULT instead of faulting; touch or prefetch it to the CPU first. Each
// allocation has a device mapping of its own (2 MiB granules), charged to the quota as such.
//
// runs on: application threads (entry points, copies, launches) and the fault thread.
// locks: one mutex for the ranges and their chunk states, held across the copies of a write-back or fetch
// (a CPU touch during a write-back waits for it); the handler's table is lock-free.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace vcuda::client {

// A new managed allocation of `bytesize` bytes on the current device (whole 2 MiB granules of its own, for
// its CPU view), known to the mirror and journaled: cuMemAllocManaged's, and the mapped pinned memory
// cuMemHostAlloc makes over TCP (client/api_memory.cpp).
CUresult managed_alloc(CUdeviceptr* dptr, size_t bytesize, unsigned flags);
// Turns the device allocation [base, base+size) of client device `device`, made in context `ctx` and already
// known to the mirror, into managed memory (flags: CU_MEM_ATTACH_GLOBAL or _HOST). The range is zeroed on the
// device (queued) and in the CPU view. CUDA_ERROR_OUT_OF_MEMORY when the address could not be reserved here
// or the table of managed ranges is full.
CUresult managed_adopt(uint64_t base, size_t size, int device, uint64_t ctx, unsigned flags);
// A library's __managed__ variable [p, p+size) (cuLibraryGetManaged), at the address the server's driver
// gave it: a CPU view of the pages around it (shared with variables that meet them), empty until the CPU
// touches it, of which only the variable's bytes are copied. CUDA_ERROR_OUT_OF_MEMORY when those pages are
// taken in this process.
CUresult managed_adopt_variable(uint64_t p, size_t size, int device, uint64_t ctx, uint64_t library);
// At cuMemFree: drops the CPU view and restores the reservation. False when `base` is not a managed
// allocation.
bool managed_release(uint64_t base);
// At cuLibraryUnload: the library's variables lose their views.
void managed_release_library(uint64_t library);
// Whether p lies in managed memory.
bool managed_contains(uint64_t p);

// Before GPU work that may touch any managed memory (launches, graph launches): dirty chunks written back,
// every CPU copy dropped. Costs one atomic load while the CPU holds nothing.
CUresult managed_before_launch();
// Before a copy or memset touching [p, p+n) on the device side: dirty chunks there written back; the CPU's
// copy dropped too when the GPU writes it.
CUresult managed_before_device_access(uint64_t p, size_t n, bool writes);

// cuMemPrefetchAsync: to a device, dirty chunks written back and the CPU's copy dropped; to the CPU, the
// stream synchronized and the range fetched. Records the location for CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_*.
CUresult managed_prefetch(uint64_t p, size_t n, const CUmemLocation& to, CUstream stream);
// cuMemAdvise: recorded for cuMemRangeGetAttribute(s); the data movement it hints at is left to the faults.
CUresult managed_advise(uint64_t p, size_t n, CUmem_advise advice, const CUmemLocation& where);
CUresult managed_range_attribute(void* data, size_t data_size, CUmem_range_attribute attr, uint64_t p,
                                 size_t n);
// cuStreamAttachMemAsync: checked and recorded; coherence stays conservative (every launch writes back).
CUresult managed_attach(uint64_t p, size_t n, unsigned flags);

}  // namespace vcuda::client
