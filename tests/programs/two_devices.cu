// Uses every visible device: a different vector on each, results checked on the host; with two or more,
// device 1's stream waits for an event of device 0's and copies from it. Through vcuda with a manager, the
// devices may be GPUs on different servers (ordinals 0..n-1 all the same to the program).
#include <cstdio>
#include <vector>

#include "common.cuh"

extern "C" __global__ void td_scale_add(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    std::printf("devices: %d\n", count);
    const int n = 100000;
    std::vector<float*> xs(count), ys(count);
    std::vector<float> hx(n), hy(n);
    for (int i = 0; i < n; ++i) {
        hx[i] = float(i % 1000);
        hy[i] = 1.0f;
    }
    // Start work on every device before collecting any result.
    for (int d = 0; d < count; ++d) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaMalloc(&xs[d], n * sizeof(float)));
        CHECK(cudaMalloc(&ys[d], n * sizeof(float)));
        CHECK(cudaMemcpy(xs[d], hx.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(ys[d], hy.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        td_scale_add<<<(n + 255) / 256, 256>>>(xs[d], ys[d], float(d + 2), n);
        CHECK(cudaGetLastError());
    }
    if (count >= 2) {
        // PyTorch's copy between two GPUs: the destination's stream waits for an event the source's stream
        // recorded after its kernel, then copies from the source GPU's memory. Through vcuda the two GPUs may
        // be sessions on two servers (a lease of GPUs of two servers), whose events only the host can relay.
        const size_t bytes = n * sizeof(float);
        cudaStream_t s0, s1;
        cudaEvent_t done0;
        float *z0, *z1;
        CHECK(cudaSetDevice(0));
        CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
        CHECK(cudaEventCreateWithFlags(&done0, cudaEventDisableTiming));
        CHECK(cudaMalloc(&z0, bytes));
        CHECK(cudaMemcpyAsync(z0, hx.data(), bytes, cudaMemcpyHostToDevice, s0));
        td_scale_add<<<(n + 255) / 256, 256, 0, s0>>>(xs[0], z0, 10.0f, n);  // z0 = 11 x
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(done0, s0));
        CHECK(cudaSetDevice(1));
        CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
        CHECK(cudaMalloc(&z1, bytes));
        CHECK(cudaStreamWaitEvent(s1, done0, 0));
        CHECK(cudaMemcpyAsync(z1, z0, bytes, cudaMemcpyDeviceToDevice, s1));
        std::vector<float> got(n);
        CHECK(cudaMemcpyAsync(got.data(), z1, bytes, cudaMemcpyDeviceToHost, s1));
        CHECK(cudaStreamSynchronize(s1));
        for (int i = 0; i < n; ++i)
            if (got[i] != 11.0f * hx[i]) {
                std::printf("FAIL two_devices: after the cross-device wait, element %d is %f, expected %f\n",
                            i, got[i], 11.0f * hx[i]);
                return 1;
            }
        std::printf("device 1 waited for device 0's event and copied from it: ok\n");
        // Calls that name a device other than the current one: through vcuda they go to the session serving
        // that device (another server's, under a lease of two), and two devices of two servers are not peers.
        CHECK(cudaSetDevice(0));
        int can = -1, supported = -1;
        CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
        CHECK(cudaDeviceGetP2PAttribute(&supported, cudaDevP2PAttrAccessSupported, 0, 1));
        if (supported != can) {
            std::printf("FAIL two_devices: P2P access supported %d, but can access peer %d\n", supported,
                        can);
            return 1;
        }
        // Native atomics between the two: none when the attribute says so (two devices of two servers).
        int atomics = -1;
        CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, 0, 1));
        const cudaAtomicOperation ops[2] = {cudaAtomicOperationIntegerAdd, cudaAtomicOperationFloatAdd};
        unsigned caps[2] = {0xdead, 0xdead};
        CHECK(cudaDeviceGetP2PAtomicCapabilities(caps, ops, 2, 0, 1));
        if (caps[0] == 0xdead || (atomics == 0 && (caps[0] | caps[1]) != 0)) {
            std::printf("FAIL two_devices: P2P atomic capabilities %#x %#x with native atomics %d\n", caps[0],
                        caps[1], atomics);
            return 1;
        }
        cudaMemPool_t pool1, current1;
        CHECK(cudaDeviceGetDefaultMemPool(&pool1, 1));
        CHECK(cudaDeviceSetMemPool(1, pool1));
        CHECK(cudaSetDevice(1));
        CHECK(cudaDeviceGetMemPool(&current1, 1));
        if (current1 != pool1) {
            std::printf(
                "FAIL two_devices: device 1's pool, asked from device 0, is not the one device 1 has\n");
            return 1;
        }
        std::printf("device 1's pool and the P2P attribute, asked from device 0: ok\n");
        CHECK(cudaFree(z1));
        CHECK(cudaStreamDestroy(s1));
        CHECK(cudaSetDevice(0));
        CHECK(cudaFree(z0));
        CHECK(cudaEventDestroy(done0));
        CHECK(cudaStreamDestroy(s0));
    }
    for (int d = 0; d < count; ++d) {
        CHECK(cudaSetDevice(d));
        std::vector<float> out(n);
        CHECK(cudaMemcpy(out.data(), ys[d], n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i) {
            float want = float(d + 2) * hx[i] + 1.0f;
            if (out[i] != want) {
                std::printf("FAIL two_devices: device %d element %d is %f, expected %f\n", d, i, out[i],
                            want);
                return 1;
            }
        }
        std::printf("device %d: ok\n", d);
        CHECK(cudaFree(xs[d]));
        CHECK(cudaFree(ys[d]));
    }
    std::printf("PASS two_devices\n");
    return 0;
}
