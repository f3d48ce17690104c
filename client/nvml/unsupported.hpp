// The answer of every NVML function vcuda does not implement: NVML_ERROR_NOT_SUPPORTED (an answer real NVML
// gives for many queries on many GPUs, which tools show as "N/A"), and the function's name in the log once
// (at info level: VCUDA_LOG_LEVEL=info shows what a tool asked for). Used by the generated stubs, so it
// declares no NVML type.
#pragma once

namespace vcuda::nvml {
int unsupported(const char* name) noexcept;
}
