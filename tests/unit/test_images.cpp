// Images: where a build gets its mirror and apt options from, and the versioned store (list,
// current, removal refused while used). The build itself runs in `make test`'s set-up
// (scripts/test-image.sh) and is checked by the integration suite.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "sandbox/images.hpp"
#include "sandbox/layers.hpp"

namespace nshpc::sandbox {
namespace {

namespace stdfs = std::filesystem;

TEST(ImageMirrors, Deb822AndOneLineSourcesAreRewrittenForTheSuite) {
  const std::string deb822 =
      "Types: deb deb-src\n"
      "# http://snapshot.debian.org/archive/debian/20250520T000000Z\n"
      "URIs: http://deb.debian.org/debian\n"
      "Suites: bookworm bookworm-updates\n"
      "Components: main contrib\n"
      "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
      "\n"
      "Types: deb\n"
      "URIs: http://deb.debian.org/debian-security\n"
      "Suites: bookworm-security\n"
      "Components: main\n"
      "\n"
      "Types: deb\n"
      "Enabled: no\n"
      "URIs: http://disabled.example/debian\n"
      "Suites: bookworm\n"
      "Components: main\n";
  const std::string one_line =
      "# a comment\n"
      "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main non-free\n"
      "deb-src http://mirror.example/debian bookworm main\n"
      "deb http://deb.debian.org/debian bookworm main contrib\n";  // the same as above: once
  EXPECT_EQ(image_mirror_lines({deb822, one_line}, "bookworm", "trixie"),
            (std::vector<std::string>{"deb http://deb.debian.org/debian trixie main contrib",
                                      "deb http://deb.debian.org/debian trixie-updates main contrib",
                                      "deb http://deb.debian.org/debian-security trixie-security main",
                                      "deb http://mirror.example/debian trixie main non-free"}));
  // The host's own suite: kept as it is; a suite that is not the host's is left alone too.
  EXPECT_EQ(image_mirror_lines({"deb http://m/debian sid main\n"}, "bookworm", "bookworm"),
            (std::vector<std::string>{"deb http://m/debian sid main"}));
  EXPECT_TRUE(image_mirror_lines({"", "# nothing\n"}, "bookworm", "bookworm").empty());
}

TEST(ImageMirrors, TheBuildTakesTheHostsWayToItsMirrorAndOnlyThat) {
  const std::string dump =
      "Dir \"/\";\n"
      "Dir::Etc \"etc/apt/\";\n"
      "Dir::Etc::netrcparts \"auth.conf.d\";\n"
      "Acquire \"\";\n"
      "Acquire::http \"\";\n"
      "Acquire::http::Proxy \"http://user:secret@proxy.example:3128\";\n"
      "Acquire::Check-Valid-Until \"false\";\n"
      "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled \"false\";\n"
      "APT::Install-Recommends \"0\";\n";
  EXPECT_EQ(image_build_apt_options(dump),
            (std::vector<std::string>{"Acquire::http::Proxy \"http://user:secret@proxy.example:3128\"",
                                      "Acquire::Check-Valid-Until \"false\"",
                                      "Dir::Etc::netrcparts \"/etc/apt/auth.conf.d\""}));
  EXPECT_TRUE(image_build_apt_options("").empty());
}

TEST(ImageNames, FollowTheInstanceIdRule) {
  EXPECT_NO_THROW(validate_image_name("debian-12.base_1"));
  for (const char* bad : {"", "-x", ".x", "a/b", "a b", "..", "a@b"}) EXPECT_THROW(validate_image_name(bad), UsageError) << bad;
  EXPECT_THROW(validate_image_name(std::string(64, 'a')), UsageError);
}

class ImageStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = stdfs::temp_directory_path() / ("nshpc-images-" + std::to_string(::getpid()));
    stdfs::remove_all(dir_);
    stdfs::create_directories(dir_);
  }
  void TearDown() override { stdfs::remove_all(dir_); }

  // A finished version as a build leaves it (a root file system and image.json).
  void version(const std::string& name, const std::string& v, bool current) {
    stdfs::create_directories(dir_ / name / v / "rootfs" / "etc");
    std::ofstream(dir_ / name / v / "rootfs" / "etc" / "os-release") << "ID=debian\n";
    std::ofstream(dir_ / name / v / "image.json")
        << R"({"name":")" << name << R"(","version":")" << v << R"(","suite":"bookworm","include":["jq"],"bytes":4096,"built_at":"2026-12-01T10:00:00+00:00"})";
    if (current) {
      stdfs::remove(dir_ / name / "current");
      stdfs::create_directory_symlink(v, dir_ / name / "current");
    }
  }
  stdfs::path dir_;
};

