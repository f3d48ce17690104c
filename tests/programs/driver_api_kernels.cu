// The device code of driver_api, built into a fatbin and a PTX file that driver_api embeds and loads itself
// (cuModuleLoadData, cuLibraryLoadData). Plain C names, so the driver API finds them as written.

__device__ float drv_bias =
    0.5f;  // a global with an initializer, found by cuModuleGetGlobal / cuLibraryGetGlobal

extern "C" __global__ void drv_scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a;
}

extern "C" __global__ void drv_add_bias(float* x, const float* bias, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + *bias;
}

extern "C" __global__ void drv_iota(int* out, int base, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = base + i;
}
