// The seccomp filter every hardened sandbox runs under, built with libseccomp.
#pragma once

#include <string>

namespace nshpc::sandbox {

// Returns the classic-BPF program (struct sock_filter[]) bwrap's --seccomp expects.
// Default action: allow. EPERM for kernel-attack-surface and escape syscalls (ptrace, mount,
// namespaces, keyrings, bpf, modules, kexec, open_by_handle_at, io_uring, ...), namespace flags
// in clone, device nodes in mknod, TIOCSTI/TIOCLINUX; ENOSYS for clone3 (libc falls back to
// clone, whose flags can be checked). Syscalls of a foreign architecture are killed.
// Throws Error when libseccomp fails.
std::string build_seccomp_bpf();

// Loads the same filter into the calling process (doctor's self-test, in a child process).
void load_seccomp_filter_into_self();

}  // namespace nshpc::sandbox
