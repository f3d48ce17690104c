// async_copies: cudaMemcpyAsync in both directions on several streams, pipelined in chunks, with every
// result checked in stream order: the bytes of a device-to-host async copy must be in the host buffer by the
// time a call that synchronizes with that stream returns (stream sync, event sync, a successful stream query,
// device sync) — and not a stream earlier.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.cuh"

extern "C" __global__ void ac_transform(int* d, int n, int salt) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = static_cast<int>(static_cast<unsigned>(d[i]) * 3u + static_cast<unsigned>(salt));
}

static int want_value(int input, int salt) {
    return static_cast<int>(static_cast<unsigned>(input) * 3u + static_cast<unsigned>(salt));
}

// `async_copies pinned-after-pageable MIB`: a large pageable round trip, then MIB of pinned memory, used. Run
// under a small host memory quota, the pinned allocation must not fail for what vcuda's pageable copies took.
static int pinned_after_pageable(size_t mib) {
    const size_t n = size_t(1) << 20;  // ints: 4 MiB
    std::vector<int> in(n), out(n);
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<int>(i * 7);
    int* d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMemcpy(d, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(out.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    if (out != in) fail("pageable round trip: the bytes came back different");
    int* pinned;
    CHECK(cudaMallocHost(&pinned, mib << 20));
    const size_t m = std::min(n, (mib << 20) / sizeof(int));
    for (size_t i = 0; i < m; ++i) pinned[i] = static_cast<int>(i) - 5;
    CHECK(cudaMemcpy(d, pinned, m * sizeof(int), cudaMemcpyHostToDevice));
    std::fill(out.begin(), out.end(), 0);
    CHECK(cudaMemcpy(out.data(), d, m * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < m; ++i)
        if (out[i] != static_cast<int>(i) - 5)
            fail("through %zu MiB of pinned memory: [%zu] = %d", mib, i, out[i]);
    printf("pageable round trip, then %zu MiB of pinned memory: ok\n", mib);
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(d));
    return pass();
}

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "pinned-after-pageable")
        return pinned_after_pageable(std::stoul(argv[2]));
    const int nstreams = 4, nchunks = 16;
    const int chunk = 1 << 18;  // ints per chunk (1 MiB)
    const int n = nchunks * chunk;
    const size_t bytes = size_t(n) * sizeof(int);

    int *hin, *hout;
    CHECK(cudaMallocHost(&hin, bytes));
    CHECK(cudaMallocHost(&hout, bytes));
    for (int i = 0; i < n; ++i) hin[i] = i ^ 0x5a5a5a;
    memset(hout, 0xee, bytes);
    int* d;
    CHECK(cudaMalloc(&d, bytes));

    cudaStream_t st[nstreams];
    for (auto& s : st) CHECK(cudaStreamCreate(&s));

    // Pipeline: chunk c on stream c % 4: copy in, transform, copy out.
    for (int c = 0; c < nchunks; ++c) {
        cudaStream_t s = st[c % nstreams];
        size_t off = size_t(c) * chunk;
        CHECK(cudaMemcpyAsync(d + off, hin + off, chunk * sizeof(int), cudaMemcpyHostToDevice, s));
        ac_transform<<<chunk / 256, 256, 0, s>>>(d + off, chunk, c);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(hout + off, d + off, chunk * sizeof(int), cudaMemcpyDeviceToHost, s));
    }
    // Check each stream's chunks right after synchronizing that stream alone.
    for (int k = 0; k < nstreams; ++k) {
        CHECK(cudaStreamSynchronize(st[k]));
        for (int c = k; c < nchunks; c += nstreams) {
            size_t off = size_t(c) * chunk;
            for (int i = 0; i < chunk; ++i)
                if (hout[off + i] != want_value(hin[off + i], c))
                    fail(
                        "stream %d chunk %d: hout[%zu] = %d, expected %d (async copy not complete after "
                        "cudaStreamSynchronize?)",
                        k, c, off + i, hout[off + i], want_value(hin[off + i], c));
        }
        printf("stream %d: %d chunks correct after cudaStreamSynchronize\n", k, nchunks / nstreams);
    }

    // Event synchronization: DtoH, record, cudaEventSynchronize, check.
    {
        cudaEvent_t ev;
        CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        memset(hout, 0, bytes);
        ac_transform<<<n / 256, 256, 0, st[1]>>>(d, n, 1000);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(hout, d, bytes, cudaMemcpyDeviceToHost, st[1]));
        CHECK(cudaEventRecord(ev, st[1]));
        CHECK(cudaEventSynchronize(ev));
        for (int i = 0; i < n; ++i) {
            int want = want_value(want_value(hin[i], i / chunk), 1000);
            if (hout[i] != want)
                fail("after cudaEventSynchronize: hout[%d] = %d, expected %d", i, hout[i], want);
        }
        printf("DtoH then cudaEventSynchronize: ok\n");
        CHECK(cudaEventDestroy(ev));
    }

    // Polling: cudaStreamQuery until cudaSuccess, then the bytes must be there.
    {
        memset(hout, 0, bytes);
        ac_transform<<<n / 256, 256, 0, st[2]>>>(d, n, 7);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(hout, d, bytes, cudaMemcpyDeviceToHost, st[2]));
        cudaError_t q;
        long polls = 0;
        while ((q = cudaStreamQuery(st[2])) == cudaErrorNotReady) ++polls;
        EXPECT(q == cudaSuccess, "cudaStreamQuery returned %s", cudaGetErrorName(q));
        printf("info: %ld polls\n", polls);
        for (int i = 0; i < n; ++i) {
            int want = want_value(want_value(want_value(hin[i], i / chunk), 1000), 7);
            if (hout[i] != want)
                fail("after cudaStreamQuery == cudaSuccess: hout[%d] = %d, expected %d", i, hout[i], want);
        }
        printf("DtoH then cudaStreamQuery polling: ok\n");
    }

    // Device synchronization covers every stream: one small DtoH per stream into separate pinned slices.
    {
        memset(hout, 0, bytes);
        for (int k = 0; k < nstreams; ++k) {
            size_t off = size_t(k) * chunk;
            CHECK(cudaMemcpyAsync(hout + off, d + off, chunk * sizeof(int), cudaMemcpyDeviceToHost, st[k]));
        }
        CHECK(cudaDeviceSynchronize());
        for (int k = 0; k < nstreams; ++k) {
            size_t off = size_t(k) * chunk;
            for (int i = 0; i < chunk; ++i) {
                int want = want_value(want_value(want_value(hin[off + i], k), 1000), 7);
                if (hout[off + i] != want) fail("after cudaDeviceSynchronize: stream %d element %d", k, i);
            }
        }
        printf("DtoH on %d streams then cudaDeviceSynchronize: ok\n", nstreams);
    }

    // Pageable host memory with the async API, and a round trip through a second device buffer in one stream.
    {
        std::vector<int> page_in(chunk), page_out(chunk, 0);
        for (int i = 0; i < chunk; ++i) page_in[i] = i * 7 - 3;
        int* d2;
        CHECK(cudaMalloc(&d2, chunk * sizeof(int)));
        CHECK(cudaMemcpyAsync(d2, page_in.data(), chunk * sizeof(int), cudaMemcpyHostToDevice, st[3]));
        ac_transform<<<chunk / 256, 256, 0, st[3]>>>(d2, chunk, -5);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(d, d2, chunk * sizeof(int), cudaMemcpyDeviceToDevice, st[3]));
        ac_transform<<<chunk / 256, 256, 0, st[3]>>>(d, chunk, 11);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(page_out.data(), d, chunk * sizeof(int), cudaMemcpyDeviceToHost, st[3]));
        CHECK(cudaStreamSynchronize(st[3]));
        for (int i = 0; i < chunk; ++i) {
            int want = want_value(want_value(page_in[i], -5), 11);
            if (page_out[i] != want)
                fail("pageable round trip: [%d] = %d, expected %d", i, page_out[i], want);
        }
        printf("pageable async round trip: ok\n");
        CHECK(cudaFree(d2));
    }

    // Large pageable copies (vcuda stages them through pinned slots it shares with a server on the same
    // host): sizes around the slot size, a source overwritten as soon as the copy returns (the bytes were
    // taken by then), copies ordered after kernels on a stream, and three threads copying at once.
    {
        const size_t sizes[] = {size_t(1) << 18, (size_t(1) << 20) + 1, (size_t(13) << 18) + 3};  // ints
        std::vector<int> page_in(n), page_out(n);
        for (size_t count : sizes) {
            for (size_t i = 0; i < count; ++i) page_in[i] = static_cast<int>(i * 2654435761u);
            CHECK(cudaMemcpy(d, page_in.data(), count * sizeof(int), cudaMemcpyHostToDevice));
            std::vector<int> sent(page_in.begin(), page_in.begin() + count);
            std::fill(page_in.begin(), page_in.begin() + count, -1);
            ac_transform<<<(count + 255) / 256, 256>>>(d, static_cast<int>(count), 21);
            CHECK_LAUNCH();
            std::fill(page_out.begin(), page_out.end(), 0);
            CHECK(cudaMemcpy(page_out.data(), d, count * sizeof(int), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < count; ++i)
                if (page_out[i] != want_value(sent[i], 21))
                    fail("pageable copy of %zu ints: [%zu] = %d, expected %d", count, i, page_out[i],
                         want_value(sent[i], 21));
            if (page_out[count] != 0) fail("pageable copy of %zu ints wrote past its end", count);
            printf("pageable copies of %zu bytes each way: ok\n", count * sizeof(int));
        }
        // Asynchronous, on a stream, behind and before kernels.
        const size_t count = sizes[1];
        for (size_t i = 0; i < count; ++i) page_in[i] = static_cast<int>(i) - 77;
        CHECK(cudaMemcpyAsync(d, page_in.data(), count * sizeof(int), cudaMemcpyHostToDevice, st[1]));
        std::fill(page_in.begin(), page_in.begin() + count, 5);
        ac_transform<<<(count + 255) / 256, 256, 0, st[1]>>>(d, static_cast<int>(count), 3);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(d + count, page_in.data(), count * sizeof(int), cudaMemcpyHostToDevice, st[1]));
        CHECK(cudaMemcpyAsync(page_out.data(), d, 2 * count * sizeof(int), cudaMemcpyDeviceToHost, st[1]));
        CHECK(cudaStreamSynchronize(st[1]));
        for (size_t i = 0; i < 2 * count; ++i) {
            int want = i < count ? want_value(static_cast<int>(i) - 77, 3) : 5;
            if (page_out[i] != want)
                fail("async pageable copies on a stream: [%zu] = %d, expected %d", i, page_out[i], want);
        }
        printf("async pageable copies on a stream, around a kernel: ok\n");
        // Three threads, each on its own stream and its own part of d.
        const size_t part = n / 3;
        std::vector<std::thread> threads;
        std::vector<std::string> errors(3);
        for (int t = 0; t < 3; ++t)
            threads.emplace_back([&, t] {
                std::vector<int> in(part), out(part);
                int* dp = d + t * part;
                for (int round = 0; round < 3; ++round) {
                    for (size_t i = 0; i < part; ++i) in[i] = static_cast<int>(i * 31 + t * 1000 + round);
                    if (cudaMemcpyAsync(dp, in.data(), part * sizeof(int), cudaMemcpyHostToDevice, st[t]) !=
                            cudaSuccess ||
                        cudaMemcpyAsync(out.data(), dp, part * sizeof(int), cudaMemcpyDeviceToHost, st[t]) !=
                            cudaSuccess ||
                        cudaStreamSynchronize(st[t]) != cudaSuccess) {
                        errors[t] = "a copy failed";
                        return;
                    }
                    if (out != in) {
                        errors[t] = "round " + std::to_string(round) + ": the bytes came back different";
                        return;
                    }
                }
            });
        for (auto& th : threads) th.join();
        for (int t = 0; t < 3; ++t)
            if (!errors[t].empty()) fail("pageable copies from thread %d: %s", t, errors[t].c_str());
        printf("pageable copies from 3 threads at once: ok\n");
    }

    // Many small async copies back to back (batched by vcuda), each into its own slot.
    {
        const int small = 4096;
        for (int i = 0; i < small; ++i) hin[i] = i * 13;
        CHECK(cudaMemcpyAsync(d, hin, small * sizeof(int), cudaMemcpyHostToDevice, st[0]));
        memset(hout, 0, small * sizeof(int));
        for (int i = 0; i < small; ++i)
            CHECK(cudaMemcpyAsync(hout + (small - 1 - i), d + i, sizeof(int), cudaMemcpyDeviceToHost, st[0]));
        CHECK(cudaStreamSynchronize(st[0]));
        for (int i = 0; i < small; ++i)
            EXPECT(hout[small - 1 - i] == i * 13, "small copy %d: %d", i, hout[small - 1 - i]);
        printf("%d four-byte async copies: ok\n", small);
    }

    for (auto& s : st) CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(hin));
    CHECK(cudaFreeHost(hout));
    return pass();
}
