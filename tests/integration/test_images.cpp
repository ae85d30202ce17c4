// Images as a user meets them: `ns-hpc image build|list|rm`. The build itself is `make test`'s
// set-up (scripts/test-image.sh builds image 'test' once with `ns-hpc image build`, reaching the
// mirror the host's apt uses, and caches it outside the clone); these tests read what it made
// and never reach the network.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

fs::path image_cache() { return test_image_cache() / "images"; }

// The current version of image 'test' as `image list --json` shows it; null when it is not there.
json listed_test_image(Env& env) {
  Result listed = env.run({"image", "list", "--json"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  json test;
  for (const auto& v : nshpc::parse_json_or_discarded(listed.out))
    if (v.is_object() && v["name"] == "test" && v["current"] == true) test = v;
  return test;
}

// The host's apt sources, as text (one-line and deb822 files alike).
std::string host_sources() {
  std::string all = read_text("/etc/apt/sources.list");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/etc/apt/sources.list.d", ec)) all += read_text(e.path());
  return all;
}

// Image 'test' as make test's set-up built it, listed by a server on the cache.
class ImagesBuilt : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cache / "test" / "current"))
      GTEST_SKIP() << "no image 'test' in " << cache << ": scripts/test-image.sh (run by make test) builds it";
    test = listed_test_image(env);
    ASSERT_TRUE(test.is_object());
  }
  const fs::path cache = image_cache();
  Env env{"images_dir = \"" + cache.string() + "\"\n"};
  json test;
};

}  // namespace

TEST_F(ImagesBuilt, TheImageIsListedWithItsSourcesAndWithoutTheBuildsAptOptions) {
  EXPECT_EQ(test["suite"], "bookworm");
  EXPECT_GT(test["bytes"].get<std::uint64_t>(), 50u * 1024 * 1024) << "a whole Debian root";
  EXPECT_EQ(test["instances"], json::array());
  const fs::path rootfs = test["rootfs"].get<std::string>();
  EXPECT_EQ(rootfs, cache / "test" / test["version"].get<std::string>() / "rootfs");
  EXPECT_TRUE(fs::exists(rootfs / "usr/bin/apt-get"));
  EXPECT_TRUE(fs::exists(rootfs / "usr/share/ca-certificates")) << "--include ca-certificates";
  // The host's way to its mirror served the build only: nothing of it stays in the image.
  EXPECT_FALSE(fs::exists(rootfs / "etc/apt/apt.conf.d/99mmdebstrap"));
  // Its sources are the host's mirrors, rewritten for the suite.
  const std::string sources = read_text(rootfs / "etc/apt/sources.list");
  const std::string host = host_sources();
  std::istringstream lines(sources);
  int entries = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("deb ", 0) != 0) continue;
    ++entries;
    std::istringstream words(line.substr(4));
    std::string uri;
    words >> uri;
    EXPECT_NE(host.find(uri), std::string::npos) << uri << " is not one of the host's mirrors";
  }
  EXPECT_GT(entries, 0) << sources;
  Result text = env.run({"image", "list"});
  EXPECT_NE(text.out.find("test"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("MiB"), std::string::npos) << text.out;
}

