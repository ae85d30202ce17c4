// Image roots: Debian root file systems built with mmdebstrap from the mirror the host's apt
// already uses, kept read-only and versioned, so that rebuilding an image never changes an
// instance made from an older version. Instances mount a version as the lower layer of their
// own root (the image-roots issue); this part builds, lists and removes them.
//
// Layout (`[namespace] images_dir`, a local folder):
//   .lock                         held by every change
//   <name>/<version>/rootfs/      the root file system (version: the build's UTC time, 20261202T063000Z)
//   <name>/<version>/image.json   what it was built from: suite, packages, mirror lines, size, time,
//                                 whose its files are (ImageOwners), and whether it has the desktop
//   <name>/current -> <version>   the version new instances get (replaced atomically)
//   .building/<name>-<random>/    a build in progress (removed when it fails, or swept on the next build)
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <map>
#include <string>
#include <string_view>
#include <vector>
#include <mutex>

#include "base/fd.hpp"

namespace nshpc::sandbox {

// Whose an image's files are, after how it was built. Instances on it need the matching mapping.
enum class ImageOwners {
  // Built by root (mmdebstrap --mode=root): root's and Debian's system ids, as in any Debian system.
  root,
  // Built by a normal user with ranges in /etc/subuid and /etc/subgid (mmdebstrap in a user
  // namespace mapping 0 to the user and 1..65536 to the range): uid 0's files are the user's, uid
  // k's (1..65536) are the range's start + k - 1 (_apt, 42: start + 41). Same for groups.
  subordinate,
  // Built by a normal user without a range (mmdebstrap --mode=fakechroot): every file is the user's.
  user,
};
std::string_view to_string(ImageOwners owners);

struct ImageVersion {
  std::string name;
  std::string version;
  std::filesystem::path rootfs;
  bool current = false;  // what new instances get
  std::string suite;
  std::vector<std::string> include;
  std::string built_at;     // ISO 8601, UTC
  std::uint64_t bytes = 0;  // disk use of the root file system when it was built
  ImageOwners owners = ImageOwners::root;  // an image.json without "owners" is from root (older builds)
  uid_t subuid = 0;  // subordinate: the host ids of uid 1 and gid 1 inside (the ranges' starts)
  gid_t subgid = 0;
  bool desktop = false;  // built with --desktop: its instances can run a desktop (desktop/session.hpp)
};

struct ImageBuild {
  std::string name;
  std::string suite = "bookworm";
  std::vector<std::string> include;  // packages beyond the `apt` variant's
  bool only_if_missing = false;      // no new version when the image has one (a background build's)
  bool desktop = false;              // with desktop_packages() too
};

// What --desktop adds to an image: the X server, Xfce, the session bus, AT-SPI and its Python
// binding, fonts and icons, a browser (firefox-esr), and the X tools users' scripts call (xdotool,
// wmctrl, xclip, xprop). Everything desktop/session.hpp's session needs is among them.
std::vector<std::string> desktop_packages();

// The packages a build installs beyond the `apt` variant's: `include`, and desktop_packages()
// for a desktop image (each once).
std::vector<std::string> build_packages(const ImageBuild& request);

// Throws UsageError naming the rule when `name` cannot name an image (the instance id rule:
// 1-63 of A-Z a-z 0-9 _ . -, starting with a letter or digit).
void validate_image_name(std::string_view name);

// A range of subordinate ids (a line "user:start:count" of /etc/subuid or /etc/subgid).
struct SubordinateRange {
  std::uint32_t start = 0;
  std::uint32_t count = 0;
};

// The first range in `text` (the contents of /etc/subuid or /etc/subgid) of `user`, named by
// name or by `uid`, with at least 65536 ids; nullopt when there is none.
std::optional<SubordinateRange> first_subordinate_range(std::string_view text, std::string_view user, uid_t uid);

// How a build runs, decided once from who builds and the subordinate ranges it has.
struct ImageBuildMethod {
  ImageOwners owners = ImageOwners::root;
  SubordinateRange uids, gids;  // subordinate: the ranges mapped to ids 1..65536
  std::string user;             // who builds (for messages)
  uid_t uid = 0;
  gid_t gid = 0;
};

// root: mmdebstrap --mode=root. A normal user with ranges of 65536 in both /etc/subuid and
// /etc/subgid (`subuid`, `subgid`: their text): subordinate. Without any: user (fakechroot).
// Throws UsageError when the user has a range in only one of the two files (the admin's fix is
// named).
ImageBuildMethod image_build_method(bool root, std::string_view subuid, std::string_view subgid, std::string_view user,
                                    uid_t uid, gid_t gid);
// The method for this process (its euid, /etc/subuid, /etc/subgid).
ImageBuildMethod image_build_method();

// The command that runs `argv` in a user namespace where uid/gid 0 are the user's and 1..65536
// the method's ranges (util-linux unshare, newuidmap/newgidmap): where a subordinate image's
// files are all reachable. Only for ImageOwners::subordinate.
std::vector<std::string> in_subordinate_namespace(const ImageBuildMethod& method, std::vector<std::string> argv);

// mmdebstrap's command line for `request` into `rootfs` with the host's apt `options` and
// `mirrors` (lines "deb URI SUITE COMPONENTS"), run the way `method` says.
std::vector<std::string> image_build_argv(const ImageBuildMethod& method, const std::string& mmdebstrap,
                                          const ImageBuild& request, const std::vector<std::string>& options,
                                          const std::vector<std::string>& mirrors, const std::filesystem::path& rootfs);

// What a build's progress says first about how it runs: the method and whose the files will be.
std::string describe_build_method(const ImageBuildMethod& method);

// fakechroot records the links a build makes to absolute targets with the build folder in front
// (usr/lib/os-release -> /home/u/.../rootfs/usr/lib/os-release): rewrites every link under
// `rootfs` whose target starts with `rootfs` to the target inside the image. Returns how many.
std::size_t rewrite_build_root_links(const std::filesystem::path& rootfs);

// The apt sources an image is built from: every entry of the host's own sources (one-line
// `sources.list` and deb822 `.sources` text, given as file contents) rewritten for `suite` (the
// host's codename `host_suite` in a suite name — bookworm, bookworm-updates, bookworm-security —
// becomes `suite`), as one-line entries "deb URI SUITE COMPONENTS…" without options (keys come
// from mmdebstrap's keyring handling). Only `deb` entries; disabled ones (Enabled: no,
// commented) are left out. Duplicates once.
std::vector<std::string> image_mirror_lines(const std::vector<std::string>& host_sources, std::string_view host_suite,
                                            std::string_view suite);

// The host's apt options a build needs to reach the mirror as the host does (`apt-config dump`
// output): proxies and other Acquire:: settings and the credentials folder. They are given to
// mmdebstrap for the build only and removed from the image before it is kept.
std::vector<std::string> image_build_apt_options(std::string_view apt_config_dump);

// A build going on now (in this process or another): since when, and mmdebstrap's last line.
struct BuildProgress {
  std::chrono::system_clock::time_point started;
  std::string line;
  pid_t pid = 0;  // the building process
};

// "name@version" → the instances whose root is that image version.
using ImageUsers = std::map<std::string, std::vector<std::string>>;

class ImageStore {
 public:
  explicit ImageStore(std::filesystem::path dir);

