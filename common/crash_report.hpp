// A last word from a process that dies of a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT): the
// signal, the faulting address and a raw backtrace go to stderr (the log), then the signal is raised again
// with its default action, so the exit status and any core dump stay as they were. Stripped binaries print
// module+offset frames; `addr2line -e BINARY OFFSET` against the unstripped build names them.
#pragma once

namespace vcuda {

// Installs the handlers once per process (later calls do nothing); `program` names the process in the report.
void install_crash_report(const char* program);

}  // namespace vcuda
