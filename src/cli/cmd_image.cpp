// ns-hpc image build|list|rm: the Debian root file systems instances can run on.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.hpp"
#include "base/json.hpp"
#include "cli/app.hpp"
#include "cli/output.hpp"
#include "sandbox/images.hpp"
#include "store/store.hpp"

namespace nshpc::cli {

namespace {

// The prefix of an instance's `root` in its metadata.json when it runs on an image:
// "image:<name>@<version>".
constexpr std::string_view kImageRoot = "image:";

sandbox::ImageStore image_store(Invocation& inv) { return sandbox::ImageStore(inv.config().ns.images_dir); }

// Which instances use which image version.
sandbox::ImageUsers image_users(Invocation& inv) {
  sandbox::ImageUsers users;
  for (const auto& inst : inv.store().list().instances) {
    const std::string root = inst.meta.raw.value("root", "");
    if (root.rfind(kImageRoot, 0) == 0) users[root.substr(kImageRoot.size())].push_back(inst.id);
  }
  // An archived instance comes back on the same image version when restored.
  for (const auto& arch : inv.store().list_archived()) {
    const std::string root = arch.meta.raw.value("root", "");
    if (root.rfind(kImageRoot, 0) == 0) users[root.substr(kImageRoot.size())].push_back(arch.name + " (archived)");
  }
  return users;
}

std::string mib(std::uint64_t bytes) { return fmt::format("{:.0f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

}  // namespace

void add_image_commands(CLI::App& app, Invocation& inv) {
  auto* image = app.add_subcommand("image", "Build, list and remove the Debian images instances can run on");
  image->require_subcommand(1);

  auto request = std::make_shared<sandbox::ImageBuild>();
  auto* build = image->add_subcommand(
      "build",
      "Build a new version of an image with mmdebstrap, from the mirror the host's apt uses (its proxy and "
      "credentials serve the build and are not copied into the image). Instances made from an older version keep "
      "it. As root: mmdebstrap --mode=root. As a normal user with a range of 65536 ids in /etc/subuid and "
      "/etc/subgid: mmdebstrap in a user namespace where 0 is you and 1-65536 the range (newuidmap, Debian's uidmap "
      "package), so the image has distinct system users such as _apt. Without a range: mmdebstrap "
      "--mode=fakechroot (Debian's fakechroot and fakeroot packages), chosen automatically: every file is yours "
      "and instances on it have only uid 0; an administrator can add a range (usermod --add-subuids A-B "
      "--add-subgids A-B USER).");
  build->add_option("name", request->name, "Image name (1-63 of A-Z a-z 0-9 _ . -)")->required();
  build->add_option("--suite", request->suite, "Debian suite (default bookworm)");
  build->add_option("--include", request->include, "More packages, comma-separated")->delimiter(',');
  build->add_flag("--if-missing", request->only_if_missing, "Build only when the image has no version yet");
  build->add_flag("--desktop", request->desktop,
                  "Add the desktop: Xvfb, Xfce (panel, terminal, Thunar, Mousepad), a session bus, AT-SPI, fonts, "
                  "icons, firefox-esr and the X tools (xdotool, wmctrl, xclip, x11-utils, x11vnc); about 1 GB. Only "
                  "instances on such an image can switch their desktop on ([desktop] image names the one desktop "
                  "computers get)");
  build->callback([&inv, request] {
    sandbox::validate_image_name(request->name);
    const sandbox::ImageVersion v = build_image(image_store(inv), *request);
    std::printf("Built image '%s' version %s (%s%s) at %s\n", v.name.c_str(), v.version.c_str(), mib(v.bytes).c_str(),
                v.desktop ? ", with the desktop" : "", v.rootfs.c_str());
  });

  auto json_out = std::make_shared<bool>(false);
  auto* list = image->add_subcommand(
      "list", "List images: every version, whether it has the desktop, its size and age, and the instances on it");
  list->add_flag("--json", *json_out, "Print a JSON array");
  list->callback([&inv, json_out] {
    const auto users = image_users(inv);
    nlohmann::json out = nlohmann::json::array();
    std::vector<std::vector<std::string>> rows{
        {"IMAGE", "VERSION", "CURRENT", "DESKTOP", "SUITE", "SIZE", "BUILT", "INSTANCES"}};
    for (const auto& v : image_store(inv).list()) {
      const auto it = users.find(v.name + "@" + v.version);
      const std::vector<std::string> on = it == users.end() ? std::vector<std::string>{} : it->second;
      out.push_back({{"name", v.name},
                     {"version", v.version},
                     {"current", v.current},
                     {"suite", v.suite},
                     {"include", v.include},
                     {"bytes", v.bytes},
                     {"built_at", v.built_at},
                     {"rootfs", v.rootfs.string()},
                     {"owners", sandbox::to_string(v.owners)},
                     {"desktop", v.desktop},
                     {"instances", on}});
      if (v.owners == sandbox::ImageOwners::subordinate) {
        out.back()["subuid"] = v.subuid;
        out.back()["subgid"] = v.subgid;
      }
      rows.push_back({v.name, v.version, v.current ? "yes" : "", v.desktop ? "yes" : "", v.suite, mib(v.bytes),
                      short_time(v.built_at),
                      on.empty() ? "-" : fmt::format("{}", fmt::join(on, ","))});
    }
    // Builds going on now (the server's background build of the default image, another shell's).
    std::vector<std::string> building;
    const sandbox::ImageStore images = image_store(inv);
    std::set<std::string> names{inv.config().ns.default_image};
    for (const auto& v : images.list()) names.insert(v.name);
    for (const auto& name : names) {
      if (name.empty()) continue;
      const auto b = images.building(name);
      if (!b) continue;
      const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now() - b->started).count();
      out.push_back({{"name", name}, {"building", true}, {"building_for_seconds", seconds}, {"progress", b->line}});
      building.push_back(fmt::format("Being built: '{}' ({} s so far; now: {})", name, seconds, b->line));
    }
    if (*json_out) {
      print_json(out);
    } else if (rows.size() == 1 && building.empty()) {
      std::puts("No images; build one with 'ns-hpc image build NAME'.");
    } else {
      if (rows.size() > 1) print_table(rows);
      for (const auto& line : building) std::puts(line.c_str());
    }
  });

  auto target = std::make_shared<std::string>();
  auto* rm = image->add_subcommand("rm", "Remove an image (NAME) or one version (NAME@VERSION); refused while an instance uses it");
  rm->add_option("image", *target, "NAME or NAME@VERSION")->required();
  rm->callback([&inv, target] {
    const auto at = target->find('@');
    const std::string name = target->substr(0, at);
    const std::optional<std::string> version =
        at == std::string::npos ? std::nullopt : std::optional<std::string>(target->substr(at + 1));
    image_store(inv).remove(name, version, image_users(inv));
    std::printf("Removed image %s\n", target->c_str());
  });
}

}  // namespace nshpc::cli
