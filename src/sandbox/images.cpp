#include "sandbox/images.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/random.hpp"
#include "base/spawn.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "base/users.hpp"
#include "sandbox/layers.hpp"

namespace nshpc::sandbox {

namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

constexpr const char* kCurrent = "current";
constexpr const char* kBuilding = ".building";
constexpr const char* kMeta = "image.json";
// mmdebstrap writes --aptopt options here; the host's options are for the build only.
constexpr const char* kBuildOptionsFile = "/etc/apt/apt.conf.d/99mmdebstrap";
// A build downloads and unpacks a few hundred MB: generous, but not for ever.
constexpr std::chrono::minutes kBuildTimeout{30};
// The ids a subordinate range gives an image: 1..65536 inside (0 is the user).
constexpr std::uint32_t kSubordinateIds = 65536;

std::vector<std::string> words(std::string_view line) {
  std::vector<std::string> out;
  std::istringstream in{std::string(line)};
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string rewrite_suite(const std::string& host, std::string_view host_suite, std::string_view suite) {
  if (host_suite.empty() || host.rfind(host_suite, 0) != 0) return host;
  return std::string(suite) + host.substr(host_suite.size());
}

// Entries of one deb822 paragraph: field name (lower case) → value (continuation lines joined).
std::vector<std::map<std::string, std::string>> deb822_paragraphs(std::string_view text) {
  std::vector<std::map<std::string, std::string>> out;
  std::map<std::string, std::string> cur;
  std::string last;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '#') continue;
    if (trim(line).empty()) {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
      last.clear();
      continue;
    }
    if ((line[0] == ' ' || line[0] == '\t') && !last.empty()) {
      cur[last] += " " + trim(line);
      continue;
    }
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    last = lower(trim(line.substr(0, colon)));
    cur[last] = trim(line.substr(colon + 1));
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

bool is_root() { return ::geteuid() == 0; }

std::string read_text(const stdfs::path& p) { return fs::read_file(p).value_or(""); }

// The disk use of a built root file system. A subordinate one has folders only its ids may
// read (apt's partial/, 0700 _apt): it is measured in their namespace (du counts each file once).
std::uint64_t built_tree_bytes(const ImageBuildMethod& method, const stdfs::path& rootfs) {
  if (method.owners != ImageOwners::subordinate) return fs::tree_usage(rootfs).bytes;
  const std::vector<std::string> argv =
      in_subordinate_namespace(method, {"du", "-s", "-x", "--block-size=1", "--", rootfs.string()});
  const CommandResult r = run_command(argv, {}, std::chrono::minutes(5));
  if (r.exit_code != 0) throw Error(fmt::format("measuring {}: {}", rootfs.string(), describe_failure(argv, r)));
  try {
    return std::stoull(r.out);
  } catch (const std::exception&) {
    throw Error(fmt::format("measuring {}: du printed '{}', not a size", rootfs.string(), text::truncate_utf8(r.out, 80)));
  }
}

std::string slurp_or_empty(const char* path) { return fs::read_file(path).value_or(""); }

// Removes the entries of `building` whose names start with `prefix`: what crashed builds or
// removals left behind.
void sweep_building(const stdfs::path& building, const std::string& prefix) {
  std::error_code ec;
  std::vector<stdfs::path> stale;
  for (const auto& e : stdfs::directory_iterator(building, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && e.is_directory() && !e.is_symlink()) stale.push_back(e.path());
  }
  for (const auto& p : stale) {
    log::info("removing {}, left by an earlier image build or removal", p.string());
    remove_owned_tree(p);
  }
}

std::optional<ImageVersion> read_version(const stdfs::path& dir, const std::string& name, const std::string& version,
                                         const std::string& current) {
  const auto text = fs::read_file(dir / name / version / kMeta);
  if (!text) return std::nullopt;  // not a finished version
  ImageVersion v;
  v.name = name;
  v.version = version;
  v.rootfs = dir / name / version / "rootfs";
  v.current = version == current;
  try {
    const json meta = parse_json(*text);
    v.suite = meta.value("suite", "");
    v.include = meta.value("include", std::vector<std::string>{});
    v.built_at = meta.value("built_at", "");
    v.bytes = meta.value("bytes", std::uint64_t{0});
    const std::string owners = meta.value("owners", "root");
    for (ImageOwners o : {ImageOwners::root, ImageOwners::subordinate, ImageOwners::user})
      if (owners == to_string(o)) v.owners = o;
    v.subuid = meta.value("subuid", uid_t{0});
    v.subgid = meta.value("subgid", gid_t{0});
    v.desktop = meta.value("desktop", false);
  } catch (const json::exception& e) {
    log::warn("image {}@{}: {} is unreadable ({}); listed without its details", name, version,
              (dir / name / version / kMeta).string(), e.what());
  }
  return v;
}

std::string current_of(const stdfs::path& name_dir) {
  std::error_code ec;
  const stdfs::path target = stdfs::read_symlink(name_dir / kCurrent, ec);
  return ec ? std::string() : target.filename().string();
}

// Points <name>/current at `version` atomically (a new link renamed over the old one).
void set_current(const stdfs::path& name_dir, const std::string& version) {
  const stdfs::path tmp = name_dir / fmt::format(".current-{}", random::hex(4));
  if (::symlink(version.c_str(), tmp.c_str()) != 0) throw SysError(errno, "symlink", tmp.string());
  if (::rename(tmp.c_str(), (name_dir / kCurrent).c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw SysError(err, "rename", (name_dir / kCurrent).string());
  }
  fs::sync_dir(name_dir);
}

std::vector<std::string> host_sources() {
  std::vector<std::string> out;
  if (auto main = fs::read_file("/etc/apt/sources.list")) out.push_back(*main);
  std::error_code ec;
  std::vector<stdfs::path> parts;
  for (const auto& e : stdfs::directory_iterator("/etc/apt/sources.list.d", ec)) {
    const std::string ext = e.path().extension().string();
    if (ext == ".list" || ext == ".sources") parts.push_back(e.path());
  }
  std::sort(parts.begin(), parts.end());
  for (const auto& p : parts) {
    std::string text = read_text(p);
    // One-line files are told apart from deb822 ones by their extension.
    if (p.extension() == ".sources" && text.find("Types:") == std::string::npos) continue;
    out.push_back(std::move(text));
  }
  return out;
}

std::string host_codename() {
  std::ifstream in("/etc/os-release");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VERSION_CODENAME=", 0) == 0) {
      std::string v = line.substr(17);
      v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
      return v;
    }
  }
  return {};
}

}  // namespace