  const std::filesystem::path& dir() const { return dir_; }

  // Every version of every image, by name, newest first within a name.
  std::vector<ImageVersion> list() const;
  // The version new instances of `name` get; nullopt when there is no such image.
  std::optional<ImageVersion> current(std::string_view name) const;
  std::optional<ImageVersion> find(std::string_view name, std::string_view version) const;

  // Builds a new version of an image with mmdebstrap, the way image_build_method() says (as
  // root: --mode=root; as a normal user with subordinate ranges: --mode=unshare in a user
  // namespace of them; without: --mode=fakechroot), and makes it current. `progress` gets how it
  // runs, then mmdebstrap's status lines as they come. Throws UsageError when mmdebstrap (or
  // what the method needs: newuidmap; fakechroot and fakeroot) is missing, Error with
  // mmdebstrap's last lines when it fails.
  ImageVersion build(const ImageBuild& request, const std::function<void(std::string_view)>& progress);

  // The build of `name` going on now, by any process; nullopt when none is.
  std::optional<BuildProgress> building(std::string_view name) const;


  // Removes an image, every version, or one version (then, when it was current, the newest
  // other one becomes current). Refused (UsageError naming them) while an instance uses a version
  // to remove; UsageError when there is no such image or version.
  void remove(std::string_view name, std::optional<std::string_view> version, const ImageUsers& in_use);

 private:
  std::filesystem::path dir_;
};

// Image builds this process started in the background (a server's default image): each a
// process of its own session, `ns_hpc_command image build NAME --if-missing`, that goes on when
// this process ends first and is reaped here when it ends first.
class BackgroundBuilds {
 public:
  BackgroundBuilds(ImageStore images, std::vector<std::string> ns_hpc_command)
      : images_(std::move(images)), command_(std::move(ns_hpc_command)) {}

  // Starts a build of `request` unless one of that name runs already (in any process); its
  // output goes to .building/NAME.log. Returns how far the running build is. Throws UsageError
  // when mmdebstrap is missing.
  BuildProgress start(const ImageBuild& request);
  const ImageStore& images() const { return images_; }

 private:
  ImageStore images_;
  std::vector<std::string> command_;
  std::mutex mutex_;
  // The builds started here, by name, until reaped (one that has not taken its lock yet still
  // counts as running: a second is never started beside it).
  std::map<std::string, std::pair<UniqueFd, BuildProgress>> children_;
};

}  // namespace nshpc::sandbox
