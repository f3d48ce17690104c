// ipc_handles: legacy CUDA IPC between two processes as the CUDA sample simpleIPC uses it. The parent fills a
// buffer, takes an IPC handle of it (twice: the same handle) and of an interprocess event, and starts a child
// (this program again) that gets the handles through a pipe. The child opens both (the memory twice: the same
// address), checks the parent's bytes, runs a kernel over the memory and records the event in its stream,
// then says so; the parent makes its stream wait for the event and reads the child's result back. Each side
// checks what it sees; the child's findings come back through the pipe and the parent prints them. Also: a
// process cannot open its own handle; an event without cudaEventInterprocess has no handle.
//
// `ipc_handles expect-refusal`: the child must be refused the memory handle (vcuda's tests run it so with the
// child in another tenant or on another server: IPC_CHILD_ENV=NAME=VALUE,... is added to the child's
// environment); it passes when the refusal is what happened.
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "common.cuh"

extern char** environ;

extern "C" __global__ void ipc_fill(int* p, int n, int add) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * 2 + add;
}

static const int n = 1 << 20;

struct handles {
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t event;
};

static bool read_all(int fd, void* p, size_t len) {
    auto* b = static_cast<char*>(p);
    while (len > 0) {
        ssize_t k = read(fd, b, len);
        if (k <= 0) return false;
        b += k;
        len -= size_t(k);
    }
    return true;
}

static bool write_all(int fd, const void* p, size_t len) {
    const auto* b = static_cast<const char*>(p);
    while (len > 0) {
        ssize_t k = write(fd, b, len);
        if (k <= 0) return false;
        b += k;
        len -= size_t(k);
    }
    return true;
}

// The child: handles on fd 0, its findings (lines, then "." at the end) on fd 1; the parent's go-ahead to
// close on fd 0 after it has read the result.
static int child(bool expect_refusal) {
    handles h{};
    if (!read_all(0, &h, sizeof h)) return 2;
    std::string out;
    auto say = [&](const std::string& line) { out += line + "\n"; };
    void* p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h.mem, cudaIpcMemLazyEnablePeerAccess);
    if (expect_refusal) {
        say(e != cudaSuccess ? "child: the memory handle was refused" : "child: the memory handle opened");
        say(".");
        write_all(1, out.data(), out.size());
        return e != cudaSuccess ? 0 : 1;
    }
    if (e != cudaSuccess) {
        say(std::string("child: cudaIpcOpenMemHandle failed: ") + cudaGetErrorName(e));
        say(".");
        write_all(1, out.data(), out.size());
        return 1;
    }
    void* again = nullptr;
    e = cudaIpcOpenMemHandle(&again, h.mem, cudaIpcMemLazyEnablePeerAccess);
    say(e == cudaSuccess && again == p ? "child: opening the handle again gives the same address"
                                       : std::string("child: opening again: ") + cudaGetErrorName(e));
    cudaEvent_t ev;
    e = cudaIpcOpenEventHandle(&ev, h.event);
    if (e != cudaSuccess) {
        say(std::string("child: cudaIpcOpenEventHandle failed: ") + cudaGetErrorName(e));
        say(".");
        write_all(1, out.data(), out.size());
        return 1;
    }
    std::vector<int> seen(n);
    CHECK(cudaMemcpy(seen.data(), p, n * sizeof(int), cudaMemcpyDeviceToHost));
    bool same = true;
    for (int i = 0; i < n; ++i) same = same && seen[i] == i % 977;
    say(same ? "child: the parent's bytes are there" : "child: the parent's bytes differ");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ipc_fill<<<(n + 255) / 256, 256, 0, s>>>(static_cast<int*>(p), n, 5);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(ev, s));
    say("child: kernel launched, event recorded");
    say(".");
    if (!write_all(1, out.data(), out.size())) return 2;
    char go = 0;
    if (!read_all(0, &go, 1)) return 2;  // the parent has read the result
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaIpcCloseMemHandle(again));
    CHECK(cudaIpcCloseMemHandle(p));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(s));
    return 0;
}

