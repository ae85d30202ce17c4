#include "base/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/pidfd.hpp"
#include "base/spawn.hpp"

namespace nshpc {

namespace {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kReapBound{5};  // how long a SIGKILLed program may take to go

// Waits for our child `pid` (pidfd `pidfd`) until `deadline`; then SIGKILL, and at most
// kReapBound more. Returns the wait status; `killed` says whether it had to be killed.
int reap(pid_t pid, int pidfd, Clock::time_point deadline, const std::string& name, bool& killed) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  killed = false;
  if (pidfd < 0 || !wait_pidfd(pidfd, std::max(left, std::chrono::milliseconds(0)))) {
    killed = true;
    ::kill(pid, SIGKILL);
    if (pidfd >= 0 && !wait_pidfd(pidfd, kReapBound))
      throw Error(fmt::format("{} (pid {}) did not end within {} s of SIGKILL; it is left unreaped", name, pid,
                              kReapBound.count()));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw SysError(errno, "waitpid", name);
  }
  return status;
}

}  // namespace

SigpipeBlock::SigpipeBlock() {
  sigemptyset(&pipe_);
  sigaddset(&pipe_, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
}

SigpipeBlock::~SigpipeBlock() {
  if (!sigismember(&old_, SIGPIPE)) {
    const timespec zero{0, 0};
    while (::sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

CommandResult run_command(const std::vector<std::string>& argv, const std::string& input,
                          std::chrono::milliseconds timeout, std::size_t max_output, const LineSink& on_line,
                          const ChildSetup& setup) {
  if (argv.empty() || argv[0].empty()) throw Error("run_command: no program given");
  for (const auto& [from, to] : setup.fds)
    if (to < 3) throw Error("run_command: descriptors 0-2 are the command's stdin, stdout and stderr");
  auto [in_read, in_write] = make_pipe();
  auto [out_read, out_write] = make_pipe();
  auto [err_read, err_write] = make_pipe();

  SpawnSpec spec;
  spec.program = argv[0];  // looked up in PATH when it has no slash
  spec.argv = argv;
  spec.fds = {{in_read.get(), 0}, {out_write.get(), 1}, {err_write.get(), 2}};
  spec.fds.insert(spec.fds.end(), setup.fds.begin(), setup.fds.end());
  spec.in_child = setup.in_child;
  SpawnedChild child;
  try {
    child = spawn(spec);
  } catch (const SysError& e) {
    throw e.wrapped(fmt::format("run {}", argv[0]));  // ENOENT: not installed or not in PATH
  }
  // Reaped below, by reap(), on every path that gets there; an exception before that kills it.
  const pid_t pid = child.pid();
  const int pidfd = child.pidfd();
  in_read.reset();
  out_write.reset();
  err_write.reset();

  CommandResult result;
  set_nonblocking(in_write.get());
  set_nonblocking(out_read.get());
  set_nonblocking(err_read.get());
  std::size_t written = 0;
  if (input.empty()) in_write.reset();
  const SigpipeBlock no_sigpipe;
  const auto deadline = Clock::now() + timeout;
  char buf[65536];
  std::size_t delivered[2] = {0, 0};  // bytes of result.out, result.err handed to on_line
  auto deliver = [&](int stream, bool all) {
    if (!on_line) return;
    const std::string& sink = stream == 0 ? result.out : result.err;
    std::size_t& from = delivered[stream];
    for (std::size_t nl; (nl = sink.find('\n', from)) != std::string::npos; from = nl + 1)
      on_line(std::string_view(sink).substr(from, nl - from));
    if (all && from < sink.size()) {
      on_line(std::string_view(sink).substr(from));
      from = sink.size();
    }
  };
  while (out_read || err_read) {
    pollfd fds[3];
    int n = 0;
    if (in_write) fds[n++] = {in_write.get(), POLLOUT, 0};
    if (out_read) fds[n++] = {out_read.get(), POLLIN, 0};
    if (err_read) fds[n++] = {err_read.get(), POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;  // killed below
    const int ready = ::poll(fds, n, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) {
      const int err = errno;
      bool killed = false;
      child.release();
      reap(pid, pidfd, Clock::now(), argv[0], killed);
      throw SysError(err, "poll", fmt::format("the output of {} (it was killed)", argv[0]));
    }
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      if (in_write && fds[i].fd == in_write.get()) {
        const ssize_t w = ::write(in_write.get(), input.data() + written, input.size() - written);
        if (w > 0) written += static_cast<std::size_t>(w);
        if (w < 0 && errno != EAGAIN && errno != EINTR) in_write.reset();
        else if (written >= input.size()) in_write.reset();
        continue;
      }
      UniqueFd& fd = (out_read && fds[i].fd == out_read.get()) ? out_read : err_read;
      std::string& sink = (&fd == &out_read) ? result.out : result.err;
      const ssize_t r = ::read(fd.get(), buf, sizeof buf);
      if (r > 0) {
        if (sink.size() < max_output) sink.append(buf, std::min<std::size_t>(static_cast<std::size_t>(r), max_output - sink.size()));
        deliver(&fd == &out_read ? 0 : 1, false);
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        fd.reset();
      }
    }
  }
  deliver(0, true);
  deliver(1, true);
  child.release();
  const int status = reap(pid, pidfd, deadline, argv[0], result.timed_out);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string describe_failure(const std::vector<std::string>& argv, const CommandResult& result) {
  std::string what = result.err.empty() ? result.out : result.err;
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  if (what.size() > 600) what = what.substr(0, 600) + "…";
  const std::string name = argv.empty() ? std::string("command") : argv[0];
  if (result.timed_out) return fmt::format("{} did not answer in time (killed)", name);
  return what.empty() ? fmt::format("{} exited with {}", name, result.exit_code)
                      : fmt::format("{} exited with {}: {}", name, result.exit_code, what);
}

}  // namespace nshpc
