// WebDAV file operations on the `files` resolver (see tree.hpp).
#include "dav/tree.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc::dav {

std::string join(const RelPath& path) {
  std::string out;
  for (const std::string& segment : path) {
    if (!out.empty()) out += '/';
    out += segment;
  }
  return out;
}

void fail_with_errno(int err, const std::string& what, const std::string& shown) {
  switch (err) {
    case ENOENT: throw DavError(404, fmt::format("{} does not exist", shown));
    case ELOOP:
      throw DavError(403, fmt::format("{} is a symbolic link or has one on its way; WebDAV never follows links", shown));
    case EXDEV: throw DavError(403, fmt::format("{} leads outside its folder; refused", shown));
    case EACCES:
    case EPERM: throw DavError(403, fmt::format("{}: permission denied ({})", shown, what));
    case ENOTDIR: throw DavError(409, fmt::format("{}: a parent is not a folder", shown));
    case EISDIR: throw DavError(409, fmt::format("{} is a folder", shown));
    case EEXIST: throw DavError(405, fmt::format("{} already exists", shown));
    case ENOTEMPTY: throw DavError(409, fmt::format("{} is a folder that is not empty", shown));
    case ENOSPC:
    case EDQUOT: throw DavError(507, fmt::format("{}: no space left on the server's disk", shown));
    case ENAMETOOLONG: throw DavError(414, fmt::format("{}: a name is too long", shown));
    case EROFS: throw DavError(403, fmt::format("{} is read-only", shown));
    case EBUSY: throw DavError(403, fmt::format("{} is a mount point", shown));
    case EINVAL: throw DavError(409, fmt::format("{}: {} is not possible (into itself?)", shown, what));
    case ENXIO: throw DavError(403, fmt::format("{} is not a regular file or folder", shown));
    default: throw DavError(500, fmt::format("{}: {} failed: {}", shown, what, std::strerror(err)));
  }
}

namespace {

std::string shown_of(const Tree& tree, const RelPath& path) { return tree.shown + join(path); }

files::Location at(const Tree& tree, const RelPath& path) { return files::Location{&*tree.root, join(path)}; }

// Runs a resolver step, turning its SysError into the HTTP status.
template <class F>
auto step(const Tree& tree, const RelPath& path, const char* what, F&& f) {
  try {
    return f();
  } catch (const SysError& e) {
    fail_with_errno(e.code(), what, shown_of(tree, path));
  }
}

// Whether the parent folder of `path` is there (a folder, reached inside the tree).
bool parent_exists(const Tree& tree, const RelPath& path) {
  if (path.size() <= 1) return true;
  const RelPath parent(path.begin(), path.end() - 1);
  try {
    return S_ISDIR(files::stat_at(at(tree, parent), true).st_mode);
  } catch (const SysError&) {
    return false;
  }
}

void refuse_link(const Tree& tree, const RelPath& path) {
  if (path.empty()) return;
  try {
    if (S_ISLNK(files::stat_at(at(tree, path), false).st_mode)) fail_with_errno(ELOOP, "open", shown_of(tree, path));
  } catch (const SysError&) {
    // not there (or its parent is not): the step itself says so
  }
}

}  // namespace

std::optional<struct stat> stat_path(const Tree& tree, const RelPath& path, bool parent_must_exist) {
  try {
    struct stat st = files::stat_at(at(tree, path), false);
    if (S_ISLNK(st.st_mode)) fail_with_errno(ELOOP, "stat", shown_of(tree, path));
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) fail_with_errno(ENXIO, "stat", shown_of(tree, path));
    return st;
  } catch (const SysError& e) {
    if (e.code() != ENOENT && e.code() != ENOTDIR) fail_with_errno(e.code(), "stat", shown_of(tree, path));
    if (parent_must_exist && !parent_exists(tree, path))
      throw DavError(409, fmt::format("{}: its parent folder does not exist", shown_of(tree, path)));
    return std::nullopt;
  }
}

UniqueFd open_file(const Tree& tree, const RelPath& path, struct stat& st) {
  if (path.empty()) throw DavError(405, fmt::format("{} is a folder", tree.shown));
  refuse_link(tree, path);
  files::Opened opened = step(tree, path, "open", [&] { return files::open_read(at(tree, path)); });
  if (opened.is_dir()) throw DavError(405, fmt::format("{} is a folder", shown_of(tree, path)));
  st = opened.st;
  return std::move(opened.fd);
}

