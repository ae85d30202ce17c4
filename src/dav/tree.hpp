// The file operations of WebDAV beneath one served folder (an instance's workspace or output, an
// extra), which a sandbox may change at any moment. Every one goes through the `files` module's
// resolver (files/resolver.hpp: beneath the folder's descriptor with openat2, a link never
// leaving the folder, the last component of a write never followed, new entries given to the
// sandbox user, and the one identity regime of an instance's files: what the instance's own user
// could do, as for the file tools); this file maps its errors to HTTP statuses and adds what
// WebDAV wants on top: a symbolic link as the last component is refused (403) and never listed.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/fd.hpp"
#include "files/resolver.hpp"

namespace nshpc::dav {

// A WebDAV answer that ends the request: the HTTP status and a sentence for people.
class DavError : public std::runtime_error {
 public:
  DavError(int status, std::string message) : std::runtime_error(std::move(message)), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

// A path below a served folder: its decoded segments (never empty, ".", ".." or with '/' or NUL).
using RelPath = std::vector<std::string>;
std::string join(const RelPath& path);  // "a/b/c" ("" for the folder itself)

// One served folder.
struct Tree {
  // Its descriptor, owner, identity and read-only flag (the resolver's): every operation on it
  // runs as the resolver's regime says (files::acting_identity), as the file tools' do.
  std::optional<files::Root> root;
  bool read_only = false;
  std::string shown;     // the URL prefix people know it by, for messages
};

// Throws the DavError for a failed step on `path` (403 for links and escapes, 404 missing, ...).
[[noreturn]] void fail_with_errno(int err, const std::string& what, const std::string& shown);

// What is at `path`: nullopt when nothing is (ENOENT); throws DavError (403) for a symlink, and
// 409 when a parent is missing or not a folder and `parent_must_exist`.
std::optional<struct stat> stat_path(const Tree& tree, const RelPath& path, bool parent_must_exist = false);

// A regular file opened for reading (404 missing, 403 link or not a regular file).
UniqueFd open_file(const Tree& tree, const RelPath& path, struct stat& st);

struct DirEntry {
  std::string name;
  struct stat st;
};
// The entries of a folder, without links, sorted by name; at most `limit` (then `truncated`).
std::vector<DirEntry> list_dir(const Tree& tree, const RelPath& path, std::size_t limit, bool& truncated);

// Writes a file from `source` (a temporary in the same folder, renamed over the old one, whose
// mode it keeps). `source(buf, n)` returns bytes read, 0 at the end. Returns true when created.
bool write_file(const Tree& tree, const RelPath& path, const std::function<std::size_t(char*, std::size_t)>& source);
// An empty file (for LOCK on an unmapped URL). False when something is already there.
bool create_empty(const Tree& tree, const RelPath& path);
void make_dir(const Tree& tree, const RelPath& path);
// Removes a file, link or whole folder tree, never following a link.
void remove_path(const Tree& tree, const RelPath& path);
// Copies `from` to `to` (a file, or a folder with its contents when `recursive`, else an empty
// folder). The destination must not exist.
void copy_path(const Tree& from_tree, const RelPath& from, const Tree& to_tree, const RelPath& to, bool recursive);
// Moves `from` to `to` (rename; across folders on other filesystems: copy, then remove).
void move_path(const Tree& from_tree, const RelPath& from, const Tree& to_tree, const RelPath& to);

}  // namespace nshpc::dav
