// The one way to the files of an instance (and of a WebDAV extra): paths as the sandbox sees them
// turned into (root directory descriptor, relative path), and every operation done beneath that
// descriptor with openat2(2) (base/safe_path.hpp) — never realpath-then-open.
//
// Everything beneath a root is hostile: the sandbox can swap any entry for a symlink, a FIFO or a
// hard link at any moment. So:
//   - intermediate components are resolved by the kernel in one step, RESOLVE_IN_ROOT (a symlink
//     or ".." never leaves the root; an absolute symlink is re-rooted at it) + RESOLVE_NO_MAGICLINKS;
//     InstanceFiles::resolve first takes absolute links that name the sandbox's mounts
//     (/workspace/x, /output/y) to the root they name, so they work as in the sandbox;
//   - the last component of a write, delete, rename or copy destination is never followed: a
//     symlink there is replaced or removed as a link, never written through;
//   - a read opens without blocking (a FIFO, a device) and refuses what is not a regular file or
//     a folder, and a file that does not belong to the tree's owner (a hard link to someone else's);
//   - whatever the server creates is given to the tree's owner (the sandbox uid).
//
// One identity regime for every face (the file tools, WebDAV, resources): an operation beneath an
// instance's root may do what the instance's own user could do from inside its sandbox, no more,
// so what one face refuses the other refuses too, with the same errno. Decided in one place
// (acting_identity below), applied by every operation here:
//   - a plain instance of a server running as root: its sandbox runs as an unprivileged uid with
//     no capability and no supplementary group, so each operation runs with that filesystem
//     identity (setfsuid/setfsgid, supplementary groups dropped, this thread only, for the
//     operation's system calls alone); the kernel then applies exactly the sandbox's permissions
//     (a 0444 file is not written, a 0555 folder not added to, a 0000 file not read);
//   - an image instance: its user is root of a user namespace mapping the instance's ids, which
//     may do anything to their files; a root server acts as itself (the same power over them) and
//     a normal user's server has the broker do what it may not (below);
//   - a normal user's plain instance: the sandbox runs as this very uid, without capabilities:
//     this process's own identity is already the sandbox's.
// Replacing a file's content (write_file, edit_file, a WebDAV PUT, a copy over it) needs write
// permission on that file, as `echo > file` in the sandbox would, though the new content is put in
// place by a rename.
// The instance's metadata, audit log, job records (.ns_hpc_jobs) and status folder live beside
// the workspace, never beneath a root, so no path reaches them.
//
// Where the server may not do an operation itself (EACCES or EPERM: a file of an account made
// inside a normal user's image instance, a folder whose mode keeps even its owner out), a root
// with a Broker (files/broker.hpp) has that one system call done again by a helper that is root
// of a user namespace mapping the instance's ids, on the same descriptors and with the same rules.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.hpp"
#include "base/users.hpp"

