// Runs inside the sandbox and reports what the kernel allowed. Static, so it needs nothing from
// the sandbox's /usr. Prints "ALLOWED" or "blocked <errno name>" for each attempt.
#include <dirent.h>
#include <fcntl.h>
#include <linux/tty.h>
#include <sched.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

void report(const char* what, int rc) {
  if (rc >= 0)
    std::printf("%s: ALLOWED\n", what);
  else
    std::printf("%s: blocked %s\n", what, strerrorname_np(errno));
}

int write_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  ssize_t n = ::write(fd, "probe\n", 6);
  ::close(fd);
  return n == 6 ? 0 : -1;
}

void dump(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (!f) {
    std::printf("cannot read %s: %s\n", path, strerrorname_np(errno));
    return;
  }
  int c;
  while ((c = std::fgetc(f)) != EOF) std::putchar(c == 0 ? '\n' : c);
  std::fclose(f);
}

// A TCP server on 127.0.0.1:port, one client at a time: greets with "hello from inside\n", then
// sends back each line it gets until the client ends. Runs until killed.
int serve(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 16) != 0) {
    std::printf("serve: %s\n", strerrorname_np(errno));
    return 1;
  }
  for (;;) {
    const int c = ::accept(s, nullptr, nullptr);
    if (c < 0) continue;
    (void)!::write(c, "hello from inside\n", 18);
    char buf[4096];
    ssize_t n;
    while ((n = ::read(c, buf, sizeof buf)) > 0) (void)!::write(c, buf, static_cast<std::size_t>(n));
    ::close(c);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string cmd = argv[1];
  std::string arg = argc > 2 ? argv[2] : "";
  if (cmd == "write") {
    report("write", write_file(arg));
  } else if (cmd == "open-write") {
    int fd = ::open(arg.c_str(), O_WRONLY);
    report("open-write", fd);
  } else if (cmd == "remount-write") {
    report("remount", ::mount(nullptr, arg.c_str(), nullptr, MS_REMOUNT | MS_BIND, nullptr));
    report("write", write_file(arg + "/nshpc-probe-escape"));
  } else if (cmd == "mount-tmpfs") {
    report("mount", ::mount("tmpfs", arg.c_str(), "tmpfs", 0, nullptr));
  } else if (cmd == "unshare-user") {
    report("unshare", ::unshare(CLONE_NEWUSER));
  } else if (cmd == "ptrace-child") {
    pid_t child = ::fork();
    if (child == 0) {
      ::pause();
      ::_exit(0);
    }
    report("ptrace", static_cast<int>(::ptrace(PTRACE_ATTACH, child, nullptr, nullptr)));
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  } else if (cmd == "pids") {
    int count = 0;
    DIR* d = ::opendir("/proc");
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] >= '0' && e->d_name[0] <= '9') ++count;
    ::closedir(d);
    std::printf("pids: %d\n", count);
  } else if (cmd == "fds") {
    DIR* d = ::opendir("/proc/self/fd");
    int self = ::dirfd(d);
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.' || std::atoi(e->d_name) == self) continue;
      std::printf("fd %s\n", e->d_name);
    }
    ::closedir(d);
  } else if (cmd == "cat") {
    dump(arg.c_str());
  } else if (cmd == "tiocsetd") {  // switch stdin's terminal to the null line discipline and leave it so
    int ldisc = N_NULL;
    report("tiocsetd", ::ioctl(STDIN_FILENO, TIOCSETD, &ldisc));
  } else if (cmd == "serve") {
    return serve(std::atoi(arg.c_str()));
  } else if (cmd == "ids") {
    std::printf("uid %d gid %d\n", ::getuid(), ::getgid());
    dump("/proc/self/uid_map");
  } else {
    std::fprintf(stderr, "unknown probe command %s\n", cmd.c_str());
    return 2;
  }
  return 0;
}