std::string_view to_string(ImageOwners owners) {
  switch (owners) {
    case ImageOwners::root: return "root";
    case ImageOwners::subordinate: return "subordinate";
    case ImageOwners::user: return "user";
  }
  return "root";
}

std::optional<SubordinateRange> first_subordinate_range(std::string_view text, std::string_view user, uid_t uid) {
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string who = line.substr(0, a);
    if (who != user && who != std::to_string(uid)) continue;
    try {
      std::size_t used = 0;
      const std::string start_text = line.substr(a + 1, b - a - 1), count_text = trim(line.substr(b + 1));
      const unsigned long long start = std::stoull(start_text, &used);
      if (used != start_text.size()) continue;
      const unsigned long long count = std::stoull(count_text, &used);
      if (used != count_text.size() || count < kSubordinateIds || start + kSubordinateIds > 0xFFFFFFFFull) continue;
      return SubordinateRange{static_cast<std::uint32_t>(start),
                              static_cast<std::uint32_t>(std::min<unsigned long long>(count, 0xFFFFFFFFull))};
    } catch (const std::exception&) {  // not numbers: not a range
    }
  }
  return std::nullopt;
}

ImageBuildMethod image_build_method(bool root, std::string_view subuid, std::string_view subgid, std::string_view user,
                                    uid_t uid, gid_t gid) {
  ImageBuildMethod m;
  m.user = std::string(user);
  m.uid = uid;
  m.gid = gid;
  if (root) return m;
  const auto uids = first_subordinate_range(subuid, user, uid);
  const auto gids = first_subordinate_range(subgid, user, uid);
  if (uids && gids) {
    m.owners = ImageOwners::subordinate;
    m.uids = *uids;
    m.gids = *gids;
    return m;
  }
  if (uids || gids) {
    const auto& has = uids ? *uids : *gids;
    throw UsageError(fmt::format(
        "{} has a range of {} ids in /etc/{} but none in /etc/{}, and an image build needs both; an administrator "
        "adds it: usermod --add-sub{}s {}-{} {}",
        user, kSubordinateIds, uids ? "subuid" : "subgid", uids ? "subgid" : "subuid", uids ? "gid" : "uid",
        has.start, has.start + kSubordinateIds - 1, user));
  }
  m.owners = ImageOwners::user;
  return m;
}

