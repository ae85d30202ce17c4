#include "sandbox/gate.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"

namespace nshpc::sandbox {

namespace {

constexpr const char* kGateFile = "exec.lock";

UniqueFd open_gate(const Target& target) {
  fs::make_dirs(target.state_dir, 0700);
  const stdfs::path path = target.state_dir / kGateFile;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw SysError(errno, "open", path.string());
  return fd;
}

// The pids holding a flock on the file of `fd` (/proc/locks: "N: FLOCK ADVISORY READ PID MAJ:MIN:INODE ...";
// lines of waiters start with "->").
std::vector<pid_t> flock_holders(int fd) {
  std::vector<pid_t> pids;
  struct stat st;
  if (::fstat(fd, &st) < 0) return pids;
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream in(line);
    std::string number, kind, advisory, access, id;
    pid_t pid = 0;
    if (!(in >> number >> kind) || kind != "FLOCK" || !(in >> advisory >> access >> pid >> id)) continue;
    unsigned major = 0, minor = 0;
    unsigned long long inode = 0;
    if (std::sscanf(id.c_str(), "%x:%x:%llu", &major, &minor, &inode) != 3) continue;
    if (inode == st.st_ino && major == ::major(st.st_dev) && minor == ::minor(st.st_dev)) pids.push_back(pid);
  }
  return pids;
}

class GatedProcess final : public Process {
 public:
  GatedProcess(std::unique_ptr<Process> inner, UniqueFd gate) : inner_(std::move(inner)), gate_(std::move(gate)) {}
  pid_t pid() const override { return inner_->pid(); }
  pid_t sandbox_pid() const override { return inner_->sandbox_pid(); }
  int pidfd() const override { return inner_->pidfd(); }
  ExitStatus wait() override { return inner_->wait(); }
  void kill() override { inner_->kill(); }
  void disown() override { inner_->disown(); }
  int terminal() const override { return inner_->terminal(); }

 private:
  std::unique_ptr<Process> inner_;  // destroyed (its tree killed when it still runs) before the gate opens
  UniqueFd gate_;
};

}  // namespace

UniqueFd enter_gate(const Target& target, std::chrono::milliseconds patience) {
  if (target.state_dir.empty()) return UniqueFd();  // no instance (doctor's smoke run): nothing to hold
  UniqueFd gate = open_gate(target);
  const auto until = std::chrono::steady_clock::now() + patience;
  for (;;) {
    if (::flock(gate.get(), LOCK_SH | LOCK_NB) == 0) return gate;
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) throw SysError(errno, "lock", (target.state_dir / kGateFile).string());
    if (std::chrono::steady_clock::now() >= until)
      throw UsageError(fmt::format("instance '{}' is being copied or reset (a snapshot, restore or factory reset is "
                                   "under way), and nothing runs in it until that is done; try again in a moment",
                                   target.instance_id));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<UniqueFd> close_gate(const Target& target, std::vector<pid_t>* holders) {
  UniqueFd gate = open_gate(target);
  while (::flock(gate.get(), LOCK_EX | LOCK_NB) < 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) throw SysError(errno, "lock", (target.state_dir / kGateFile).string());
    if (holders) *holders = flock_holders(gate.get());
    return std::nullopt;
  }
  return gate;
}

std::unique_ptr<Process> holding_gate(std::unique_ptr<Process> process, UniqueFd gate) {
  return std::make_unique<GatedProcess>(std::move(process), std::move(gate));
}

}  // namespace nshpc::sandbox
