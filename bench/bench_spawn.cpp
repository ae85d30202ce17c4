// make bench: start-up cost of one sandboxed command, side by side in one run.
//   1. bare `bwrap <hardened flags> -- true` exec'd directly (the floor)
//   2. `ns-hpc bwrap <id> -- true` as a whole process (what a user or a job pays)
// Prints median and p99 of each and the ratio. No timing assertions: figures only.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config/config.hpp"
#include "sandbox/seccomp.hpp"

namespace fs = std::filesystem;

namespace {

struct Stats {
  double median_ms, p99_ms, mean_ms;
};

// fork+execve `argv`; `fds` are (fd here, fd in child) mappings; returns wall time in ms.
double time_once(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                 const std::vector<std::pair<int, int>>& fds, uid_t uid, gid_t gid, bool drop) {
  std::vector<char*> a, e;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(null, 1);
    for (const auto& [from, to] : fds) ::dup2(from, to);
    if (drop && (::setgroups(0, nullptr) || ::setresgid(gid, gid, gid) || ::setresuid(uid, uid, uid)))
      ::_exit(126);
    ::execve(a[0], a.data(), e.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  auto end = std::chrono::steady_clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench: '%s' failed with status %d\n", argv[0].c_str(), status);
    std::exit(1);
  }
  return std::chrono::duration<double, std::milli>(end - start).count();
}

Stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  size_t p99 = std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99));
  return {v[v.size() / 2], v[p99], sum / v.size()};
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 200;
  const std::string nshpc = NSHPC_BINARY;
  char tmpl[] = "/tmp/nshpc-bench-XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  ::chmod(root.c_str(), 0755);
  const fs::path config = root / "config.toml";
  std::ofstream(config) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << (root / "instances").string() << "\"\n";
  if (std::system((nshpc + " --config " + config.string() + " instance create bench >/dev/null").c_str()) != 0) {
    std::fprintf(stderr, "bench: could not create the bench instance\n");
    return 1;
  }

  // The floor: the same hardened flags ns-hpc uses, exec'd directly with a prepared seccomp fd
  // and the instance folders passed as descriptors (as ns-hpc does).
  const bool root_user = ::geteuid() == 0;
  const fs::path ws = root / "instances/bench/workspace";
  const fs::path out = root / "instances/output/bench";
  const std::string bpf = nshpc::sandbox::build_seccomp_bpf();
  const fs::path bpf_file = root / "filter.bpf";
  std::ofstream(bpf_file, std::ios::binary) << bpf;
  std::vector<std::string> bare{"/usr/bin/bwrap", "--unshare-all", "--proc", "/proc", "--dev", "/dev",
                                "--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
                                "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
                                "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc", "/etc",
                                "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--hostname",
                                "bench", "--new-session", "--ro-bind", "/proc/sys", "/proc/sys",
                                "--die-with-parent", "--share-net", "--bind-fd", "11", "/workspace",
                                "--bind-fd", "12", "/output", "--seccomp", "10", "--chdir",
                                "/workspace", "--", "true"};
  std::vector<std::string> env{"PATH=/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8"};
  std::vector<std::string> cli{nshpc, "--config", config.string(), "bwrap", "bench", "--", "true"};
  std::vector<std::string> cli_env{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + root.string()};

  std::vector<double> bare_ms, cli_ms;
  const int ws_fd = ::open(ws.c_str(), O_PATH | O_DIRECTORY);
  const int out_fd = ::open(out.c_str(), O_PATH | O_DIRECTORY);
  for (int i = 0; i < 10; ++i) {  // warm-up
    int fd = ::open(bpf_file.c_str(), O_RDONLY);
    time_once(bare, env, {{fd, 10}, {ws_fd, 11}, {out_fd, 12}}, 65534, 65534, root_user);
    ::close(fd);
    time_once(cli, cli_env, {}, 0, 0, false);
  }
  for (int i = 0; i < runs; ++i) {  // interleaved, so both see the same machine state
    int fd = ::open(bpf_file.c_str(), O_RDONLY);
    bare_ms.push_back(time_once(bare, env, {{fd, 10}, {ws_fd, 11}, {out_fd, 12}}, 65534, 65534, root_user));
    ::close(fd);
    cli_ms.push_back(time_once(cli, cli_env, {}, 0, 0, false));
  }
  Stats b = summarize(bare_ms), c = summarize(cli_ms);
  std::printf("\nns-hpc bench: sandbox start-up, %d runs each (interleaved), %s\n\n", runs,
              root_user ? "as root (bwrap dropped to uid 65534)" : "as an unprivileged user");
  std::printf("  %-44s %10s %10s %10s\n", "", "median ms", "p99 ms", "mean ms");
  std::printf("  %-44s %10.2f %10.2f %10.2f\n", "bare hardened bwrap ... true (floor)", b.median_ms, b.p99_ms, b.mean_ms);
  std::printf("  %-44s %10.2f %10.2f %10.2f\n", "ns-hpc bwrap <id> -- true (whole CLI)", c.median_ms, c.p99_ms, c.mean_ms);
  std::printf("\n  ratio CLI / floor: median %.2fx, p99 %.2fx   (target: <= 1.5x)\n\n", c.median_ms / b.median_ms,
              c.p99_ms / b.p99_ms);
  std::system(("rm -rf '" + root.string() + "'").c_str());
  return 0;
}
