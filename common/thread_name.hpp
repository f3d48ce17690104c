// Names the calling thread for `top -H`, /proc/PID/task/*/comm and debuggers, so an operator (or a test that
// counts a server's threads) can tell what a thread left behind is for. Linux keeps 15 characters.
#pragma once

#include <pthread.h>

namespace vcuda {

inline void name_this_thread(const char* name) { ::pthread_setname_np(::pthread_self(), name); }

}  // namespace vcuda