TEST_F(ImageStoreTest, ListsVersionsNewestFirstAndKnowsTheCurrentOne) {
  version("base", "20261201T100000Z", false);
  version("base", "20261202T100000Z", true);
  version("gpu", "20261130T100000Z", true);
  stdfs::create_directories(dir_ / "base" / "20261203T100000Z");  // unfinished: no image.json
  stdfs::create_directories(dir_ / ".building" / "base-abcd");
  ImageStore images(dir_);
  const auto all = images.list();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].name + "@" + all[0].version, "base@20261202T100000Z");
  EXPECT_TRUE(all[0].current);
  EXPECT_EQ(all[1].version, "20261201T100000Z");
  EXPECT_FALSE(all[1].current);
  EXPECT_EQ(all[2].name, "gpu");
  EXPECT_EQ(all[0].include, std::vector<std::string>{"jq"});
  EXPECT_EQ(all[0].owners, ImageOwners::root) << "no \"owners\": built by root";
  EXPECT_EQ(all[0].rootfs, dir_ / "base" / "20261202T100000Z" / "rootfs");
  ASSERT_TRUE(images.current("base"));
  EXPECT_EQ(images.current("base")->version, "20261202T100000Z");
  EXPECT_FALSE(images.current("none"));
  EXPECT_TRUE(images.find("base", "20261201T100000Z"));
  EXPECT_FALSE(images.find("base", "20261203T100000Z"));
  EXPECT_THROW(images.find("base", "../gpu"), UsageError);
}

TEST_F(ImageStoreTest, AnImageSaysWhoseItsFilesAre) {
  stdfs::create_directories(dir_ / "mine" / "20261201T100000Z" / "rootfs");
  std::ofstream(dir_ / "mine" / "20261201T100000Z" / "image.json")
      << R"({"suite":"bookworm","owners":"subordinate","subuid":100000,"subgid":200000})";
  stdfs::create_directories(dir_ / "flat" / "20261201T100000Z" / "rootfs");
  std::ofstream(dir_ / "flat" / "20261201T100000Z" / "image.json") << R"({"suite":"bookworm","owners":"user"})";
  ImageStore images(dir_);
  const auto mine = images.find("mine", "20261201T100000Z");
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine->owners, ImageOwners::subordinate);
  EXPECT_EQ(mine->subuid, 100000u);
  EXPECT_EQ(mine->subgid, 200000u);
  EXPECT_EQ(images.find("flat", "20261201T100000Z")->owners, ImageOwners::user);
  EXPECT_EQ(to_string(ImageOwners::subordinate), "subordinate");
}

// A build holds .building/NAME.lock throughout and writes NAME.progress until just before its
// version becomes current; the lock held without progress while a version is current is an
// --if-missing build that found it, or a build's last step: nothing is being built.
TEST_F(ImageStoreTest, ABuildIsReportedWhileItsLockIsHeldUntilItsVersionIsThere) {
  stdfs::create_directories(dir_ / ".building");
  ImageStore images(dir_);
  EXPECT_FALSE(images.building("base"));
  {
    const fs::FileLock held(dir_ / ".building" / "base.lock");
    ASSERT_TRUE(images.building("base")) << "just started: no progress yet, no version";
    std::ofstream(dir_ / ".building" / "base.progress") << R"({"pid":1,"started_ms":1000,"line":"I: extracting"})";
    ASSERT_TRUE(images.building("base"));
    EXPECT_EQ(images.building("base")->line, "I: extracting");
    version("base", "20261202T100000Z", true);
    EXPECT_TRUE(images.building("base")) << "a rebuild of an image that has a version";
    stdfs::remove(dir_ / ".building" / "base.progress");
    EXPECT_FALSE(images.building("base")) << "its progress gone, its version there";
  }
  EXPECT_FALSE(images.building("base"));
}

