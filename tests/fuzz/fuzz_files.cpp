// libFuzzer target: arbitrary paths (as an agent or a WebDAV client would send them) through the
// files resolver, against a tree full of hostile entries (links out by absolute and relative
// paths, links to /proc magic links, a FIFO, a hard link), with ASan and UBSan. Whatever the path:
//   - normalize() is idempotent and never leaves ".." in an absolute path;
//   - resolve() maps only into /workspace or /output;
//   - what open_read opens is inside the two roots (checked by device and inode against the
//     files outside them), and nothing outside is ever created or changed.
// Input: the first byte picks the operation, the rest is the path.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "base/error.hpp"
#include "files/resolver.hpp"

namespace files = nshpc::files;
namespace stdfs = std::filesystem;

namespace {

struct Tree {
  stdfs::path base;
  std::set<std::pair<dev_t, ino_t>> outside;  // inodes no operation may reach
  struct stat outside_dir {};
  std::unique_ptr<files::InstanceFiles> files;

  Tree() {
    char templ[] = "/tmp/nshpc-fuzz-files-XXXXXX";
    base = ::mkdtemp(templ);
    const stdfs::path ws = base / "inst" / "workspace", out = base / "output", secret = base / "secret";
    stdfs::create_directories(ws / "a" / "b");
    stdfs::create_directories(out / "r");
    stdfs::create_directories(secret);
    std::ofstream(base / "inst" / "metadata.json") << "{}";
    std::ofstream(secret / "s") << "secret";
    std::ofstream(ws / "a" / "f.txt") << "inside";
    std::ofstream(out / "r" / "o.txt") << "output";
    stdfs::create_symlink(secret, ws / "abs_out");
    stdfs::create_symlink("../../secret", ws / "rel_out");
    stdfs::create_symlink("../../../secret/s", ws / "a" / "deep_out");
    stdfs::create_symlink("/proc/self/root", ws / "proc_root");
    stdfs::create_symlink("/workspace/a", ws / "abs_in");
    stdfs::create_symlink("/output/r", ws / "abs_output");
    stdfs::create_symlink("/workspace/../../secret", ws / "abs_up");
    stdfs::create_symlink("/workspace/abs_loop", ws / "abs_loop");
    stdfs::create_symlink("../output", ws / "to_output");
    stdfs::create_symlink("loop2", ws / "loop1");
    stdfs::create_symlink("loop1", ws / "loop2");
    ::mkfifo((ws / "fifo").c_str(), 0644);
    // A hard link to a file of another uid (the server's metadata, when the server is root and
    // the sandbox is not): refused by the owner check. Without root the owner is the same uid,
    // and a sandbox cannot see such a file to link it, so there is nothing to plant.
    const bool root = ::geteuid() == 0;
    if (root) stdfs::create_hard_link(base / "inst" / "metadata.json", ws / "hard_meta");
    for (const auto& p : {base / "inst" / "metadata.json", secret / "s", secret, base / "inst", base})
      if (struct stat st; ::stat(p.c_str(), &st) == 0) outside.emplace(st.st_dev, st.st_ino);
    ::stat(secret.c_str(), &outside_dir);
    files::InstanceView v;
    v.workspace = ws;
    v.output = out;
    if (root) {
      for (const stdfs::path& top : {ws, out}) {
        ::lchown(top.c_str(), 4242, 4242);
        for (const auto& e : stdfs::recursive_directory_iterator(top))
          if (e.path().filename() != "hard_meta") ::lchown(e.path().c_str(), 4242, 4242);
      }
      v.owner = files::Owner{4242, 4242};
    }
    files = std::make_unique<files::InstanceFiles>(v);
  }
  ~Tree() {
    std::error_code ec;
    stdfs::remove_all(base, ec);
  }
  void check_reached(const struct stat& st) const {
    if (outside.count({st.st_dev, st.st_ino})) std::abort();  // reached a file outside the roots
  }
  void check_outside_unchanged() const {
    struct stat st;
    if (::stat((base / "secret").c_str(), &st) != 0 || st.st_mtim.tv_sec != outside_dir.st_mtim.tv_sec ||
        st.st_mtim.tv_nsec != outside_dir.st_mtim.tv_nsec || st.st_nlink != outside_dir.st_nlink)
      std::abort();  // something was created or removed outside
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Tree tree;
  if (size < 1) return 0;
  const int op = data[0] % 6;
  const std::string path(reinterpret_cast<const char*>(data + 1), size - 1);

  std::string once;
  try {
    once = files::normalize(path);
  } catch (const nshpc::UsageError&) {
    return 0;  // a NUL byte: refused
  }
  if (files::normalize(once) != once) std::abort();
  if (!once.empty() && once.front() == '/' && (once + "/").find("/../") != std::string::npos) std::abort();

  files::Location at;
  try {
    // Reads follow an absolute link at the last component too (through the mount map).
    at = tree.files->resolve(path, op == 0 || op == 1 || op == 3 ? files::InstanceFiles::Follow::last
                                                                 : files::InstanceFiles::Follow::not_last);
  } catch (const nshpc::UsageError&) {
    return 0;
  }
  if (at.root != &tree.files->workspace() && at.root != &tree.files->output()) std::abort();
  const std::string slashed = "/" + at.rel + "/";
  if (slashed.find("/../") != std::string::npos || slashed.find("/./") != std::string::npos) std::abort();
  try {
    switch (op) {
      case 0: {
        files::Opened o = files::open_read(at);
        tree.check_reached(o.st);
        break;
      }
      // A stat may reach a planted hard link's inode (the sandbox sees that much itself); its
      // content is never read (case 0).
      case 1: (void)files::stat_at(at, true); break;
      case 2: (void)files::stat_at(at, false); break;
      case 3: (void)files::list_dir(at); break;
      case 4: {
        auto pending = files::begin_write(at, {});  // never committed: the temporary goes again
        pending->write("x");
        break;
      }
      case 5: (void)files::read_link(at); break;
    }
  } catch (const nshpc::SysError&) {
  }
  tree.check_outside_unchanged();
  return 0;
}