namespace nshpc::files {

namespace stdfs = std::filesystem;

class Broker;

// The longest path the file tools take (bytes, as given): PATH_MAX, what the kernel takes in one
// system call. Bounds every walk of a path (at most 2,048 components).
constexpr std::size_t kMaxPathBytes = 4096;

// Asked between steps of a long operation (a folder copied): true stops it (ECANCELED).
using Cancelled = std::function<bool()>;

struct Owner {
  uid_t uid;
  gid_t gid;
  // More ids whose files are the tree's own and are read (an image instance's other accounts:
  // its range above uid 0 on the host): others_from .. others_from + others - 1. New entries
  // still go to `uid`. Set only for an image instance, whose user (uid) is root of a user
  // namespace mapping all of these: acting_identity tells the two kinds apart by it.
  uid_t others_from = 0;
  std::uint32_t others = 0;
};

// The filesystem identity that operations beneath a tree of `owner` run with (see the regime
// above): the owner's uid and gid when this process is root (`as_root`) and the owner is an
// unprivileged uid with no accounts of its own (a plain instance's sandbox user); nullopt (this
// process's own identity) otherwise: no owner (this process's own files, a WebDAV extra), an
// owner that is this process or root, an image instance's (others > 0).
std::optional<users::Identity> acting_identity(const std::optional<Owner>& owner, bool as_root = ::geteuid() == 0);

// The name of a kernel interface file system (statfs f_type: "proc", "sysfs", "devpts",
// "cgroup2", ...), whose files are the kernel's controls and views rather than anyone's data; nullptr
// for any other type.
const char* kernel_interface(std::int64_t f_type);

// What a confined root (Root::confine) lets its operations touch: the tree's own files and
// folders (owner uid, or others_from .. others_from + others - 1) on these file systems.
struct Confinement {
  std::vector<std::int64_t> file_systems;  // statfs f_type
  uid_t uid = 0;
  uid_t others_from = 0;
  std::uint32_t others = 0;
  bool owns(uid_t id) const { return id == uid || (others > 0 && id >= others_from && id - others_from < others); }
  bool allows(std::int64_t f_type) const;  // on the list and not a kernel interface
};

// A directory tree whose content is hostile: an instance's workspace or output folder, later its
// root, or a WebDAV extra. Holds an O_PATH descriptor of the folder, opened once.
class Root {
 public:
  // `shown`: the folder as people see it ("/workspace", "/dav/data"); `owner`: the uid files
  // must belong to and new entries are given to (nullopt: this process's own uid, nothing chowned);
  // `read_only`: every write is refused with EROFS; `any_owner`: files of any uid are read (for
  // a folder no sandbox writes, such as a WebDAV extra; else a file must belong to the owner).
  // `broker`: who does what the server may not (see above); null: nobody. Operations beneath it
  // run with acting_identity(owner).
  Root(UniqueFd dir, std::string shown, std::optional<Owner> owner, bool read_only = false, bool any_owner = false,
       std::shared_ptr<Broker> broker = nullptr);
  // Opens `dir` (never following a final symlink). Throws SysError.
  static Root open(const stdfs::path& dir, std::string shown, std::optional<Owner> owner, bool read_only = false,
                   bool any_owner = false, std::shared_ptr<Broker> broker = nullptr);

  int fd() const { return dir_.get(); }
  const std::string& shown() const { return shown_; }
  // The uid files are expected to belong to, and whether new entries must be chowned to it.
  uid_t owner_uid() const { return owner_uid_; }
  gid_t owner_gid() const { return owner_gid_; }
  bool chown_new() const { return chown_new_; }
  // The filesystem identity operations beneath this root run with (acting_identity); nullopt:
  // this process's own.
  const std::optional<users::Identity>& acts_as() const { return acts_as_; }
  bool read_only() const { return read_only_; }
  bool any_owner() const { return any_owner_; }
  const std::shared_ptr<Broker>& broker() const { return broker_; }
  // Whether a file of `uid` is the tree's own (Owner: uid and the others).
  bool owns(uid_t uid) const {
    return uid == owner_uid_ || (others_ > 0 && uid >= others_from_ && uid - others_from_ < others_);
  }

  // Confines every operation beneath this root to the tree's own files on `file_systems` (statfs
  // f_type: those its files are on), for a root whose tree holds more than files: a living
  // sandbox's "/" reached from outside (/proc/<pid>/root), with its /proc, /proc/sys, /dev and
  // devpts, where this process (as root: every capability) could do far more than the sandbox
  // itself may. Confined, an operation refuses with EPERM, before it opens or changes anything:
  //   - a file it reads or replaces, or a folder it lists, makes an entry in or removes one from,
  //     on a kernel interface (kernel_interface) or on a file system not in `file_systems` (an
  //     allow-list: a mount nobody listed is refused, whatever it is);
  //   - such a file or folder that is not the tree's own (owns()), whatever its mode.
  // Reads open the path O_PATH first (nothing of the file is opened), check it, then open that very
  // file again through its descriptor (never the path a second time), so nothing but the tree's
  // own regular files and folders is ever opened for reading.
  void confine(std::vector<std::int64_t> file_systems);
  const std::optional<Confinement>& confinement() const { return confinement_; }

