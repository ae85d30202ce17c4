// Images: where a build gets its mirror and apt options from, and the versioned store (list,
// current, removal refused while used). The build itself runs in `make test`'s set-up
// (scripts/test-image.sh) and is checked by the integration suite.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "base/error.hpp"
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
  EXPECT_EQ(all[0].rootfs, dir_ / "base" / "20261202T100000Z" / "rootfs");
  ASSERT_TRUE(images.current("base"));
  EXPECT_EQ(images.current("base")->version, "20261202T100000Z");
  EXPECT_FALSE(images.current("none"));
  EXPECT_TRUE(images.find("base", "20261201T100000Z"));
  EXPECT_FALSE(images.find("base", "20261203T100000Z"));
  EXPECT_THROW(images.find("base", "../gpu"), UsageError);
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