// Whose the built image's files are, as `image list` says and as the files are on the host: root
// built it with root's ids; a normal user with a range (nshpc-sub in make test) in a namespace
// where 0 is the user and k the range's start + k - 1; a user without one (nshpc-test) with
// fakechroot, every file the user's and no link left pointing into the build folder.
TEST_F(ImagesBuilt, TheImagesFilesBelongToWhatItsOwnersSay) {
  const fs::path rootfs = test["rootfs"].get<std::string>();
  auto owner = [&](const char* path) {
    struct stat st {};
    EXPECT_EQ(::lstat((rootfs / path).c_str(), &st), 0) << path;
    return std::pair<uid_t, gid_t>(st.st_uid, st.st_gid);
  };
  const std::string owners = test["owners"];
  const auto me = std::pair<uid_t, gid_t>(::geteuid(), ::getegid());
  if (::geteuid() == 0) {
    EXPECT_EQ(owners, "root");
    EXPECT_EQ(owner("etc/passwd"), me);
    EXPECT_EQ(owner("var/cache/apt/archives/partial").first, 42u) << "_apt";
  } else if (owners == "subordinate") {
    const uid_t subuid = test["subuid"];
    const gid_t subgid = test["subgid"];
    EXPECT_EQ(owner("etc/passwd"), me) << "uid 0 inside is the user";
    EXPECT_EQ(owner("usr/bin/apt-get"), me);
    EXPECT_EQ(owner("var/cache/apt/archives/partial"), std::make_pair(subuid + 41, me.second)) << "_apt (42)";
    EXPECT_EQ(owner("etc/shadow"), std::make_pair(me.first, subgid + 41)) << "group shadow (42)";
  } else {
    EXPECT_EQ(owners, "user");
    std::size_t files = 0;
    for (auto it = fs::recursive_directory_iterator(rootfs); it != fs::recursive_directory_iterator(); ++it) {
      struct stat st {};
      ASSERT_EQ(::lstat(it->path().c_str(), &st), 0) << it->path();
      ASSERT_EQ(std::make_pair(st.st_uid, st.st_gid), me) << it->path() << " is not the user's";
      if (it->is_symlink()) {
        EXPECT_EQ(fs::read_symlink(it->path()).string().find(cache.string()), std::string::npos)
            << it->path() << " -> " << fs::read_symlink(it->path()) << " points into the image cache";
      }
      ++files;
    }
    EXPECT_GT(files, 5000u) << "a whole Debian root";
    EXPECT_EQ(fs::read_symlink(rootfs / "etc/rmt"), "/usr/sbin/rmt") << "an absolute link, rewritten";
  }
}

