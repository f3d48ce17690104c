// A probe of the real driver, run natively (no vcuda): may a kernel use the host pointer of memory registered
// with cudaHostRegister *without* cudaHostRegisterMapped (flags 0), as it may for cudaHostAlloc memory under
// unified addressing? Through vcuda over a Unix socket such a launch is refused today (client/api_launch.cpp:
// only mapped registrations are shared with the server); this says whether the native driver allows it.
// It prints the device attribute that governs it, cudaHostGetDevicePointer's answer, and what a kernel that
// writes through the host pointer leaves there.
//   nvcc -arch=sm_90 -o registered_kernel_access registered_kernel_access.cu
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int count = 1024;

__global__ void write_index(int* p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) p[i] = i;
}

void probe(unsigned flags, const char* what) {
    int* h = static_cast<int*>(std::aligned_alloc(4096, count * sizeof(int)));
    std::memset(h, 0xff, count * sizeof(int));
    cudaError_t rc = cudaHostRegister(h, count * sizeof(int), flags);
    void* dptr = nullptr;
    cudaError_t gp = cudaHostGetDevicePointer(&dptr, h, 0);
    cudaGetLastError();
    write_index<<<count / 256, 256>>>(h);
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    int right = 0;
    for (int i = 0; i < count; ++i) right += h[i] == i;
    std::printf(
        "%s: register %s, device pointer %s (%s the host pointer), launch %s, sync %s, %d of %d written\n",
        what, cudaGetErrorName(rc), cudaGetErrorName(gp), dptr == h ? "same as" : "not",
        cudaGetErrorName(launch), cudaGetErrorName(sync), right, count);
    if (rc == cudaSuccess) cudaHostUnregister(h);
    std::free(h);
}

}  // namespace

int main() {
    int can = -1;
    cudaDeviceGetAttribute(&can, cudaDevAttrCanUseHostPointerForRegisteredMem, 0);
    std::printf("cudaDevAttrCanUseHostPointerForRegisteredMem: %d\n", can);
    probe(cudaHostRegisterMapped, "mapped");
    probe(cudaHostRegisterDefault, "default");  // last: a fault here poisons the context
    return 0;
}