ImageBuildMethod image_build_method() {
  return image_build_method(is_root(), slurp_or_empty("/etc/subuid"), slurp_or_empty("/etc/subgid"),
                            users::current_user_name(), ::geteuid(), ::getegid());
}

std::vector<std::string> desktop_packages() {
  return {// The display and the session around it.
          "xvfb", "xauth", "dbus", "dbus-daemon", "dbus-bin", "dbus-x11",
          // Xfce as mcp-virtual-computer's desktop has it, and its applications.
          "xfce4-session", "xfwm4", "xfce4-panel", "xfdesktop4", "xfce4-settings", "xfconf", "xfce4-terminal",
          "thunar", "mousepad", "xfce4-helpers", "exo-utils", "xdg-utils",
          // Text and icons (Debian's Xfce uses Tango; GTK's own are Adwaita, many of them SVG).
          "fonts-dejavu-core", "fonts-noto-color-emoji", "tango-icon-theme", "adwaita-icon-theme", "librsvg2-common",
          // The accessibility tree (desktop/atspi.hpp reads it with pyatspi).
          "at-spi2-core", "python3-pyatspi", "python3-gi", "gir1.2-atspi-2.0",
          // What scripts on a desktop call, and a live view.
          "xdotool", "wmctrl", "x11-utils", "xclip", "x11vnc",
          // A browser: about 300 MB of the image's 1 GB.
          "firefox-esr"};
}

std::vector<std::string> build_packages(const ImageBuild& request) {
  std::vector<std::string> out = request.include;
  if (request.desktop)
    for (std::string& pkg : desktop_packages())
      if (std::find(out.begin(), out.end(), pkg) == out.end()) out.push_back(std::move(pkg));
  return out;
}

std::vector<std::string> in_subordinate_namespace(const ImageBuildMethod& method, std::vector<std::string> argv) {
  if (method.owners != ImageOwners::subordinate)
    throw Error("internal: a subordinate user namespace without subordinate ranges");
  std::vector<std::string> out = {"unshare",
                                  fmt::format("--map-users={},1,{}", method.uids.start, kSubordinateIds),
                                  fmt::format("--map-groups={},1,{}", method.gids.start, kSubordinateIds),
                                  "--map-root-user", "--"};
  out.insert(out.end(), std::make_move_iterator(argv.begin()), std::make_move_iterator(argv.end()));
  return out;
}

std::vector<std::string> image_build_argv(const ImageBuildMethod& method, const std::string& mmdebstrap,
                                          const ImageBuild& request, const std::vector<std::string>& options,
                                          const std::vector<std::string>& mirrors, const stdfs::path& rootfs) {
  // In the subordinate namespace mmdebstrap is uid 0 already: --mode=unshare then only makes its
  // mount and pid namespaces, and what it writes as root is the user's.
  const char* mode = method.owners == ImageOwners::root          ? "--mode=root"
                     : method.owners == ImageOwners::subordinate ? "--mode=unshare"
                                                                 : "--mode=fakechroot";
  std::vector<std::string> argv = {mmdebstrap, "--variant=apt", mode,
                                   "--customize-hook=rm -f \"$1" + std::string(kBuildOptionsFile) + "\""};
  if (const std::vector<std::string> packages = build_packages(request); !packages.empty())
    argv.push_back("--include=" + fmt::format("{}", fmt::join(packages, ",")));
  for (const auto& o : options) argv.push_back("--aptopt=" + o);
  argv.push_back(request.suite);
  argv.push_back(rootfs.string());
  for (const auto& m : mirrors) argv.push_back(m);  // none: mmdebstrap's own default mirror
  return method.owners == ImageOwners::subordinate ? in_subordinate_namespace(method, std::move(argv)) : argv;
}

