// reset_one_device: a context reset on one device leaves the other devices' module globals alone. Both
// devices load the module and write a __device__ array through the address cudaGetSymbolAddress gave;
// cudaDeviceReset on device 1 must not take device 0's global from it (the server once forgot every device's
// module globals at any reset, and then refused copies to the address device 0's program kept): device 0's
// array is written through that address, read by a kernel and read back after the reset, and device 1 uses
// its own again afterwards. Needs two devices (CI: two software GPUs, VCUDA_SOFT_DEVICES=2).
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

__device__ int rd_values[64];

// Reads the global through the address cudaGetSymbolAddress gave (the software test driver's kernels take
// every address as a parameter).
extern "C" __global__ void rd_double(const int* values, int* out) {
    int i = threadIdx.x;
    if (i < 64) out[i] = 2 * values[i];
}

// Device d's address of rd_values, as a program keeps it (cudaGetSymbolAddress once).
static int* address_of(int d) {
    CHECK(cudaSetDevice(d));
    int* values;
    CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&values), rd_values));
    return values;
}

// Writes `base + i` into device d's rd_values through the kept address, and checks it through a kernel, a
// copy from that address and cudaMemcpyFromSymbol.
static void write_and_check(int d, int* values, int base) {
    CHECK(cudaSetDevice(d));
    std::vector<int> vals(64), back(64), by_symbol(64), doubled(64);
    for (int i = 0; i < 64; ++i) vals[i] = base + i;
    CHECK(cudaMemcpy(values, vals.data(), 64 * sizeof(int), cudaMemcpyHostToDevice));
    int* out;
    CHECK(cudaMalloc(&out, 64 * sizeof(int)));
    rd_double<<<1, 64>>>(values, out);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(doubled.data(), out, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(back.data(), values, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyFromSymbol(by_symbol.data(), rd_values, 64 * sizeof(int)));
    for (int i = 0; i < 64; ++i) {
        EXPECT(back[i] == vals[i], "device %d: rd_values[%d] = %d, expected %d", d, i, back[i], vals[i]);
        EXPECT(by_symbol[i] == vals[i], "device %d: rd_values[%d] by symbol = %d, expected %d", d, i,
               by_symbol[i], vals[i]);
        EXPECT(doubled[i] == 2 * vals[i], "device %d: kernel read rd_values[%d] as %d, expected %d", d, i,
               doubled[i] / 2, vals[i]);
    }
    CHECK(cudaFree(out));
    printf("device %d: global written and read (base %d): ok\n", d, base);
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    printf("devices: %d\n", count);
    EXPECT(count >= 2, "needs two devices, found %d", count);
    int* values0 = address_of(0);
    write_and_check(0, values0, 100);
    write_and_check(1, address_of(1), 200);
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceReset());
    printf("device 1 reset\n");
    write_and_check(0, values0, 300);  // the address device 0 gave before the reset is still its global
    write_and_check(1, address_of(1), 400);
    return pass();
}