// The child's environment: ours, with IPC_CHILD_ENV's NAME=VALUE pairs in place of ours.
static std::vector<std::string> child_env() {
    std::vector<std::string> env;
    std::vector<std::string> extra;
    if (const char* x = getenv("IPC_CHILD_ENV")) {
        std::string all = x;
        for (size_t pos = 0; pos <= all.size();) {
            size_t comma = all.find(',', pos);
            std::string item = all.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
            if (!item.empty()) extra.push_back(item);
            pos = comma == std::string::npos ? all.size() + 1 : comma + 1;
        }
    }
    for (char** e = environ; *e; ++e) {
        std::string kv = *e;
        bool replaced = false;
        for (auto& x : extra)
            replaced = replaced || kv.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0;
        if (!replaced) env.push_back(kv);
    }
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
}

int main(int argc, char** argv) {
    bool expect_refusal = false;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "child") == 0)
            return child(argc > i + 1 && std::strcmp(argv[i + 1], "expect-refusal") == 0);
        if (std::strcmp(argv[i], "expect-refusal") == 0) expect_refusal = true;
    }

    std::vector<int> h(n);
    for (int i = 0; i < n; ++i) h[i] = i % 977;
    int* d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    handles hs{};
    CHECK(cudaIpcGetMemHandle(&hs.mem, d));
    cudaIpcMemHandle_t twice{};
    CHECK(cudaIpcGetMemHandle(&twice, d));
    EXPECT(std::memcmp(&twice, &hs.mem, sizeof twice) == 0, "two handles of one allocation differ");
    printf("IPC handle of a %zu-byte allocation; asked again, the same\n", n * sizeof(int));
    void* own = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&own, hs.mem, cudaIpcMemLazyEnablePeerAccess);
    EXPECT(e != cudaSuccess, "this process opened its own IPC handle");
    cudaGetLastError();
    printf("opening our own handle: %s\n", cudaGetErrorName(e));

    cudaEvent_t plain, ev;
    CHECK(cudaEventCreate(&plain));
    cudaIpcEventHandle_t none{};
    e = cudaIpcGetEventHandle(&none, plain);
    EXPECT(e != cudaSuccess, "an event without cudaEventInterprocess got an IPC handle");
    cudaGetLastError();
    printf("an event without cudaEventInterprocess has no IPC handle\n");
    CHECK(cudaEventCreate(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    CHECK(cudaIpcGetEventHandle(&hs.event, ev));

    int to_child[2], from_child[2];
    EXPECT(pipe(to_child) == 0 && pipe(from_child) == 0, "no pipes");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]})
        posix_spawn_file_actions_addclose(&fa, fd);
    auto env = child_env();
    std::vector<char*> envp;
    for (auto& x : env) envp.push_back(x.data());
    envp.push_back(nullptr);
    char self[] = "/proc/self/exe", child_arg[] = "child", refusal_arg[] = "expect-refusal";
    char* args[] = {argv[0], child_arg, expect_refusal ? refusal_arg : nullptr, nullptr};
    pid_t pid = -1;
    EXPECT(posix_spawn(&pid, self, &fa, nullptr, args, envp.data()) == 0, "cannot start the child");
    posix_spawn_file_actions_destroy(&fa);
    close(to_child[0]);
    close(from_child[1]);
    EXPECT(write_all(to_child[1], &hs, sizeof hs), "cannot send the handles");

    // The child's findings, up to its "." line.
    std::string got;
    char c;
    while (got.size() < 2 || got.compare(got.size() - 2, 2, ".\n") != 0) {
        if (read(from_child[0], &c, 1) != 1) break;
        got += c;
    }
    std::string lines = got.size() >= 2 ? got.substr(0, got.size() - 2) : got;
    printf("%s", lines.c_str());

    if (expect_refusal) {
        close(to_child[1]);
        int status = 0;
        waitpid(pid, &status, 0);
        EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child was not refused");
        return pass();
    }

    // Wait for the child's kernel through the event, then read its result.
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamWaitEvent(s, ev, 0));
    std::vector<int> back(n);
    CHECK(cudaMemcpyAsync(back.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaEventSynchronize(ev));
    for (int i = 0; i < n; ++i)
        EXPECT(back[i] == h[i] * 2 + 5, "element %d = %d after the child's kernel", i, back[i]);
    printf("the child's kernel result, waited for through the IPC event: ok\n");
    EXPECT(write_all(to_child[1], "g", 1), "cannot tell the child to go on");
    close(to_child[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);
    printf("the child closed its handles and ended\n");

    // The memory is still ours to use and free.
    CHECK(cudaMemcpy(back.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(back[7] == h[7] * 2 + 5, "the memory changed after the child ended");
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaEventDestroy(plain));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    return pass();
}