TEST(Images, BadNamesAndMissingImagesAreClearErrorsBeforeAnythingRuns) {
  Env env("images_dir = \"" + (fs::path(::testing::TempDir()) / ("nshpc-images-" + std::to_string(::getpid()))).string() +
          "\"\n");
  Result bad = env.run({"image", "build", "no/slash"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("'no/slash' is not an image name"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out, "");
  Result pkg = env.run({"image", "build", "x", "--include", "jq,-o=evil"});
  EXPECT_EQ(pkg.exit_code, 1);
  EXPECT_NE(pkg.err.find("'-o=evil' is not a package name"), std::string::npos) << pkg.err;
  Result missing = env.run({"image", "rm", "nothing"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("there is no image 'nothing'; "), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("'ns-hpc image list' lists the images"), std::string::npos) << missing.err;
  Result none = env.run({"image", "list"});
  EXPECT_EQ(none.exit_code, 0);
  EXPECT_NE(none.out.find("No images; build one with 'ns-hpc image build NAME'."), std::string::npos) << none.out;
}

// doctor tries a writable layer over an image for real, and says which uid mapping instances on
// an image get: root's own range, a /etc/subuid range, or a single uid.
TEST(Images, DoctorTriesALayerOverAnImageAndNamesTheUidMapping) {
  Env env("images_dir = \"" + (fs::path(::testing::TempDir()) / ("nshpc-doctor-images-" + std::to_string(::getpid()))).string() +
          "\"\n");
  Result r = env.run({"doctor", "--json"});
  json layers, builds;
  const json doc = nshpc::parse_json(r.out);
  for (const auto& c : doc["checks"]) {
    if (c["name"].get<std::string>().rfind("image roots", 0) == 0) layers = c;
    if (c["name"].get<std::string>().rfind("image builds", 0) == 0) builds = c;
  }
  ASSERT_TRUE(layers.is_object()) << r.out << r.err;
  ASSERT_TRUE(builds.is_object()) << r.out;
  EXPECT_FALSE(layers["required"].get<bool>());
  // This machine (kernel 6.x) can, as root and as a normal user.
  EXPECT_TRUE(layers["ok"].get<bool>()) << layers.dump();
  const std::string detail = layers["detail"];
  if (::geteuid() == 0) {
    EXPECT_NE(detail.find("an idmapped image under an overlay works"), std::string::npos) << detail;
    EXPECT_NE(detail.find("root's own ranges from "), std::string::npos) << detail;
    EXPECT_TRUE(builds["ok"].get<bool>()) << builds.dump();
  } else {
    EXPECT_NE(detail.find("an overlay in a user namespace (userxattr) works"), std::string::npos) << detail;
    EXPECT_TRUE(detail.find("your /etc/subuid range") != std::string::npos || detail.find("only uid 0 inside") != std::string::npos)
        << detail;
  }
  // The probe leaves nothing behind, and no mount.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(::testing::TempDir()) / ("nshpc-doctor-images-" + std::to_string(::getpid())), ec))
    ADD_FAILURE() << "left behind: " << e.path();
  std::ifstream mounts("/proc/self/mountinfo");
  std::string all((std::istreambuf_iterator<char>(mounts)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all.find("layer-probe"), std::string::npos);
}

// A server whose default image is missing builds it in the background at start: a
// create_instance on it meanwhile answers at once that it is being built and how far, `image
// list` shows the build, and once it is done the instance is made. mmdebstrap is stood in for by
// a script (a real build reaches the mirror, which no test may).
TEST(Images, TheServerBuildsAMissingDefaultImageInTheBackgroundAndSaysHowFarItIs) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("nshpc-bg-images-" + std::to_string(::getpid()));
  fs::create_directories(dir / "bin");
  {
    std::ofstream fake(dir / "bin/mmdebstrap");
    fake << "#!/bin/sh\n"
            "# stands in for mmdebstrap: a tiny root after a few seconds, saying how far it is\n"
            "for a; do case $a in */rootfs) root=$a;; esac; done\n"
            "echo 'I: fake mmdebstrap: resolving dependencies' >&2\n"
            "sleep 4\n"
            "mkdir -p \"$root/usr/bin\" \"$root/etc\" && echo 'ID=fake' > \"$root/etc/os-release\"\n"
            "echo 'I: success' >&2\n";
  }
  fs::permissions(dir / "bin/mmdebstrap", fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                              fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                           fs::perms::others_read | fs::perms::others_exec);
  Env env("images_dir = \"" + (dir / "images").string() + "\"\ndefault_image = \"fakeimg\"\n");
  const std::string path = "PATH=" + (dir / "bin").string() + ":/usr/local/bin:/usr/bin:/bin";
  McpSession mcp(env, {path});

  const json early = mcp.call_and_wait("create_instance", {{"instance_id", "bg-early"}, {"image", ""}});
  ASSERT_TRUE(early["result"].value("isError", false)) << early.dump();
  const std::string said = result_text(early);
  EXPECT_NE(said.find("image 'fakeimg' is being built"), std::string::npos) << said;
  EXPECT_NE(said.find("call create_instance again"), std::string::npos) << said;
  EXPECT_FALSE(fs::exists(env.instances() / "bg-early"));

  Result listed;
  EXPECT_TRUE(eventually(
      [&] {
        listed = env.run({"image", "list"}, "", std::chrono::seconds(60), {path});
        return listed.out.find("Being built: 'fakeimg'") != std::string::npos;
      },
      std::chrono::seconds(3)))
      << listed.out << listed.err;

  // Once built, the instance is made.
  EXPECT_TRUE(eventually(
      [&] {
        Result now = env.run({"image", "list", "--json"}, "", std::chrono::seconds(60), {path});
        return now.out.find("\"current\": true") != std::string::npos;
      },
      std::chrono::seconds(60)));
  const json made = mcp.call_and_wait("create_instance", {{"instance_id", "bg-made"}, {"image", ""}});
  ASSERT_FALSE(made["result"].value("isError", false)) << made.dump();
  EXPECT_EQ(made["result"]["structuredContent"]["root"].get<std::string>().rfind("image:fakeimg@", 0), 0u) << made.dump();
  EXPECT_NE(read_text(dir / "images/.building/fakeimg.log").find("I: success"), std::string::npos);
  // One build only, though two calls and a listing looked while it ran.
  Result versions = env.run({"image", "list", "--json"}, "", std::chrono::seconds(60), {path});
  EXPECT_EQ(nshpc::parse_json(versions.out).size(), 1u) << versions.out;
  fs::remove_all(dir);
}
