// The answer of every driver function vcuda does not implement: CUDA_ERROR_NOT_SUPPORTED, and the
// function's name in the log once, so a failing program says what it needed.
#pragma once

namespace vcuda::client {
int unsupported(const char* name) noexcept;
}