 private:
  UniqueFd dir_;
  std::string shown_;
  uid_t owner_uid_;
  gid_t owner_gid_;
  std::optional<users::Identity> acts_as_;
  bool chown_new_;
  bool read_only_;
  bool any_owner_;
  uid_t others_from_ = 0;
  std::uint32_t others_ = 0;
  std::shared_ptr<Broker> broker_;
  std::optional<Confinement> confinement_;
};

// A place beneath a root: `rel` is normalised (no ".", no empty components, no leading '/'),
// "" for the root itself. May still contain ".." (resolved by the kernel, clamped at the root).
struct Location {
  const Root* root = nullptr;
  std::string rel;
  // The path as people see it: root->shown() + "/" + rel.
  std::string shown() const;
};

// Lexical normalisation of a '/'-separated path: drops "" and "." components, folds "x/.."
// pairs, keeps a leading ".." (a relative path) and drops it after a leading '/'. Keeps whether
// it was absolute. Throws UsageError on a NUL byte.
std::string normalize(std::string_view path);

// ---------------------------------------------------------------------------------------------
// Operations beneath a root (host side). All throw SysError keeping the errno, with the shown
// path in the message: ENOENT missing; ENOTDIR/EISDIR a file or folder where the other was
// needed; EXDEV the path leaves the root (refused); ELOOP too many links; ENXIO neither a
// regular file nor a folder (a FIFO, a socket, a device); EPERM a file of another uid (whatever
// its mode); EACCES what the root's identity may not do (its mode bits); EROFS a read-only root;
// EEXIST the destination exists; EBUSY the root itself. Each runs with the root's identity
// (Root::acts_as) and restores this thread's own before it returns or throws.

enum class EntryType { file, directory, symlink, other };
const char* to_string(EntryType type);
EntryType entry_type(mode_t mode);

// A file or folder opened for reading, with what fstat said about the descriptor.
struct Opened {
  UniqueFd fd;  // O_RDONLY (a folder: O_DIRECTORY), blocking
  struct stat st {};
  bool is_dir() const { return S_ISDIR(st.st_mode); }
};
// Follows symlinks inside the root. Regular files must belong to the root's owner.
Opened open_read(const Location& at);

// lstat of the entry (`follow`: of what a final symlink leads to, inside the root).
struct stat stat_at(const Location& at, bool follow);
// The target of the symlink at `at` (never followed).
std::string read_link(const Location& at);

struct Entry {
  std::string name;
  EntryType type = EntryType::other;
  std::uint64_t size = 0;
  mode_t mode = 0;  // permission bits
  std::int64_t mtime_ns = 0;
  uid_t uid = 0;
};
// The entries of the folder at `at` (symlinks inside the root followed to reach it), unsorted,
// without "." and "..", each described without following it; at most `max_entries` (a folder
// a sandbox filled with millions of entries costs no more than that).
std::vector<Entry> list_dir(const Location& at, std::size_t max_entries = SIZE_MAX);

// How a file is written.
struct WriteOptions {
  bool create_parents = false;    // make missing folders (0755, given to the owner)
  bool no_replace = false;        // EEXIST when something is at the path (create only)
  std::optional<mode_t> mode;     // default: the replaced file's mode, else 0644
};

// A new file being written next to its destination (a temporary in the same folder), put in
// place by commit() with one rename(2): readers see the old file or the new one, never a part.
// Destroyed without commit(): the temporary is removed.
class PendingFile {
 public:
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
  ~PendingFile();

  int fd() const { return fd_.get(); }
  void write(std::string_view data);  // all of it (throws on a short write)
  // Copies the rest of `from` (a regular file's descriptor) into the new file.
  void write_from(int from);
  // The file currently at the destination (a regular file, not followed), or nullopt when there
  // is none: for a guard such as "unchanged since it was read" just before commit().
  std::optional<UniqueFd> open_current() const;
  // fsync, then rename over the destination (RENAME_NOREPLACE when no_replace). Returns the
  // new file's stat.
  struct stat commit();

