// The answer of every driver function vcuda does not implement: CUDA_ERROR_NOT_SUPPORTED, and the
// function's name in the log once, so a failing program says what it needed. Also the same for a case of an
// implemented function that vcuda cannot serve and answers with another error (`refused`).
#pragma once

namespace vcuda::client {
int unsupported(const char* name) noexcept;
// Logs `what` once (a warning naming the case and the result `name`) and returns `result`.
int refused(const char* what, int result, const char* name) noexcept;
}  // namespace vcuda::client