TEST_F(ImageStoreTest, RemovalIsRefusedWhileUsedAndKeepsACurrentVersion) {
  version("base", "20261201T100000Z", false);
  version("base", "20261202T100000Z", true);
  ImageStore images(dir_);
  const ImageUsers users = {{"base@20261201T100000Z", {"alpha", "beta"}}};
  try {
    images.remove("base", std::nullopt, users);
    FAIL() << "removed an image in use";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'alpha' (20261201T100000Z), 'beta' (20261201T100000Z)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(images.list().size(), 2u);
  // The current version is not used: it goes, and the newest one left becomes current.
  images.remove("base", "20261202T100000Z", users);
  ASSERT_TRUE(images.current("base"));
  EXPECT_EQ(images.current("base")->version, "20261201T100000Z");
  EXPECT_FALSE(stdfs::exists(dir_ / "base" / "20261202T100000Z"));
  EXPECT_THROW(images.remove("base", "20261202T100000Z", {}), UsageError);
  EXPECT_THROW(images.remove("nothing", std::nullopt, {}), UsageError);
  // Unused now: the whole image goes.
  images.remove("base", std::nullopt, {});
  EXPECT_TRUE(images.list().empty());
  EXPECT_FALSE(stdfs::exists(dir_ / "base"));
}

TEST(ImageBuildMethods, TheFirstRangeOf65536ByNameOrUidIsTheOneUsed) {
  const std::string subuid =
      "# a comment\n"
      "bob:100000:65536\n"
      "alice:200000:1000\n"       // too small for an image
      "alice:x:65536\n"           // not a range
      "1001:300000:131072\n"      // alice's uid
      "alice:400000:65536\n";
  ASSERT_TRUE(first_subordinate_range(subuid, "alice", 1001));
  EXPECT_EQ(first_subordinate_range(subuid, "alice", 1001)->start, 300000u);
  EXPECT_EQ(first_subordinate_range(subuid, "alice", 1001)->count, 131072u);
  EXPECT_EQ(first_subordinate_range(subuid, "alice", 7)->start, 400000u);
  EXPECT_EQ(first_subordinate_range(subuid, "bob", 1002)->start, 100000u);
  EXPECT_FALSE(first_subordinate_range(subuid, "carol", 1003));
  EXPECT_FALSE(first_subordinate_range("", "bob", 1002));
  EXPECT_FALSE(first_subordinate_range("bob:4294960000:65536\n", "bob", 1002)) << "past the last id";
}

TEST(ImageBuildMethods, RootARangeInBothFilesOrNoneDecideHowTheBuildRuns) {
  EXPECT_EQ(image_build_method(true, "", "", "root", 0, 0).owners, ImageOwners::root);
  const ImageBuildMethod sub = image_build_method(false, "u:100000:65536\n", "u:200000:65536\n", "u", 1000, 1000);
  EXPECT_EQ(sub.owners, ImageOwners::subordinate);
  EXPECT_EQ(sub.uids.start, 100000u);
  EXPECT_EQ(sub.gids.start, 200000u);
  EXPECT_EQ(image_build_method(false, "other:100000:65536\n", "", "u", 1000, 1000).owners, ImageOwners::user);
  // A range in one file only: refused, naming the line an administrator adds.
  try {
    image_build_method(false, "u:100000:65536\n", "", "u", 1000, 1000);
    FAIL() << "a build with a uid range and no gid range";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("none in /etc/subgid"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("usermod --add-subgids 100000-165535 u"), std::string::npos) << e.what();
  }
  EXPECT_THROW(image_build_method(false, "", "u:100000:65536\n", "u", 1000, 1000), UsageError);
}

TEST(ImageBuildMethods, EachMethodsMmdebstrapCommandLine) {
  ImageBuild request;
  request.name = "base";
  request.include = {"ca-certificates", "jq"};
  const std::vector<std::string> options = {"Acquire::http::Proxy \"http://p:3128\""};
  const std::vector<std::string> mirrors = {"deb http://m/debian bookworm main"};
  const std::vector<std::string> tail = {"--customize-hook=rm -f \"$1/etc/apt/apt.conf.d/99mmdebstrap\"",
                                         "--include=ca-certificates,jq",
                                         "--aptopt=Acquire::http::Proxy \"http://p:3128\"",
                                         "bookworm",
                                         "/i/.building/base-1/rootfs",
                                         "deb http://m/debian bookworm main"};
  auto expect = [&](std::vector<std::string> head) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  const ImageBuildMethod root = image_build_method(true, "", "", "root", 0, 0);
  EXPECT_EQ(image_build_argv(root, "/usr/bin/mmdebstrap", request, options, mirrors, "/i/.building/base-1/rootfs"),
            expect({"/usr/bin/mmdebstrap", "--variant=apt", "--mode=root"}));
  // With ranges: mmdebstrap runs as uid 0 of a namespace where 0 is the user and 1..65536 the
  // ranges, so the image's root files are the user's and _apt's (42) are the range's start + 41.
  const ImageBuildMethod sub = image_build_method(false, "u:100000:65536\n", "u:200000:131072\n", "u", 1000, 1000);
  EXPECT_EQ(image_build_argv(sub, "/usr/bin/mmdebstrap", request, options, mirrors, "/i/.building/base-1/rootfs"),
            expect({"unshare", "--map-users=100000,1,65536", "--map-groups=200000,1,65536", "--map-root-user", "--",
                    "/usr/bin/mmdebstrap", "--variant=apt", "--mode=unshare"}));
  const ImageBuildMethod user = image_build_method(false, "", "", "u", 1000, 1000);
  EXPECT_EQ(image_build_argv(user, "/usr/bin/mmdebstrap", request, options, mirrors, "/i/.building/base-1/rootfs"),
            expect({"/usr/bin/mmdebstrap", "--variant=apt", "--mode=fakechroot"}));
  EXPECT_THROW(in_subordinate_namespace(user, {"true"}), Error);
  // The progress says how it runs and whose the files are.
  EXPECT_NE(describe_build_method(sub).find("/etc/subuid's 100000-165535 and /etc/subgid's 200000-265535"),
            std::string::npos) << describe_build_method(sub);
  EXPECT_NE(describe_build_method(user).find("mmdebstrap --mode=fakechroot): every file of the image is u's"),
            std::string::npos) << describe_build_method(user);
}

TEST(ImageBuildMethods, FakechrootsLinksIntoTheBuildFolderPointInsideTheImage) {
  const stdfs::path root = stdfs::temp_directory_path() / ("nshpc-links-" + std::to_string(::getpid())) / "rootfs";
  stdfs::remove_all(root.parent_path());
  stdfs::create_directories(root / "etc/ssl/certs");
  stdfs::create_directories(root / "usr/lib");
  stdfs::create_symlink(root / "usr/lib/os-release", root / "etc/os-release");
  stdfs::create_symlink(root.string() + "/usr/share/ca-certificates/a.crt", root / "etc/ssl/certs/a.pem");
  stdfs::create_symlink(root, root / "usr/lib/top");
  stdfs::create_symlink("/usr/bin/true", root / "usr/lib/host-style");      // already inside
  stdfs::create_symlink("../lib/os-release", root / "usr/lib/relative");   // relative
  stdfs::create_symlink(root.string() + "-other/x", root / "usr/lib/near");  // a longer name, not the folder
  stdfs::create_directory_symlink(root / "usr/lib", root / "lib");         // a link to a folder: not followed
  EXPECT_EQ(rewrite_build_root_links(root), 4u);
  EXPECT_EQ(stdfs::read_symlink(root / "etc/os-release"), "/usr/lib/os-release");
  EXPECT_EQ(stdfs::read_symlink(root / "etc/ssl/certs/a.pem"), "/usr/share/ca-certificates/a.crt");
  EXPECT_EQ(stdfs::read_symlink(root / "usr/lib/top"), "/");
  EXPECT_EQ(stdfs::read_symlink(root / "lib"), "/usr/lib");
  EXPECT_EQ(stdfs::read_symlink(root / "usr/lib/host-style"), "/usr/bin/true");
  EXPECT_EQ(stdfs::read_symlink(root / "usr/lib/relative"), "../lib/os-release");
  EXPECT_EQ(stdfs::read_symlink(root / "usr/lib/near"), root.string() + "-other/x");
  EXPECT_EQ(rewrite_build_root_links(root), 0u) << "nothing left to rewrite";
  for (const auto& e : stdfs::recursive_directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().rfind(".nshpc-link-", 0), std::string::npos) << e.path();
  stdfs::remove_all(root.parent_path());
}

// Root's ranges for image instances start 65536-aligned above 2^20, every subordinate range and
// every account, so no instance's files ever belong to a user or another tool's range.
TEST(ImageUids, RootsRangesStartAboveEverySubordinateRangeAndAccount) {
  EXPECT_EQ(root_range_floor("", "", "", ""), 1u << 20);
  EXPECT_EQ(root_range_floor("alice:100000:65536\n", "", "root:x:0:0::/root:/bin/sh\n", ""), 1u << 20);
  EXPECT_EQ(root_range_floor("alice:100000:65536\nbob:1048576:65536\n", "", "", ""), 1114112u);
  EXPECT_EQ(root_range_floor("", "carol:2000000:10\n", "", ""), 2031616u);  // rounded up to 65536
  EXPECT_EQ(root_range_floor("", "", "big:x:3000000:100::/:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n", ""),
            3014656u);
  EXPECT_EQ(root_range_floor("# comment\nbroken line\nx:y:z\n", "", "", "g:x:4294967294:\n"), 1u << 20)
      << "nobody's -2 and lines that are not ranges do not move it";
}

}  // namespace
}  // namespace nshpc::sandbox
