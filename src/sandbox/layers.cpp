#include "sandbox/layers.hpp"

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/process.hpp"
#include "base/users.hpp"
#include "sandbox/images.hpp"

namespace nshpc::sandbox {

namespace {

namespace stdfs = std::filesystem;

constexpr uid_t kRangeSize = 65536;
constexpr uid_t kLowestRootRange = 1u << 20;

// glibc 2.36 has no wrappers for the new mount API.
int sys_open_tree(int dfd, const char* path, unsigned flags) {
  return static_cast<int>(::syscall(SYS_open_tree, dfd, path, flags));
}
int sys_mount_setattr(int dfd, const char* path, unsigned flags, mount_attr* attr) {
  return static_cast<int>(::syscall(SYS_mount_setattr, dfd, path, flags, attr, sizeof *attr));
}
int sys_move_mount(int from_dfd, const char* from, int to_dfd, const char* to, unsigned flags) {
  return static_cast<int>(::syscall(SYS_move_mount, from_dfd, from, to_dfd, to, flags));
}

// The highest id a colon-separated table names: field `id_field` (passwd, group), or
// start + count of a subordinate range (subuid, subgid: name:start:count).
std::uint64_t highest_id(std::string_view table, bool ranges, int id_field) {
  std::uint64_t top = 0;
  std::istringstream in{std::string(table)};
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, ':');) f.push_back(x);
    try {
      if (ranges && f.size() >= 3) top = std::max<std::uint64_t>(top, std::stoull(f[1]) + std::stoull(f[2]));
      if (!ranges && static_cast<int>(f.size()) > id_field) {
        const std::uint64_t id = std::stoull(f[static_cast<std::size_t>(id_field)]);
        if (id < 0xFFFFFFFEu) top = std::max<std::uint64_t>(top, id + 1);  // not nobody's -2
      }
    } catch (const std::exception&) {
      // A line that is not one of ours to judge.
    }
  }
  return top;
}

std::string slurp(const char* path) { return fs::read_file(path).value_or(""); }

void write_proc(pid_t pid, const char* file, const std::string& text) {
  const std::string path = fmt::format("/proc/{}/{}", pid, file);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) throw SysError(errno, "open", path);
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) throw SysError(errno, "write", path);
}

}  // namespace

uid_t root_range_floor(std::string_view subuid, std::string_view subgid, std::string_view passwd,
                       std::string_view group) {
  std::uint64_t top = kLowestRootRange;
  top = std::max(top, highest_id(subuid, true, 0));
  top = std::max(top, highest_id(subgid, true, 0));
  top = std::max(top, highest_id(passwd, false, 2));
  top = std::max(top, highest_id(group, false, 2));
  top = (top + kRangeSize - 1) / kRangeSize * kRangeSize;
  return static_cast<uid_t>(std::min<std::uint64_t>(top, 0xFFFF0000u));
}

UidMapping image_uid_mapping() {
  UidMapping m;
  if (::geteuid() == 0) {
    m.kind = UidMapping::Kind::range;
    m.host_base = root_range_floor(slurp("/etc/subuid"), slurp("/etc/subgid"), slurp("/etc/passwd"), slurp("/etc/group"));
    m.host_gid = static_cast<gid_t>(m.host_base);
    m.count = kRangeSize;
    m.source = fmt::format("root's own ranges from {} up (above /etc/subuid, /etc/subgid and every account), "
                           "65536 ids per instance",
                           m.host_base);
    return m;
  }
  m.host_base = ::geteuid();
  m.host_gid = ::getegid();
  // The ranges an image this user builds is made with (images.hpp: image_build_method).
  std::string why_single;
  try {
    const ImageBuildMethod method = image_build_method();
    if (method.owners == ImageOwners::subordinate && fs::find_program("newuidmap") && fs::find_program("newgidmap")) {
      m.kind = UidMapping::Kind::range;
      m.sub_uid = method.uids.start;
      m.sub_gid = method.gids.start;
      m.count = kRangeSize + 1;
      m.source = fmt::format("uid 0 inside is you ({}, uid {}); 1-65536 are your /etc/subuid range {}-{} "
                             "(newuidmap), as in the images you build",
                             method.user, m.host_base, m.sub_uid, m.sub_uid + kRangeSize - 1);
      return m;
    }
    why_single = method.owners == ImageOwners::subordinate
                     ? "newuidmap/newgidmap (Debian's uidmap package) are not installed"
                     : "you have no range of 65536 ids in /etc/subuid and /etc/subgid";
  } catch (const UsageError& e) {
    why_single = e.what();
  }
  m.kind = UidMapping::Kind::single;
  m.count = 1;
  m.source = fmt::format("single uid: only uid 0 inside, which is you (uid {}), because {}: apt works as root, but "
                         "no other account (useradd'ed users, _apt) can own a file",
                         m.host_base, why_single);
  return m;
}