std::string describe_build_method(const ImageBuildMethod& method) {
  switch (method.owners) {
    case ImageOwners::root:
      return "building as root (mmdebstrap --mode=root)";
    case ImageOwners::subordinate:
      return fmt::format(
          "building as {} in a user namespace (mmdebstrap --mode=unshare): uid and gid 0 inside are {}'s ({}:{}), "
          "1-{} are /etc/subuid's {}-{} and /etc/subgid's {}-{}",
          method.user, method.user, method.uid, method.gid, kSubordinateIds, method.uids.start,
          method.uids.start + kSubordinateIds - 1, method.gids.start, method.gids.start + kSubordinateIds - 1);
    case ImageOwners::user:
      return fmt::format(
          "building as {} without a range in /etc/subuid and /etc/subgid (mmdebstrap --mode=fakechroot): every file "
          "of the image is {}'s, and instances on it have only uid 0 (no distinct _apt or other system users); for "
          "those an administrator adds a range (usermod --add-subuids A-B --add-subgids A-B {}, 65536 ids no other "
          "line uses) and the image is built again",
          method.user, method.user, method.user);
  }
  return {};
}

std::size_t rewrite_build_root_links(const stdfs::path& rootfs) {
  // The build folder as given and as resolved: either may be what fakechroot put in front.
  std::vector<std::string> prefixes = {rootfs.lexically_normal().string()};
  std::error_code ec;
  const stdfs::path real = stdfs::canonical(rootfs, ec);
  if (!ec && real.string() != prefixes[0]) prefixes.push_back(real.string());
  for (auto& p : prefixes)
    while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::size_t rewritten = 0;
  for (auto it = stdfs::recursive_directory_iterator(rootfs); it != stdfs::recursive_directory_iterator(); ++it) {
    if (!it->is_symlink()) continue;
    const stdfs::path link = it->path();
    const std::string target = stdfs::read_symlink(link).string();
    std::string inside;
    for (const auto& p : prefixes) {
      if (target == p) inside = "/";
      else if (target.size() > p.size() && target.compare(0, p.size(), p) == 0 && target[p.size()] == '/')
        inside = target.substr(p.size());
      if (!inside.empty()) break;
    }
    if (inside.empty()) continue;
    // A new link beside it, renamed over it: the link is never missing.
    const stdfs::path tmp = link.parent_path() / fmt::format(".nshpc-link-{}", random::hex(4));
    if (::symlink(inside.c_str(), tmp.c_str()) != 0) throw SysError(errno, "symlink", tmp.string());
    if (::rename(tmp.c_str(), link.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw SysError(err, "rename", link.string());
    }
    ++rewritten;
  }
  return rewritten;
}

void validate_image_name(std::string_view name) {
  const bool ok = !name.empty() && name.size() <= 63 && std::isalnum(static_cast<unsigned char>(name[0])) &&
                  name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") ==
                      std::string_view::npos;
  if (!ok)
    throw UsageError(fmt::format("'{}' is not an image name: use 1-63 of A-Z a-z 0-9 _ . -, starting with a letter "
                                 "or digit",
                                 text::truncate_utf8(name, 80)));
}

std::vector<std::string> image_mirror_lines(const std::vector<std::string>& host_sources, std::string_view host_suite,
                                            std::string_view suite) {
  std::vector<std::string> out;
  auto add = [&](const std::string& uri, const std::string& host_dist, const std::vector<std::string>& components) {
    std::string line = fmt::format("deb {} {}", uri, rewrite_suite(host_dist, host_suite, suite));
    for (const auto& c : components) line += " " + c;
    if (std::find(out.begin(), out.end(), line) == out.end()) out.push_back(std::move(line));
  };
  for (const std::string& text : host_sources) {
    if (text.find("Types:") != std::string::npos || text.find("types:") != std::string::npos) {
      for (auto& p : deb822_paragraphs(text)) {
        if (lower(p["enabled"]) == "no") continue;
        const auto types = words(p["types"]);
        if (std::find(types.begin(), types.end(), "deb") == types.end()) continue;
        const auto components = words(p["components"]);
        for (const auto& uri : words(p["uris"]))
          for (const auto& dist : words(p["suites"])) add(uri, dist, components);
      }
      continue;
    }
    std::istringstream in{text};
    for (std::string line; std::getline(in, line);) {
      auto w = words(line);
      if (w.empty() || w[0] != "deb") continue;  // comments, deb-src
      std::size_t i = 1;
      if (i < w.size() && w[i].rfind('[', 0) == 0) {  // [options]
        while (i < w.size() && w[i].find(']') == std::string::npos) ++i;
        ++i;
      }
      if (i + 1 >= w.size()) continue;
      add(w[i], w[i + 1], std::vector<std::string>(w.begin() + static_cast<std::ptrdiff_t>(i) + 2, w.end()));
    }
  }
  return out;
}

std::vector<std::string> image_build_apt_options(std::string_view dump) {
  std::vector<std::string> out;
  std::string dir = "/", etc = "etc/apt/", netrcparts;
  std::istringstream in{std::string(dump)};
  for (std::string line; std::getline(in, line);) {
    const auto sp = line.find(' ');
    if (sp == std::string::npos) continue;
    const std::string key = line.substr(0, sp);
    std::string value = trim(line.substr(sp + 1));
    if (value.size() < 3 || value.front() != '"' || value.substr(value.size() - 2) != "\";") continue;
    value = value.substr(1, value.size() - 3);
    if (key == "Dir") dir = value;
    if (key == "Dir::Etc") etc = value;
    if (key == "Dir::Etc::netrcparts") netrcparts = value;
    // How the host reaches its mirror: proxies, timeouts, validity checks. Not the index
    // targets (what is downloaded is the image's business) and no value-less tree nodes.
    if (key.rfind("Acquire::", 0) == 0 && key.find("::IndexTargets") == std::string::npos && !value.empty())
      out.push_back(fmt::format("{} \"{}\"", key, value));
  }
  if (!netrcparts.empty()) {
    stdfs::path parts = netrcparts;
    if (parts.is_relative()) parts = stdfs::path(dir) / etc / parts;
    out.push_back(fmt::format("Dir::Etc::netrcparts \"{}\"", parts.lexically_normal().string()));
  }
  return out;
}

ImageStore::ImageStore(stdfs::path dir) : dir_(std::move(dir)) {}

std::vector<ImageVersion> ImageStore::list() const {
  std::vector<ImageVersion> out;
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : stdfs::directory_iterator(dir_, ec))
    if (e.is_directory() && e.path().filename().string()[0] != '.') names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    const std::string current = current_of(dir_ / name);
    std::vector<std::string> versions;
    for (const auto& e : stdfs::directory_iterator(dir_ / name, ec))
      if (e.is_directory() && !e.is_symlink() && e.path().filename().string()[0] != '.')
        versions.push_back(e.path().filename().string());
    std::sort(versions.rbegin(), versions.rend());  // newest first: versions are UTC times
    for (const auto& v : versions)
      if (auto info = read_version(dir_, name, v, current)) out.push_back(std::move(*info));
  }
  return out;
}

