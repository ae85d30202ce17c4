#include "sandbox/seccomp.hpp"

#include <fcntl.h>
#include <linux/sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"

namespace nshpc::sandbox {

namespace {

using Filter = std::unique_ptr<void, void (*)(scmp_filter_ctx)>;

constexpr const char* kDenied[] = {
    "ptrace",          "process_vm_readv",  "process_vm_writev", "kcmp",
    "keyctl",          "add_key",           "request_key",       "unshare",
    "setns",           "mount",             "umount",            "umount2",
    "pivot_root",      "chroot",            "fsopen",            "fsconfig",
    "fsmount",         "fspick",            "move_mount",        "open_tree",
    "mount_setattr",   "bpf",               "perf_event_open",   "userfaultfd",
    "kexec_load",      "kexec_file_load",   "init_module",       "finit_module",
    "delete_module",   "open_by_handle_at", "name_to_handle_at", "swapon",
    "swapoff",         "reboot",            "acct",              "quotactl",
    "quotactl_fd",     "syslog",            "iopl",              "ioperm",
    "vmsplice",        "lookup_dcookie",    "uselib",            "nfsservctl",
    "io_uring_setup",  "io_uring_enter",    "io_uring_register", "fanotify_init",
    "settimeofday",    "clock_settime",     "clock_adjtime",     "adjtimex",
    "sethostname",     "setdomainname",     "vhangup",           "pidfd_getfd",
};

constexpr unsigned long kNamespaceFlags[] = {CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,
                                             CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
                                             CLONE_NEWCGROUP};

void add(scmp_filter_ctx ctx, uint32_t action, const char* name, unsigned count = 0,
         const scmp_arg_cmp* args = nullptr) {
  int nr = seccomp_syscall_resolve_name(name);
  if (nr == __NR_SCMP_ERROR) return;  // not on this architecture
  int rc = seccomp_rule_add_array(ctx, action, nr, count, args);
  if (rc < 0) throw SysError(-rc, "seccomp rule for", name);
}

Filter build_filter() {
  Filter ctx(seccomp_init(SCMP_ACT_ALLOW), seccomp_release);
  if (!ctx) throw Error("libseccomp: seccomp_init failed; is libseccomp2 installed?");
  const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
  for (const char* name : kDenied) add(ctx.get(), eperm, name);

  for (unsigned long flag : kNamespaceFlags) {
    scmp_arg_cmp cmp = SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag);
    add(ctx.get(), eperm, "clone", 1, &cmp);
  }
  add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), "clone3");

  // Device nodes: block character and block devices, keep FIFOs, sockets and regular files.
  for (unsigned type : {static_cast<unsigned>(S_IFCHR), static_cast<unsigned>(S_IFBLK)}) {
    scmp_arg_cmp mknod = SCMP_A1(SCMP_CMP_MASKED_EQ, S_IFMT, type);
    add(ctx.get(), eperm, "mknod", 1, &mknod);
    scmp_arg_cmp mknodat = SCMP_A2(SCMP_CMP_MASKED_EQ, S_IFMT, type);
    add(ctx.get(), eperm, "mknodat", 1, &mknodat);
  }
  // Terminal injection into whatever terminal the sandbox can reach.
  for (unsigned long request : {static_cast<unsigned long>(TIOCSTI), static_cast<unsigned long>(TIOCLINUX)}) {
    scmp_arg_cmp cmp = SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, request);
    add(ctx.get(), eperm, "ioctl", 1, &cmp);
  }
  return ctx;
}

}  // namespace

std::string build_seccomp_bpf() {
  Filter ctx = build_filter();
  UniqueFd mem(::memfd_create("ns-hpc-seccomp", MFD_CLOEXEC));
  if (!mem) throw SysError(errno, "memfd_create");
  int rc = seccomp_export_bpf(ctx.get(), mem.get());
  if (rc < 0) throw SysError(-rc, "seccomp_export_bpf");
  auto bpf = fs::read_file(fmt::format("/proc/self/fd/{}", mem.get()));
  if (!bpf || bpf->empty()) throw Error("seccomp filter export produced no program");
  return *bpf;
}

void load_seccomp_filter_into_self() {
  Filter ctx = build_filter();
  int rc = seccomp_load(ctx.get());
  if (rc < 0) throw SysError(-rc, "seccomp_load");
}

}  // namespace nshpc::sandbox