UniqueFd mapped_user_namespace(const UidMapping& ids, bool owned) {
  const bool root = ::geteuid() == 0;
  Pipe ready = make_pipe(), done = make_pipe();
  const pid_t child = ::fork();
  if (child < 0) throw SysError(errno, "fork", "a user namespace holder");
  if (child == 0) {
    char c = 0;
    bool ok = true;
    if (root && owned)
      ok = ::syscall(SYS_setgroups, 0, nullptr) == 0 && ::syscall(SYS_setresgid, ids.host_gid, ids.host_gid, ids.host_gid) == 0 &&
           ::syscall(SYS_setresuid, ids.host_base, ids.host_base, ids.host_base) == 0;
    ok = ok && ::unshare(CLONE_NEWUSER) == 0;
    if (::write(ready.write.get(), ok ? "1" : "0", 1) != 1) ::_exit(1);
    (void)!::read(done.read.get(), &c, 1);  // until the parent holds the namespace
    ::_exit(0);
  }
  ready.write.reset();
  done.read.reset();
  auto reap = [child] {
    int status = 0;
    ::kill(child, SIGKILL);
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
  };
  char c = 0;
  if (::read(ready.read.get(), &c, 1) != 1 || c != '1') {
    reap();
    throw SysError(EPERM, "unshare(CLONE_NEWUSER)", "a user namespace for an image instance");
  }
  try {
    if (root) {
      const std::string map = fmt::format("0 {} {}\n", ids.host_base, ids.count);
      write_proc(child, "uid_map", map);
      write_proc(child, "gid_map", fmt::format("0 {} {}\n", ids.host_gid, ids.count));
    } else if (ids.kind == UidMapping::Kind::range) {
      // The setuid helpers check the ranges against /etc/subuid and /etc/subgid.
      const std::string pid = std::to_string(child), rest = std::to_string(ids.count - 1);
      for (const auto& argv : {std::vector<std::string>{"newuidmap", pid, "0", std::to_string(ids.host_base), "1", "1",
                                                        std::to_string(ids.sub_uid), rest},
                               std::vector<std::string>{"newgidmap", pid, "0", std::to_string(ids.host_gid), "1", "1",
                                                        std::to_string(ids.sub_gid), rest}}) {
        const CommandResult r = run_command(argv, {}, std::chrono::seconds(10));
        if (r.exit_code != 0)
          throw NeedsAction(NeedsAction::Action::check_id_ranges,
                            fmt::format("could not map the instance's ids: {}", describe_failure(argv, r)));
      }
    } else {
      write_proc(child, "setgroups", "deny");
      write_proc(child, "uid_map", fmt::format("0 {} 1\n", ids.host_base));
      write_proc(child, "gid_map", fmt::format("0 {} 1\n", ids.host_gid));
    }
    const std::string ns = fmt::format("/proc/{}/ns/user", child);
    UniqueFd fd(::open(ns.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw SysError(errno, "open", ns);
    reap();
    return fd;
  } catch (...) {
    reap();
    throw;
  }
}

std::pair<uid_t, std::uint32_t> other_ids(const UidMapping& ids) {
  if (ids.count <= 1) return {0, 0};
  return {ids.sub_uid != 0 ? ids.sub_uid : ids.host_base + 1, ids.count - 1};
}

void check_image_owner(const stdfs::path& rootfs, const UidMapping& ids) {
  struct stat st{};
  if (::stat((rootfs / "usr").c_str(), &st) != 0) throw SysError(errno, "find the image", rootfs.string());
  const uid_t expected = ::geteuid() == 0 ? 0 : ids.host_base;
  if (st.st_uid == expected) return;
  throw NeedsAction(NeedsAction::Action::build_image,
                    fmt::format("the image at {} belongs to uid {}, but an instance's root here must be uid {} (uid 0 "
                                "inside: {})",
                                rootfs.string(), st.st_uid, expected, ids.source));
}

std::vector<std::string> as_mapped_root(std::vector<std::string> argv) {
  if (::geteuid() == 0) return argv;
  // As root of a user namespace, capabilities over every file of the ids it maps: the folders
  // an instance made unreadable (an overlay's work folder is d---------) included.
  try {
    const ImageBuildMethod method = image_build_method();
    if (method.owners == ImageOwners::subordinate) return in_subordinate_namespace(method, std::move(argv));
  } catch (const UsageError&) {
    // A range in only one of the two files: the user's own files only.
  }
  argv.insert(argv.begin(), {"unshare", "--map-root-user", "--"});
  return argv;
}

void remove_owned_tree(const stdfs::path& path) {
  try {
    fs::remove_tree(path);
    return;
  } catch (const SysError& e) {
    if (::geteuid() == 0 || (e.code() != EACCES && e.code() != EPERM)) throw;
  }
  // What belongs to the user's subordinate uids, in a user namespace that maps them.
  const std::vector<std::string> argv = as_mapped_root({"rm", "-rf", "--one-file-system", "--", path.string()});
  const CommandResult r = run_command(argv, {}, std::chrono::minutes(30));
  if (r.exit_code != 0)
    throw Error(fmt::format("could not remove {}: {}; remove it as root", path.string(), describe_failure(argv, r)));
}

void mount_idmapped(const stdfs::path& source, int userns_fd, const stdfs::path& target) {
  UniqueFd tree(sys_open_tree(AT_FDCWD, source.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
  if (!tree) throw SysError(errno, "open_tree", source.string());
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  attr.userns_fd = static_cast<std::uint64_t>(userns_fd);
  if (sys_mount_setattr(tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0)
    throw SysError(errno, "idmap (mount_setattr)", source.string());
  if (sys_move_mount(tree.get(), "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
    throw SysError(errno, "move_mount", target.string());
}

void mount_overlay(const stdfs::path& lower, const stdfs::path& upper, const stdfs::path& work,
                   const stdfs::path& target, bool userxattr) {
  for (const auto& p : {lower, upper, work})
    if (p.string().find_first_of(",:\\") != std::string::npos)
      throw UsageError(fmt::format("{}: an overlay layer's path may not contain ',', ':' or '\\'", p.string()));
  std::string options = fmt::format("lowerdir={},upperdir={},workdir={}", lower.string(), upper.string(), work.string());
  if (userxattr) options += ",userxattr";
  if (::mount("overlay", target.c_str(), "overlay", MS_NOSUID | MS_NODEV, options.c_str()) != 0)
    throw SysError(errno, "mount overlay", target.string());
  struct statvfs st{};
  if (::statvfs(target.c_str(), &st) != 0 || (st.f_flag & ST_RDONLY) != 0) {
    ::umount2(target.c_str(), MNT_DETACH);
    throw Error(fmt::format("the overlay at {} came up read-only: the kernel could not use {} and {} as its "
                            "writable layer (they must belong to the instance's root and sit on a local file "
                            "system such as ext4 or xfs)",
                            target.string(), upper.string(), work.string()));
  }
}

ImageRootSetup prepare_image_root(const ImageRoot& image) {
  const bool root = ::geteuid() == 0;
  const stdfs::path& scratch = image.mount_dir;
  ImageRootSetup setup;
  const stdfs::path upper = image.layer / "upper", work = image.layer / "work";
  for (const auto& dir : {upper, work}) {
    struct stat st{};
    if (::lstat(dir.c_str(), &st) != 0) throw SysError(errno, "find the instance's layer", dir.string());
    if (!S_ISDIR(st.st_mode) || st.st_uid != image.ids.host_base)
      throw NeedsAction(NeedsAction::Action::reset_instance,
                        fmt::format("{} is not a folder of the instance's root (uid {}): the layer was changed "
                                    "outside ns-hpc",
                                    dir.string(), image.ids.host_base));
  }
  check_image_owner(image.rootfs, image.ids);
  setup.userns = mapped_user_namespace(image.ids, /*owned=*/true);
  setup.set_groups = image.ids.kind == UidMapping::Kind::range;
  if (root) {
    setup.tree.reset(sys_open_tree(AT_FDCWD, image.rootfs.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
    if (!setup.tree) throw SysError(errno, "open_tree", image.rootfs.string());
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    attr.userns_fd = static_cast<std::uint64_t>(setup.userns.get());
    if (sys_mount_setattr(setup.tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0)
      throw SysError(errno, "idmap (mount_setattr)", image.rootfs.string());
  }
  if (::mkdir(scratch.c_str(), 0755) != 0 && errno != EEXIST) throw SysError(errno, "mkdir", scratch.string());
  setup.scratch = scratch.string();
  // As a normal user the image's own folder is the lower layer: its owners are the namespace's.
  setup.lower = root ? (scratch / "lower").string() : image.rootfs.string();
  setup.merged = (scratch / "merged").string();
  for (const auto& p : {setup.lower, upper.string(), work.string()})
    if (p.find_first_of(",:\\") != std::string::npos)
      throw Error(fmt::format("{}: an overlay layer's path may not contain ',', ':' or '\\'; move "
                              "[namespace] instances_dir or images_dir", p));
  setup.overlay_options = fmt::format("lowerdir={},upperdir={},workdir={}", setup.lower, upper.string(), work.string());
  if (!root) setup.overlay_options += ",userxattr";
  return setup;
}

int enter_image_root(const ImageRootSetup& setup, const char** step) {
  auto failed = [step](const char* what) {
    *step = what;
    return errno != 0 ? errno : EIO;
  };
  auto become_root = [&]() -> int {
    if (::setns(setup.userns_fd, CLONE_NEWUSER) != 0) return failed("join the instance's user namespace");
    ::close(setup.userns_fd);
    if ((setup.set_groups && ::syscall(SYS_setgroups, 0, nullptr) != 0) || ::syscall(SYS_setresgid, 0, 0, 0) != 0 ||
        ::syscall(SYS_setresuid, 0, 0, 0) != 0)
      return failed("become the instance's root");
    return 0;
  };
  const bool idmapped = setup.tree_fd >= 0;
  // As a normal user the user namespace comes first: it then owns the mount namespace below.
  if (!idmapped)
    if (const int err = become_root(); err != 0) return err;
  if (::unshare(CLONE_NEWNS) != 0) return failed("make the image root's mount namespace");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) return failed("make the mounts private");
  if (::mount("tmpfs", setup.scratch.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") != 0)
    return failed("mount the image root's scratch folder");
  if (::mkdir(setup.merged.c_str(), 0755) != 0) return failed("make the image root's mount points");
  if (idmapped) {
    if (::mkdir(setup.lower.c_str(), 0755) != 0) return failed("make the image root's mount points");
    if (sys_move_mount(setup.tree_fd, "", AT_FDCWD, setup.lower.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
      return failed("mount the image (move_mount)");
    ::close(setup.tree_fd);
  }
  if (::mount("overlay", setup.merged.c_str(), "overlay", MS_NOSUID | MS_NODEV, setup.overlay_options.c_str()) != 0)
    return failed("mount the instance's layer over the image (overlay)");
  struct statfs fsinfo{};
  if (::statfs(setup.merged.c_str(), &fsinfo) != 0) return failed("check the instance's root");
  if ((fsinfo.f_flags & ST_RDONLY) != 0) {
    errno = EROFS;
    return failed("mount the instance's layer writable (the kernel mounted the overlay read-only: its upper and "
                  "work folders must belong to the instance's root and sit on a local file system)");
  }
  const int root = ::open(setup.merged.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0 || ::dup3(root, setup.root_fd, 0) < 0) return failed("open the instance's root");
  ::close(root);
  if (idmapped) return become_root();
  return 0;
}

LayerSupport probe_layers(const stdfs::path& scratch) {
  LayerSupport s;
  const bool root = ::geteuid() == 0;
  const stdfs::path dir = scratch / fmt::format(".layer-probe-{}", ::getpid());
  try {
    for (const char* d : {"image/etc", "lower", "upper", "work", "merged"}) fs::make_dirs(dir / d, 0755);
    std::ofstream(dir / "image/etc/os-release") << "ID=probe\n";
  } catch (const std::exception& e) {
    s.detail = fmt::format("could not prepare {}: {}", dir.string(), e.what());
    s.fix = "make [namespace] images_dir a folder you can write on a local file system";
    return s;
  }
  const UidMapping mapping = image_uid_mapping();
  Pipe report = make_pipe();
  const pid_t child = ::fork();
  if (child == 0) {
    // Everything here happens in this child's own mount namespace and goes with it.
    std::string result;
    try {
      if (root) {
        if (::unshare(CLONE_NEWNS) != 0) throw SysError(errno, "unshare(CLONE_NEWNS)");
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) throw SysError(errno, "make / private");
        const UniqueFd ns = mapped_user_namespace(mapping);
        mount_idmapped(dir / "image", ns.get(), dir / "lower");
        for (const char* d : {"upper", "work"})
          if (::chown((dir / d).c_str(), mapping.host_base, mapping.host_base) != 0) throw SysError(errno, "chown", d);
        mount_overlay(dir / "lower", dir / "upper", dir / "work", dir / "merged", false);
        struct stat st{};
        if (::stat((dir / "merged/etc/os-release").c_str(), &st) != 0) throw SysError(errno, "stat", "the probe's image file");
        if (st.st_uid != mapping.host_base)
          throw Error(fmt::format("the idmapped image shows owner {} instead of {}: idmapped mounts did nothing",
                                  st.st_uid, mapping.host_base));
      } else {
        const uid_t uid = ::geteuid();
        const gid_t gid = ::getegid();
        if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) throw SysError(errno, "unshare(CLONE_NEWUSER|CLONE_NEWNS)");
        std::ofstream("/proc/self/setgroups") << "deny";
        std::ofstream("/proc/self/uid_map") << "0 " << uid << " 1";
        std::ofstream("/proc/self/gid_map") << "0 " << gid << " 1";
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) throw SysError(errno, "make / private");
        mount_overlay(dir / "image", dir / "upper", dir / "work", dir / "merged", true);
      }
      const stdfs::path probe = dir / "merged/etc/written";
      std::ofstream(probe) << "x";
      if (!stdfs::exists(dir / "upper/etc/written")) throw Error("a file written on the overlay did not reach its layer");
      result = "ok";
    } catch (const std::exception& e) {
      result = e.what();
    }
    (void)!::write(report.write.get(), result.data(), result.size());
    ::_exit(0);
  }
  report.write.reset();
  std::string said;
  char buf[1024];
  for (ssize_t n; (n = ::read(report.read.get(), buf, sizeof buf)) > 0;) said.append(buf, static_cast<std::size_t>(n));
  int status = 0;
  while (child > 0 && ::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  try {
    fs::remove_tree(dir);
  } catch (const std::exception&) {
    // As a normal user the layer's work folder can be left unreadable (d---------): best effort.
  }
  s.ok = said == "ok";
  const std::string how = root ? "an idmapped image under an overlay" : "an overlay in a user namespace (userxattr)";
  s.detail = s.ok ? fmt::format("{} works; uid mapping: {}", how, mapping.source)
                  : fmt::format("{} failed: {}", how, said.empty() ? std::string("the probe died") : said);
  if (!s.ok)
    s.fix = root ? "image instances need a kernel with idmapped mounts and overlayfs on idmapped layers (5.19+)"
                 : "image instances as a normal user need overlayfs in a user namespace (kernel 5.11+) or "
                   "fuse-overlayfs with a usable /dev/fuse";
  return s;
}

}  // namespace nshpc::sandbox
