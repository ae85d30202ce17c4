#include "files/broker.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/text.hpp"

namespace nshpc::files {

namespace {

constexpr int kSocketFd = 3;
constexpr std::size_t kMaxName = 4096;  // PATH_MAX: a relative path or a link's target
constexpr std::size_t kMaxFds = 2;

struct RequestHeader {
  std::uint32_t op;
  std::uint32_t flags;
  std::uint32_t mode;
  std::uint32_t resolve;
  std::uint32_t name_len;
  std::uint32_t name2_len;
};

struct ReplyHeader {
  std::int32_t error;
  std::uint64_t bytes;  // Op::usage
  std::uint64_t files;
  std::uint64_t folders;
  std::uint64_t skipped;
};

constexpr std::size_t kMaxRequest = sizeof(RequestHeader) + 2 * kMaxName;

// sendmsg of `data` with up to kMaxFds descriptors (SCM_RIGHTS). Returns 0 or the errno.
int send_with_fds(int sock, const void* data, std::size_t len, const int* fds, std::size_t nfds) {
  iovec iov{const_cast<void*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * nfds);
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno;
  return static_cast<std::size_t>(n) == len ? 0 : EMSGSIZE;
}

// recvmsg into `buffer`; the descriptors that came with it go to `fds` (close-on-exec). Returns
// the length, 0 at the end, or -errno.
ssize_t receive_with_fds(int sock, char* buffer, std::size_t size, std::vector<UniqueFd>& fds) {
  iovec iov{buffer, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.emplace_back(fd);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return -EMSGSIZE;
  return n;
}

// A name in a folder: one component, never a path.
bool is_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

// One request, done: the errno (0) and the descriptor it opened, if any; a count in `usage`.
std::pair<int, UniqueFd> serve(const RequestHeader& h, std::string_view name, std::string_view name2,
                               const std::vector<UniqueFd>& fds, fs::TreeUsage& usage) {
  const auto op = static_cast<Broker::Op>(h.op);
  const std::size_t wanted = op == Broker::Op::rename || op == Broker::Op::chown_like ? 2 : 1;
  if (fds.size() != wanted) return {EBADF, UniqueFd()};
  const int dir = fds[0].get();
  const std::string n(name);
  auto result = [](int rc) { return std::pair<int, UniqueFd>{rc < 0 ? errno : 0, UniqueFd()}; };
  switch (op) {
    case Broker::Op::open: {
      if (h.resolve > static_cast<std::uint32_t>(fs::Resolve::in_root_follow)) return {EINVAL, UniqueFd()};
      try {
        return {0, fs::open_beneath(dir, name, static_cast<int>(h.flags), h.mode, static_cast<fs::Resolve>(h.resolve))};
      } catch (const SysError& e) {
        return {e.code(), UniqueFd()};
      }
    }
    case Broker::Op::mkdir:
      if (!is_name(name)) return {EINVAL, UniqueFd()};
      return result(::mkdirat(dir, n.c_str(), h.mode));
    case Broker::Op::unlink:
      if (!is_name(name) || (h.flags & ~static_cast<std::uint32_t>(AT_REMOVEDIR)) != 0) return {EINVAL, UniqueFd()};
      return result(::unlinkat(dir, n.c_str(), static_cast<int>(h.flags)));
    case Broker::Op::rename: {
      if (!is_name(name) || !is_name(name2)) return {EINVAL, UniqueFd()};
      const std::string n2(name2);
      return result(::renameat2(dir, n.c_str(), fds[1].get(), n2.c_str(), h.flags & (RENAME_NOREPLACE | RENAME_EXCHANGE)));
    }
    case Broker::Op::symlink: {
      if (!is_name(name2) || name.empty() || name.find('\0') != std::string_view::npos) return {EINVAL, UniqueFd()};
      const std::string n2(name2);
      return result(::symlinkat(n.c_str(), dir, n2.c_str()));
    }
    case Broker::Op::chmod: return result(::fchmod(dir, h.mode & 07777));
    case Broker::Op::chown_like: {
      struct stat st;
      if (::fstat(fds[1].get(), &st) < 0) return result(-1);
      return result(::fchown(dir, st.st_uid, st.st_gid));
    }
    case Broker::Op::usage: {
      UniqueFd folder(::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!folder) return result(-1);
      try {
        usage = fs::tree_usage_at(folder.get(), ".");
        return {0, UniqueFd()};
      } catch (const SysError& e) {
        return {e.code(), UniqueFd()};
      }
    }
    case Broker::Op::remove_tree:
      if (!is_name(name)) return {EINVAL, UniqueFd()};
      try {
        fs::remove_tree_at(dir, n, n);
        return {0, UniqueFd()};
      } catch (const SysError& e) {
        return {e.code(), UniqueFd()};
      }
  }
  return {ENOSYS, UniqueFd()};
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Broker::Broker(std::vector<std::string> argv) : argv_(std::move(argv)) {}

Broker::~Broker() {
  socket_.reset();  // the broker ends at the end of its socket; child_ reaps (or kills) it
}

void Broker::start() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) throw SysError(errno, "socketpair");
  UniqueFd ours(pair[0]), theirs(pair[1]);
  Pipe err = make_pipe();
  SpawnSpec spec;
  spec.program = argv_.front();
  spec.argv = argv_;
  spec.fds = {{theirs.get(), kSocketFd}, {err.write.get(), STDERR_FILENO}};
  spec.die_with_parent = SIGKILL;
  child_ = spawn(spec);
  socket_ = std::move(ours);
  stderr_ = std::move(err.read);
}

Broker::Reply Broker::call(Op op, std::initializer_list<int> fds, std::uint32_t flags, std::uint32_t mode,
                           std::uint32_t resolve, std::string_view name, std::string_view name2) {
  std::lock_guard lock(mutex_);
  if (name.size() > kMaxName || name2.size() > kMaxName) return {ENAMETOOLONG, UniqueFd()};
  if (failed_.empty() && !socket_) {
    try {
      start();
    } catch (const SysError& e) {
      failed_ = e.what();
    }
  }
  if (failed_.empty()) {
    std::string message(sizeof(RequestHeader), '\0');
    const RequestHeader h{static_cast<std::uint32_t>(op), flags, mode, resolve, static_cast<std::uint32_t>(name.size()),
                          static_cast<std::uint32_t>(name2.size())};
    std::memcpy(message.data(), &h, sizeof h);
    message.append(name).append(name2);
    const std::vector<int> passed(fds);
    int err = send_with_fds(socket_.get(), message.data(), message.size(), passed.data(), passed.size());
    if (err == 0) {
      ReplyHeader reply{};
      std::vector<UniqueFd> got;
      const ssize_t n = receive_with_fds(socket_.get(), reinterpret_cast<char*>(&reply), sizeof reply, got);
      if (n == static_cast<ssize_t>(sizeof reply))
        return {reply.error, got.empty() ? UniqueFd() : std::move(got.front()),
                fs::TreeUsage{reply.bytes, reply.files, reply.folders, reply.skipped}};
      err = n < 0 ? static_cast<int>(-n) : EPIPE;
    }
    // The broker is gone, or never came up: what it said on its way out.
    socket_.reset();
    std::string said;
    pollfd p{stderr_.get(), POLLIN, 0};
    if (stderr_ && ::poll(&p, 1, 2000) > 0) {
      char buffer[2048];
      const ssize_t got = ::read(stderr_.get(), buffer, sizeof buffer);
      if (got > 0) said = text::truncate_utf8(std::string(buffer, static_cast<std::size_t>(got)), 600);
    }
    while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
    failed_ = fmt::format("{} ({}){}", std::strerror(err), fmt::join(argv_, " "), said.empty() ? "" : ": " + said);
  }
  throw SysError(EACCES, "reach",
                 fmt::format("the instance's files through its user namespace: the helper that does it as root "
                             "there did not work: {}",
                             failed_));
}

UniqueFd Broker::open_beneath(int dir_fd, std::string_view relative, int flags, mode_t mode, fs::Resolve how,
                              std::string_view shown) {
  Reply r = call(Op::open, {dir_fd}, static_cast<std::uint32_t>(flags), mode, static_cast<std::uint32_t>(how), relative);
  if (r.error != 0) throw SysError(r.error, "open", std::string(shown.empty() ? relative : shown));
  if (!r.fd) throw SysError(EPROTO, "open", std::string(shown.empty() ? relative : shown) + " (the helper sent no descriptor)");
  return std::move(r.fd);
}

int Broker::mkdirat(int dir_fd, const std::string& name, mode_t mode) {
  return call(Op::mkdir, {dir_fd}, 0, mode, 0, name).error;
}

int Broker::unlinkat(int dir_fd, const std::string& name, int flags) {
  return call(Op::unlink, {dir_fd}, static_cast<std::uint32_t>(flags), 0, 0, name).error;
}

int Broker::renameat2(int from_dir, const std::string& from, int to_dir, const std::string& to, unsigned flags) {
  return call(Op::rename, {from_dir, to_dir}, flags, 0, 0, from, to).error;
}

int Broker::symlinkat(const std::string& target, int dir_fd, const std::string& name) {
  return call(Op::symlink, {dir_fd}, 0, 0, 0, target, name).error;
}

int Broker::fchmod(int fd, mode_t mode) { return call(Op::chmod, {fd}, 0, mode, 0, {}).error; }

fs::TreeUsage Broker::tree_usage(int dir_fd, std::string_view shown) {
  Reply r = call(Op::usage, {dir_fd}, 0, 0, 0, {});
  if (r.error != 0) throw SysError(r.error, "measure", std::string(shown));
  return r.usage;
}

int Broker::fchown_like(int fd, int like) { return call(Op::chown_like, {fd, like}, 0, 0, 0, {}).error; }

int Broker::remove_tree_at(int dir_fd, const std::string& name) {
  return call(Op::remove_tree, {dir_fd}, 0, 0, 0, name).error;
}

// ---------------------------------------------------------------------------------------------

int broker_main(int /*argc*/, char** /*argv*/) {
  // Nothing may attach to it or read its memory; it ends with the server.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  int type = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(kSocketFd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET) {
    fmt::print(stderr, "ns-hpc {}: descriptor 3 is not the server's socket; this command is started by ns-hpc only\n",
               kBrokerCommand);
    return 2;
  }
  std::vector<char> buffer(kMaxRequest);
  for (;;) {
    std::vector<UniqueFd> fds;
    const ssize_t n = receive_with_fds(kSocketFd, buffer.data(), buffer.size(), fds);
    if (n == 0) return 0;  // the server closed it
    if (n < 0 && n != -EMSGSIZE) return 1;
    std::pair<int, UniqueFd> done{EMSGSIZE, UniqueFd()};
    fs::TreeUsage usage;
    RequestHeader h{};
    if (n >= static_cast<ssize_t>(sizeof h)) {
      std::memcpy(&h, buffer.data(), sizeof h);
      if (h.name_len <= kMaxName && h.name2_len <= kMaxName &&
          sizeof h + h.name_len + h.name2_len == static_cast<std::size_t>(n)) {
        const std::string_view name(buffer.data() + sizeof h, h.name_len);
        const std::string_view name2(buffer.data() + sizeof h + h.name_len, h.name2_len);
        done = serve(h, name, name2, fds, usage);
      }
    }
    const ReplyHeader reply{done.first, usage.bytes, usage.files, usage.folders, usage.skipped};
    const int fd = done.second.get();
    if (send_with_fds(kSocketFd, &reply, sizeof reply, &fd, done.second ? 1 : 0) != 0) return 1;
  }
}

}  // namespace nshpc::files