std::vector<DirEntry> list_dir(const Tree& tree, const RelPath& path, std::size_t limit, bool& truncated) {
  truncated = false;
  refuse_link(tree, path);
  const std::vector<files::Entry> entries = step(tree, path, "list", [&] { return files::list_dir(at(tree, path)); });
  std::vector<DirEntry> out;
  for (const files::Entry& e : entries) {
    if (e.type != files::EntryType::file && e.type != files::EntryType::directory) continue;  // links are not listed
    if (out.size() >= limit) {
      truncated = true;
      break;
    }
    DirEntry d{e.name, {}};
    d.st.st_mode = (e.type == files::EntryType::directory ? S_IFDIR : S_IFREG) | e.mode;
    d.st.st_size = static_cast<off_t>(e.size);
    d.st.st_mtim.tv_sec = static_cast<time_t>(e.mtime_ns / 1000000000);
    d.st.st_mtim.tv_nsec = static_cast<long>(e.mtime_ns % 1000000000);
    d.st.st_ctim = d.st.st_mtim;
    d.st.st_uid = e.uid;
    out.push_back(std::move(d));
  }
  std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return out;
}

bool write_file(const Tree& tree, const RelPath& path, const std::function<std::size_t(char*, std::size_t)>& source) {
  if (path.empty()) throw DavError(405, fmt::format("{} is a folder", tree.shown));
  const bool created = !stat_path(tree, path, true);
  auto pending = step(tree, path, "write", [&] { return files::begin_write(at(tree, path), {}); });
  std::vector<char> buf(256 * 1024);
  for (;;) {
    const std::size_t n = source(buf.data(), buf.size());
    if (n == 0) break;
    step(tree, path, "write", [&] {
      pending->write(std::string_view(buf.data(), n));
      return 0;
    });
  }
  step(tree, path, "write", [&] { return pending->commit(); });
  return created;
}

bool create_empty(const Tree& tree, const RelPath& path) {
  if (path.empty()) return false;
  files::WriteOptions options;
  options.no_replace = true;
  try {
    files::begin_write(at(tree, path), options)->commit();
  } catch (const SysError& e) {
    if (e.code() == EEXIST) return false;
    if (e.code() == ENOENT) throw DavError(409, fmt::format("{}: its parent folder does not exist", shown_of(tree, path)));
    fail_with_errno(e.code(), "create", shown_of(tree, path));
  }
  return true;
}

void make_dir(const Tree& tree, const RelPath& path) {
  if (path.empty()) throw DavError(405, fmt::format("{} already exists", tree.shown));
  if (!parent_exists(tree, path)) throw DavError(409, fmt::format("{}: its parent folder does not exist", shown_of(tree, path)));
  step(tree, path, "mkdir", [&] {
    files::make_dir(at(tree, path), false);
    return 0;
  });
}

void remove_path(const Tree& tree, const RelPath& path) {
  if (path.empty()) throw DavError(403, fmt::format("{} is a mount point and cannot be deleted", tree.shown));
  step(tree, path, "delete", [&] {
    files::remove(at(tree, path), true);
    return 0;
  });
}

void copy_path(const Tree& from_tree, const RelPath& from, const Tree& to_tree, const RelPath& to, bool recursive) {
  if (to.empty()) throw DavError(403, fmt::format("{} is a mount point", to_tree.shown));
  if (!parent_exists(to_tree, to)) throw DavError(409, fmt::format("{}: its parent folder does not exist", shown_of(to_tree, to)));
  refuse_link(from_tree, from);
  const auto st = stat_path(from_tree, from);
  if (!st) fail_with_errno(ENOENT, "copy", shown_of(from_tree, from));
  if (S_ISDIR(st->st_mode) && !recursive) {  // Depth: 0: the collection without its members
    step(to_tree, to, "mkdir", [&] {
      files::make_dir(at(to_tree, to), false);
      return 0;
    });
    return;
  }
  step(to_tree, to, "copy", [&] {
    files::copy(at(from_tree, from), at(to_tree, to), false);
    return 0;
  });
}

void move_path(const Tree& from_tree, const RelPath& from, const Tree& to_tree, const RelPath& to) {
  if (from.empty() || to.empty()) throw DavError(403, "a mount point cannot be moved or replaced");
  if (!parent_exists(to_tree, to)) throw DavError(409, fmt::format("{}: its parent folder does not exist", shown_of(to_tree, to)));
  try {
    files::rename(at(from_tree, from), at(to_tree, to), false);
    return;
  } catch (const SysError& e) {
    if (e.code() != EXDEV) fail_with_errno(e.code(), "move", shown_of(from_tree, from));
  }
  // Another filesystem, or trees of two owners (an extra and an instance): copied, then removed.
  copy_path(from_tree, from, to_tree, to, true);
  remove_path(from_tree, from);
}

}  // namespace nshpc::dav