 private:
  friend std::unique_ptr<PendingFile> begin_write(const Location& at, const WriteOptions& options);
  PendingFile(std::optional<users::Identity> acts_as, std::shared_ptr<Broker> broker, UniqueFd dir, UniqueFd fd,
              std::string temp, std::string leaf, std::string shown, bool no_replace);
  std::optional<users::Identity> acts_as_;  // the root's (Root::acts_as), for the rename and the cleanup
  std::shared_ptr<Broker> broker_;
  UniqueFd dir_;
  UniqueFd fd_;
  std::string temp_;
  std::string leaf_;
  std::string shown_;
  bool no_replace_;
  bool committed_ = false;
  std::optional<Confinement> confinement_;  // the root's (open_current checks the file with it)
};
// Starts writing the file at `at` (the parent resolved inside the root, the last component
// never followed: a symlink there is replaced, not written through). EISDIR when a folder is
// there; ENOENT when the parent is missing and !create_parents; EACCES when a regular file there
// may not be written by the root's identity (a 0444 file), or the folder may not be added to.
std::unique_ptr<PendingFile> begin_write(const Location& at, const WriteOptions& options);

// Creates the folder at `at` (with `parents`, missing parents too; then an existing folder is
// fine). New folders are given to the owner.
void make_dir(const Location& at, bool parents, mode_t mode = 0755);

// Removes the entry at `at` (a symlink as a link). A folder only with `recursive` (else
// EISDIR), its content removed without following any link; ENOTEMPTY never happens then.
// Refuses the root itself (EBUSY).
void remove(const Location& at, bool recursive);

// Renames `from` to `to` (same or another root on the same filesystem; EXDEV otherwise). The
// last components are never followed. `overwrite`: an existing destination is replaced (a
// non-empty folder there: ENOTEMPTY), else EEXIST.
void rename(const Location& from, const Location& to, bool overwrite);

// Copies `from` (followed inside its root when it is a symlink) to `to`: a file through a
// PendingFile (mode kept), a folder recursively (links inside copied as links, FIFOs and
// devices skipped). Every file and folder copied must be the source tree's own, as for
// open_read (EPERM naming the first that is not). A folder is copied whole or not at all: into a
// temporary beside `to`, renamed into place at the end; a refusal, an error or `cancelled`
// (asked before each entry; ECANCELED) removes it and leaves `to` as it was. `overwrite`: an
// existing destination is replaced (a folder: exchanged, then removed), else EEXIST.
void copy(const Location& from, const Location& to, bool overwrite, const Cancelled& cancelled = {});

// ---------------------------------------------------------------------------------------------
// An instance's files as its sandbox sees them.

struct InstanceView {
  std::string workspace_mount = "/workspace";  // [namespace] workspace_mount
  std::string output_mount = "/output";        // [namespace] output_mount
  stdfs::path workspace;                       // host folders
  stdfs::path output;
  std::optional<Owner> owner;  // users::sandbox_owner; nullopt: this process's uid
  std::shared_ptr<Broker> broker;  // for what the server may not do itself (see above); null: none
};

class InstanceFiles {
 public:
  // Opens the roots. Throws SysError.
  explicit InstanceFiles(const InstanceView& view);
  // Locations point at the roots held here.
  InstanceFiles(const InstanceFiles&) = delete;
  InstanceFiles& operator=(const InstanceFiles&) = delete;

  // Whether an absolute symlink at the last component is taken through the mount map too (for
  // reading: as `cat link` in the sandbox), or left as the entry itself (writes, deletes,
  // renames, which never follow the last component).
  enum class Follow { not_last, last };
  // `path` as the sandbox sees it: relative (to the workspace mount) or absolute under the
  // workspace or output mount. UsageError for an empty path, a NUL byte, a path longer than
  // kMaxPathBytes (naming the limit), or a path outside both (naming what is reachable). An
  // absolute symlink on the way (`/workspace/data`, `/output/x`) is followed to the area it
  // names, as in the sandbox (SysError ENAMETOOLONG when that makes the path too long). Costs a
  // few system calls per component, and at most 40 links are looked through.
  Location resolve(std::string_view path, Follow follow = Follow::not_last) const;

  const Root& workspace() const { return workspace_; }
  const Root& output() const { return output_; }

 private:
  Location map(std::string_view path) const;  // the mount map alone, no links looked at
  // `at` taken through the first absolute link on its way, or nullopt; `links` counts the links seen.
  std::optional<Location> through_absolute_link(const Location& at, Follow follow, int& links) const;
  Root workspace_;
  Root output_;
};

}  // namespace nshpc::files