std::optional<ImageVersion> ImageStore::current(std::string_view name) const {
  validate_image_name(name);
  const std::string version = current_of(dir_ / std::string(name));
  if (version.empty()) return std::nullopt;
  return read_version(dir_, std::string(name), version, version);
}

std::optional<ImageVersion> ImageStore::find(std::string_view name, std::string_view version) const {
  validate_image_name(name);
  validate_image_name(version);
  return read_version(dir_, std::string(name), std::string(version), current_of(dir_ / std::string(name)));
}

ImageVersion ImageStore::build(const ImageBuild& request, const std::function<void(std::string_view)>& progress) {
  validate_image_name(request.name);
  validate_image_name(request.suite);
  for (const auto& pkg : request.include)
    if (pkg.empty() || pkg.find_first_of(", \t\n'\"") != std::string::npos || pkg[0] == '-')
      throw UsageError(fmt::format("'{}' is not a package name", text::truncate_utf8(pkg, 80)));
  const auto mmdebstrap = fs::find_program("mmdebstrap");
  if (!mmdebstrap)
    throw UsageError("mmdebstrap is not installed: install Debian's mmdebstrap package (apt-get install mmdebstrap)");
  const ImageBuildMethod method = image_build_method();
  if (method.owners == ImageOwners::subordinate) {
    for (const char* program : {"newuidmap", "newgidmap", "unshare"})
      if (!fs::find_program(program))
        throw UsageError(fmt::format("building an image as {} with the ranges of /etc/subuid and /etc/subgid needs {} "
                                     "(Debian's {} package); ask an administrator to install it",
                                     method.user, program, std::string_view(program) == "unshare" ? "util-linux" : "uidmap"));
  } else if (method.owners == ImageOwners::user) {
    for (const char* program : {"fakechroot", "fakeroot"})
      if (!fs::find_program(program))
        throw UsageError(fmt::format(
            "{} has no range in /etc/subuid and /etc/subgid and {} is not installed, so no image can be built: an "
            "administrator either adds a range of 65536 ids no other line uses (usermod --add-subuids A-B "
            "--add-subgids A-B {}; then the image has distinct system users such as _apt), or installs Debian's "
            "fakechroot and fakeroot packages (then every file of the image is {}'s and instances on it have only "
            "uid 0)",
            method.user, program, method.user, method.user));
  }

  fs::make_dirs(dir_ / kBuilding, 0755);
  // One build of a name at a time; what a crashed one left is swept under that lock.
  const fs::FileLock build_lock(dir_ / kBuilding / (request.name + ".lock"));
  if (request.only_if_missing)
    if (auto built = current(request.name)) return *built;  // another build made it meanwhile
  // Where any process sees how far it is (building()); gone before the new version is current,
  // so that building() never reports a build whose version is there (the lock is held a while
  // longer: set_current's fsync).
  const stdfs::path progress_file = dir_ / kBuilding / (request.name + ".progress");
  const std::int64_t started_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::system_clock::now().time_since_epoch()).count();
  auto note = [&](std::string_view line) {
    try {
      fs::atomic_write(progress_file,
                       json{{"pid", ::getpid()}, {"started_ms", started_ms}, {"line", std::string(line)}}.dump() + "\n", 0644);
    } catch (const std::exception& e) {
      log::debug("image build progress not written: {}", e.what());
    }
  };
  struct Forget {
    stdfs::path path;
    void now() const { ::unlink(path.c_str()); }
    ~Forget() { now(); }
  } forget{progress_file};
  note("removing what earlier builds of it left");
  sweep_building(dir_ / kBuilding, request.name + "-");
  note("reading the host's apt sources and options");
  const std::vector<std::string> mirrors = image_mirror_lines(host_sources(), host_codename(), request.suite);
  const CommandResult dump = run_command({"apt-config", "dump"}, {}, std::chrono::seconds(20));
  const std::vector<std::string> options = image_build_apt_options(dump.exit_code == 0 ? dump.out : "");

  const auto report = [&](std::string_view line) {
    note(line);
    if (progress) progress(line);
  };
  report(describe_build_method(method));
  const stdfs::path work = dir_ / kBuilding / fmt::format("{}-{}", request.name, random::hex(4));
  fs::make_dirs(work, 0755);
  struct Cleanup {
    stdfs::path path;
    bool armed = true;
    ~Cleanup() {
      if (!armed) return;
      try {
        remove_owned_tree(path);
      } catch (const std::exception& e) {
        log::warn("the failed image build's folder {} was not removed: {}", path.string(), e.what());
      }
    }
  } cleanup{work};

  const std::vector<std::string> argv = image_build_argv(method, *mmdebstrap, request, options, mirrors, work / "rootfs");
  const auto started = std::chrono::steady_clock::now();
  const CommandResult r = run_command(argv, {}, kBuildTimeout, 1024 * 1024, report);
  if (r.exit_code != 0 || r.timed_out)
    throw Error(fmt::format("building image '{}' failed: {}", request.name, describe_failure(argv, r)));
  if (stdfs::exists(work / "rootfs" / std::string(kBuildOptionsFile).substr(1)))
    throw Error(fmt::format("building image '{}': the build's apt options were not removed from the image", request.name));
  if (method.owners == ImageOwners::user) {
    const std::size_t links = rewrite_build_root_links(work / "rootfs");
    report(fmt::format("{} links to the build folder made by fakechroot now point inside the image", links));
    // Its instances have only uid 0 (sandbox/layers.hpp: a single-uid map): apt cannot switch to
    // _apt for its downloads, so it stays root.
    fs::make_dirs(work / "rootfs/etc/apt/apt.conf.d", 0755);
    fs::atomic_write(work / "rootfs/etc/apt/apt.conf.d/00ns-hpc-single-uid",
                     "// ns-hpc: this image's instances have a single uid (no /etc/subuid range), so apt's\n"
                     "// downloads run as root, not as _apt.\nAPT::Sandbox::User \"root\";\n",
                     0644);
  }

  const std::uint64_t bytes = built_tree_bytes(method, work / "rootfs");
  const fs::FileLock lock(dir_ / ".lock");
  fs::make_dirs(dir_ / request.name, 0755);
  // The build's UTC time to the second, e.g. 20261202T063443Z (-2, -3… within one second).
  const std::string stamp = timeutil::compact_utc().substr(0, 15) + "Z";
  std::string version = stamp;
  for (int n = 2; stdfs::exists(dir_ / request.name / version); ++n) version = stamp + "-" + std::to_string(n);
  json meta = {{"name", request.name},
                     {"version", version},
                     {"suite", request.suite},
                     {"include", request.include},
                     {"mirrors", mirrors},
                     {"built_at", timeutil::iso_utc()},
                     {"build_seconds", std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::steady_clock::now() - started).count()},
                     {"bytes", bytes},
                     {"owners", to_string(method.owners)},
                     {"desktop", request.desktop}};
  if (method.owners == ImageOwners::subordinate) {
    meta["subuid"] = method.uids.start;
    meta["subgid"] = method.gids.start;
  }
  fs::atomic_write(work / kMeta, meta.dump(2) + "\n", 0644);
  if (::rename(work.c_str(), (dir_ / request.name / version).c_str()) != 0)
    throw SysError(errno, "rename", (dir_ / request.name / version).string());
  cleanup.armed = false;
  forget.now();
  set_current(dir_ / request.name, version);
  return *read_version(dir_, request.name, version, version);
}

std::optional<BuildProgress> ImageStore::building(std::string_view name) const {
  validate_image_name(name);
  const stdfs::path lock = dir_ / kBuilding / (std::string(name) + ".lock");
  UniqueFd fd(::open(lock.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return std::nullopt;
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return std::nullopt;  // nobody holds it: no build
  const auto text = fs::read_file(dir_ / kBuilding / (std::string(name) + ".progress"));
  // No progress and a current version: an --if-missing build that found it, or a build making
  // its version current (the progress goes first). Neither builds anything.
  if (!text && current(name)) return std::nullopt;
  BuildProgress p;
  p.started = std::chrono::system_clock::now();
  const json doc = parse_json_or_discarded(text.value_or(""));
  if (doc.is_object()) {
    p.line = doc.value("line", "");
    p.pid = doc.value("pid", 0);
    p.started = std::chrono::system_clock::time_point(std::chrono::milliseconds(doc.value("started_ms", std::int64_t{0})));
  }
  return p;
}

BuildProgress BackgroundBuilds::start(const ImageBuild& request) {
  validate_image_name(request.name);
  std::lock_guard lock(mutex_);
  std::erase_if(children_, [](const auto& child) {
    siginfo_t info{};
    return ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(child.second.first.get()), &info,
                    WEXITED | WNOHANG) < 0 ||
           info.si_pid != 0;  // reaped now (or not ours to reap)
  });
  if (auto running = images_.building(request.name)) return *running;
  if (auto ours = children_.find(request.name); ours != children_.end()) return ours->second.second;
  if (!fs::find_program("mmdebstrap"))
    throw UsageError("mmdebstrap is not installed: install Debian's mmdebstrap package (apt-get install mmdebstrap)");
  fs::make_dirs(images_.dir() / kBuilding, 0755);
  const stdfs::path log_file = images_.dir() / kBuilding / (request.name + ".log");
  UniqueFd out(::open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!out) throw SysError(errno, "create", log_file.string());
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  SpawnSpec spec;
  spec.program = command_.at(0);
  spec.argv = command_;
  spec.argv.insert(spec.argv.end(), {"image", "build", request.name, "--if-missing", "--suite", request.suite});
  if (!request.include.empty()) spec.argv.push_back("--include=" + fmt::format("{}", fmt::join(request.include, ",")));
  if (request.desktop) spec.argv.push_back("--desktop");
  spec.fds = {{null.get(), 0}, {out.get(), 1}, {out.get(), 2}};
  spec.new_session = true;  // no terminal signal of the server's reaches it
  spec.cwd = "/";
  SpawnedChild child = spawn(spec);
  UniqueFd pidfd(::fcntl(child.pidfd(), F_DUPFD_CLOEXEC, 3));
  child.release();
  BuildProgress started;
  started.started = std::chrono::system_clock::now();
  started.line = "starting";
  started.pid = child.pid();
  children_[request.name] = {std::move(pidfd), started};
  return started;
}

void ImageStore::remove(std::string_view name_view, std::optional<std::string_view> only, const ImageUsers& in_use) {
  validate_image_name(name_view);
  const std::string name(name_view);
  fs::make_dirs(dir_, 0755);
  const fs::FileLock lock(dir_ / ".lock");
  std::vector<std::string> doomed, kept;
  for (const auto& v : list())
    if (v.name == name) (only && v.version != *only ? kept : doomed).push_back(v.version);
  if (doomed.empty())
    throw NotFound(NotFound::Kind::image, only ? fmt::format("image '{}' has no version '{}'", name, *only)
                                               : fmt::format("there is no image '{}'", name));
  std::vector<std::string> users;
  for (const auto& v : doomed)
    if (auto it = in_use.find(name + "@" + v); it != in_use.end())
      for (const auto& id : it->second) users.push_back(fmt::format("'{}' ({})", id, v));
  if (!users.empty())
    throw UsageError(fmt::format("image '{}' is in use by instance {}; delete those first (an archived instance "
                                 "keeps its image version for its restore)",
                                 name,
                                 fmt::join(users, ", ")));
  const std::string current = current_of(dir_ / name);
  const bool current_goes = std::find(doomed.begin(), doomed.end(), current) != doomed.end();
  if (current_goes) {
    if (kept.empty()) {
      ::unlink((dir_ / name / kCurrent).c_str());
    } else {
      set_current(dir_ / name, kept.front());  // the newest one left
    }
  }
  fs::make_dirs(dir_ / kBuilding, 0755);
  sweep_building(dir_ / kBuilding, "removed-");
  for (const auto& v : doomed) {
    // Aside first (one rename: the version is gone at once), then removed.
    const stdfs::path aside = dir_ / kBuilding / fmt::format("removed-{}-{}-{}", name, v, random::hex(4));
    if (::rename((dir_ / name / v).c_str(), aside.c_str()) != 0) throw SysError(errno, "rename", (dir_ / name / v).string());
    remove_owned_tree(aside);
  }
  if (kept.empty()) {
    std::error_code ec;
    stdfs::remove(dir_ / name, ec);  // empty now; a stray file keeps it, harmlessly
  }
}

}  // namespace nshpc::sandbox
