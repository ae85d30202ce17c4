// The desktop's pieces that need no display: the session's commands (their script parses, refuses
// what Xvfb cannot make and names what a root lacks), the image build's --desktop, and the
// accessibility answers, good and hostile (they come from the sandbox), with the seed's text and
// JSON. The session itself runs in tests/integration/test_desktop_session.cpp.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/json.hpp"
#include "base/process.hpp"
#include "base/text.hpp"
#include "common/temp_dir.hpp"
#include "desktop/atspi.hpp"
#include "desktop/session.hpp"
#include "desktop/wire.hpp"
#include "sandbox/images.hpp"

namespace nshpc::desktop {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

bool contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// --- The session's commands ---

TEST(DesktopSession, StartAndStopAreBashScriptsThatParse) {
  const std::vector<std::string> start = start_command({1024, 768, 24});
  ASSERT_EQ(start.size(), 8u);
  EXPECT_EQ(start[0], "bash");
  EXPECT_EQ(start[1], "-c");
  EXPECT_EQ(std::vector<std::string>(start.begin() + 3, start.end()),
            (std::vector<std::string>{"ns-hpc-desktop", "start", "1024", "768", "24"}));
  const std::vector<std::string> stop = stop_command();
  EXPECT_EQ(std::vector<std::string>(stop.begin() + 3, stop.end()), (std::vector<std::string>{"ns-hpc-desktop", "stop"}));
  EXPECT_EQ(stop[2], start[2]) << "one script, two entry points";
  const CommandResult syntax = run_command({"bash", "-n", "-c", start[2]});
  EXPECT_EQ(syntax.exit_code, 0) << syntax.err;
}

TEST(DesktopSession, AGeometryXvfbCannotMakeIsRefused) {
  EXPECT_NO_THROW(start_command({320, 200, 16}));
  EXPECT_NO_THROW(start_command({7680, 4320, 24}));
  for (const Geometry& bad : {Geometry{319, 800, 24}, Geometry{1280, 4321, 24}, Geometry{1280, 800, 32},
                              Geometry{-1280, 800, 24}, Geometry{1280, 800, 8}})
    EXPECT_THROW(start_command(bad), UsageError) << bad.width << "x" << bad.height << "x" << bad.depth;
}

// Run where nothing is on PATH, the start command fails before it touches anything, naming each
// program and its package.
TEST(DesktopSession, AStartOnARootWithoutTheProgramsNamesWhatIsMissing) {
  std::vector<std::string> argv = {"env", "PATH=/nonexistent", "/bin/bash"};
  const std::vector<std::string> start = start_command({});
  argv.insert(argv.end(), start.begin() + 1, start.end());
  const CommandResult r = run_command(argv, "not an Xauthority file");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  for (const char* named : {"Xvfb (Debian package xvfb)", "xfwm4 (Debian package xfwm4)",
                            "xfdesktop (Debian package xfdesktop4)", "flock (Debian package util-linux)"})
    EXPECT_NE(r.err.find(named), std::string::npos) << named << " in: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
}

TEST(DesktopSession, CommandsGetTheDisplayTheBusAndTheAccessibilitySwitches) {
  const auto env = session_env();
  auto value = [&](std::string_view name) {
    for (const auto& [n, v] : env)
      if (n == name) return v;
    return std::string("(unset)");
  };
  EXPECT_EQ(value("DISPLAY"), ":0");
  EXPECT_EQ(value("XAUTHORITY"), kXauthority);
  EXPECT_EQ(value("DBUS_SESSION_BUS_ADDRESS"), kSessionBus);
  EXPECT_EQ(value("XDG_RUNTIME_DIR"), kRuntimeDir);
  EXPECT_EQ(value("QT_ACCESSIBILITY"), "1");
  EXPECT_EQ(value("GNOME_ACCESSIBILITY"), "1");
  EXPECT_EQ(value("XDG_CURRENT_DESKTOP"), "XFCE");
}

// --- The image build's --desktop ---

TEST(DesktopImage, TheDesktopPackagesHoldEverythingTheSessionRuns) {
  const std::vector<std::string> packages = sandbox::desktop_packages();
  for (const std::string& needed : required_packages()) {
    if (needed == "util-linux") continue;  // essential: in every Debian root
    EXPECT_TRUE(contains(packages, needed)) << needed;
  }
  for (const char* also : {"python3-pyatspi", "gir1.2-atspi-2.0", "mousepad", "thunar", "xfce4-terminal", "firefox-esr",
                           "xdotool", "wmctrl", "xclip", "x11-utils", "fonts-noto-color-emoji"})
    EXPECT_TRUE(contains(packages, also)) << also;
}

TEST(DesktopImage, ADesktopBuildInstallsThemOnceBesideIncludes) {
  sandbox::ImageBuild plain{.name = "d", .include = {"jq", "xdotool"}};
  EXPECT_EQ(sandbox::build_packages(plain), (std::vector<std::string>{"jq", "xdotool"}));
  sandbox::ImageBuild desktop = plain;
  desktop.desktop = true;
  const std::vector<std::string> packages = sandbox::build_packages(desktop);
  EXPECT_EQ(packages.size(), sandbox::desktop_packages().size() + 1) << "jq added, xdotool once";
  EXPECT_EQ(std::count(packages.begin(), packages.end(), "xdotool"), 1);

  sandbox::ImageBuildMethod root;
  const auto argv = sandbox::image_build_argv(root, "/usr/bin/mmdebstrap", desktop, {}, {}, "/tmp/r");
  const auto include = std::find_if(argv.begin(), argv.end(), [](const std::string& a) { return a.starts_with("--include="); });
  ASSERT_NE(include, argv.end());
  std::vector<std::string> installed;
  for (std::string_view pkg : text::split(std::string_view(*include).substr(10), ',')) installed.emplace_back(pkg);
  EXPECT_EQ(installed, packages);
  const auto plain_argv = sandbox::image_build_argv(root, "/usr/bin/mmdebstrap", plain, {}, {}, "/tmp/r");
  EXPECT_NE(std::find(plain_argv.begin(), plain_argv.end(), "--include=jq,xdotool"), plain_argv.end());
}

TEST(DesktopImage, AVersionSaysWhetherItWasBuiltWithTheDesktop) {
  tests::TempDir dir("nshpc-desktop-images");
  auto version = [&](const std::string& name, const std::string& meta) {
    stdfs::create_directories(dir.path() / name / "20261201T100000Z" / "rootfs");
    std::ofstream(dir.path() / name / "20261201T100000Z" / "image.json") << meta;
    stdfs::create_directory_symlink("20261201T100000Z", dir.path() / name / "current");
  };
  version("desk", R"({"suite":"bookworm","desktop":true})");
  version("plain", R"({"suite":"bookworm","desktop":false})");
  version("old", R"({"suite":"bookworm"})");  // built before --desktop existed
  const sandbox::ImageStore images(dir.path());
  ASSERT_TRUE(images.find("desk", "20261201T100000Z"));
  EXPECT_TRUE(images.find("desk", "20261201T100000Z")->desktop);
  EXPECT_TRUE(images.current("desk")->desktop);
  EXPECT_FALSE(images.current("plain")->desktop);
  EXPECT_FALSE(images.current("old")->desktop);
}

// --- Accessibility answers ---

// The shape the helper prints: Mousepad under the panel, as read from a real session.
const char* const kGood = R"({"format":"at-spi-snapshot-v1","truncated":false,"nodes":[
 {"ref":"atspi:0","parent_ref":null,"role":"application","name":"xfce4-panel","depth":0,"focused":false,"focusable":false,"enabled":false},
 {"ref":"atspi:0/2/0/2/0/0","parent_ref":"atspi:0","role":"push button","name":"Terminal Emulator","depth":5,"focused":false,"focusable":true,"enabled":true,"bounds":{"x":544,"y":752,"width":48,"height":48},"actions":["click"]},
 {"ref":"atspi:4","parent_ref":null,"role":"application","name":"mousepad","depth":0,"focused":false,"focusable":false,"enabled":false},
 {"ref":"atspi:4/0","parent_ref":"atspi:4","role":"frame","name":"Untitled 1 - Mousepad","depth":1,"focused":false,"focusable":false,"enabled":true,"bounds":{"x":0,"y":27,"width":650,"height":514}},
 {"ref":"atspi:4/0/0/0/0/0","parent_ref":"atspi:4/0","role":"menu","name":"File","depth":5,"focused":false,"focusable":false,"enabled":true,"bounds":{"x":5,"y":56,"width":39,"height":25},"actions":["click"]},
 {"ref":"atspi:4/0/0/2/0/0/0","parent_ref":"atspi:4/0","role":"text","name":"","depth":6,"focused":true,"focusable":true,"enabled":true,"bounds":{"x":6,"y":84,"width":638,"height":449}}
]})";

TEST(AccessibilitySnapshot, AGoodAnswerIsReadAndRenderedAsTheSeedDoes) {
  const Snapshot snap = parse_snapshot(kGood);
  ASSERT_EQ(snap.nodes.size(), 6u);
  EXPECT_FALSE(snap.truncated);
  const Node& file = snap.nodes[4];
  EXPECT_EQ(file.ref, "atspi:4/0/0/0/0/0");
  EXPECT_EQ(file.parent_ref, "atspi:4/0");
  EXPECT_EQ(file.role, "menu");
  EXPECT_EQ(file.name, "File");
  EXPECT_EQ(file.depth, 5);
  ASSERT_TRUE(file.bounds);
  EXPECT_EQ(file.bounds->x, 5);
  EXPECT_EQ(file.bounds->height, 25);
  EXPECT_EQ(file.actions, std::vector<std::string>{"click"});
  EXPECT_EQ(snap.nodes[0].parent_ref, "");
  EXPECT_FALSE(snap.nodes[0].bounds);
  EXPECT_TRUE(snap.nodes[5].focused);

  EXPECT_EQ(snapshot_text(snap),
            "- application \"xfce4-panel\" [ref=atspi:0]\n"
            "          - push button \"Terminal Emulator\" [ref=atspi:0/2/0/2/0/0 bounds=544,752,48,48 actions=click]\n"
            "- application \"mousepad\" [ref=atspi:4]\n"
            "  - frame \"Untitled 1 - Mousepad\" [ref=atspi:4/0 bounds=0,27,650,514]\n"
            "          - menu \"File\" [ref=atspi:4/0/0/0/0/0 bounds=5,56,39,25 actions=click]\n"
            "            - text [ref=atspi:4/0/0/2/0/0/0 bounds=6,84,638,449 focused]");

  const json doc = snapshot_json(snap);
  EXPECT_EQ(doc["format"], "at-spi-snapshot-v1");
  EXPECT_EQ(doc["truncated"], false);
  EXPECT_EQ(doc["snapshot"], snapshot_text(snap));
  ASSERT_EQ(doc["elements"].size(), 6u);
  EXPECT_TRUE(doc["elements"][0]["parent_ref"].is_null());
  EXPECT_FALSE(doc["elements"][0].contains("bounds"));
  EXPECT_FALSE(doc["elements"][0].contains("actions"));
  EXPECT_EQ(doc["elements"][4],
            json::parse(R"({"ref":"atspi:4/0/0/0/0/0","parent_ref":"atspi:4/0","role":"menu","name":"File",
                            "focused":false,"focusable":false,"enabled":true,
                            "bounds":{"x":5,"y":56,"width":39,"height":25},"actions":["click"]})"));
}

TEST(AccessibilitySnapshot, AnEmptyDesktopAndATruncatedWalkAreAnswers) {
  const Snapshot none = parse_snapshot(R"({"format":"at-spi-snapshot-v1","truncated":true,"nodes":[]})");
  EXPECT_TRUE(none.nodes.empty());
  EXPECT_TRUE(none.truncated);
  EXPECT_EQ(snapshot_text(none), "");
}

// What the sandbox prints, changed into each way it can be wrong; every one is refused with what
// was wrong, none crashes or is taken.
TEST(AccessibilitySnapshot, HostileAnswersAreRefusedSayingWhatWasWrong) {
  auto with_node = [](const std::string& node) {
    return R"({"format":"at-spi-snapshot-v1","truncated":false,"nodes":[
      {"ref":"atspi:0","parent_ref":null,"role":"application","name":"app","depth":0,"focused":false,"focusable":false,"enabled":true},)" +
           node + "]}";
  };
  const std::string ok_child =
      R"({"ref":"atspi:0/1","parent_ref":"atspi:0","role":"push button","name":"OK","depth":1,"focused":false,"focusable":true,"enabled":true})";
  ASSERT_NO_THROW(parse_snapshot(with_node(ok_child)));
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string node = ok_child;
    const auto at = node.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return with_node(node.replace(at, from.size(), to));
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "gave no snapshot"},
      {"   \n", "gave no snapshot"},
      {"not json", "not JSON"},
      {"[1,2]", "not a JSON object"},
      {R"({"format":"other","truncated":false,"nodes":[]})", "format"},
      {R"({"format":"at-spi-snapshot-v1","nodes":[]})", "truncated"},
      {R"({"format":"at-spi-snapshot-v1","truncated":false,"nodes":{}})", "nodes is not a list"},
      {R"({"error":"element atspi:9 is no longer there"})", "accessibility: element atspi:9 is no longer there"},
      // Wrong types.
      {replaced(R"("name":"OK")", R"("name":42)"), "name is not a string"},
      {replaced(R"("focused":false)", R"("focused":"yes")"), "focused is not true or false"},
      {replaced(R"("enabled":true)", R"("enabled":1)"), "enabled is not true or false"},
      {replaced(R"("role":"push button")", R"("role":null)"), "role is not a string"},
      {replaced(R"("enabled":true)", R"("enabled":true,"bounds":[1,2,3,4])"), "bounds is not an object"},
      {replaced(R"("enabled":true)", R"("enabled":true,"bounds":{"x":"1","y":0,"width":5,"height":5})"), "bounds.x"},
      {replaced(R"("enabled":true)", R"("enabled":true,"bounds":{"x":1,"y":0,"width":0,"height":5})"), "bounds.width"},
      {replaced(R"("enabled":true)", R"("enabled":true,"bounds":{"x":1e12,"y":0,"width":5,"height":5})"), "bounds.x"},
      {replaced(R"("enabled":true)", R"("enabled":true,"actions":"click")"), "actions is not a list"},
      {replaced(R"("enabled":true)", R"("enabled":true,"actions":[1])"), "an action is not a string"},
      {replaced(R"("enabled":true)", R"("enabled":true,"actions":)" + json(std::vector<std::string>(33, "a")).dump()),
       "at most 32"},
      // Bad refs and places in the tree.
      {replaced(R"("ref":"atspi:0/1")", R"("ref":"atspi:0//1")"), "is not atspi: followed by child indices"},
      {replaced(R"("ref":"atspi:0/1")", R"("ref":"atspi:0/-1")"), "is not atspi: followed by child indices"},
      {replaced(R"("ref":"atspi:0/1")", R"("ref":"atspi:0/1 ")"), "is not atspi: followed by child indices"},
      {replaced(R"("ref":"atspi:0/1")", R"("ref":"atspi:0/12345")"), "is not atspi: followed by child indices"},
      {replaced(R"("ref":"atspi:0/1")", R"("ref":"javascript:0/1")"), "is not atspi: followed by child indices"},
      {replaced(R"("ref":"atspi:0/1")", R"("ref":7)"), "is not atspi: followed by child indices"},
      {replaced(R"("ref":"atspi:0/1")", R"("ref":"atspi:0/200")"), "passes the limits"},
      {replaced(R"("depth":1)", R"("depth":3)"), "does not match its ref"},
      {replaced(R"("parent_ref":"atspi:0")", R"("parent_ref":"atspi:1")"), "not one of its ancestors"},
      {replaced(R"("parent_ref":"atspi:0")", R"("parent_ref":"atspi:0/1")"), "not one of its ancestors"},
      {replaced(R"("parent_ref":"atspi:0")", R"("parent_ref":null)"), "not one of its ancestors"},
      {replaced(R"("ref":"atspi:0/1","parent_ref":"atspi:0")", R"("ref":"atspi:0","parent_ref":null)"),
       "does not match its ref"},
      {with_node(R"({"ref":"atspi:0","parent_ref":null,"role":"application","name":"again","depth":0,"focused":false,"focusable":false,"enabled":true})"),
       "listed twice"},
      {with_node(R"({"ref":"atspi:1/0","parent_ref":"atspi:1","role":"label","name":"x","depth":1,"focused":false,"focusable":false,"enabled":true})"),
       "is not listed before it"},
      {with_node(R"({"ref":"atspi:1","parent_ref":"atspi:0","role":"application","name":"x","depth":0,"focused":false,"focusable":false,"enabled":true})"),
       "an application has a parent_ref"},
  };
  for (const auto& [answer, said] : cases) {
    try {
      parse_snapshot(answer);
      ADD_FAILURE() << "taken: " << answer;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(said), std::string::npos) << e.what() << "\nfor: " << answer;
    }
  }
}

TEST(AccessibilitySnapshot, OversizedTooManyAndTooDeepAnswersAreRefused) {
  // More than the caller reads.
  EXPECT_THROW(parse_snapshot(std::string(kMaxAnswer + 1, ' ')), Error);
  // 601 nodes.
  json many = {{"format", "at-spi-snapshot-v1"}, {"truncated", false}, {"nodes", json::array()}};
  for (int i = 0; i < 80; ++i)
    many["nodes"].push_back({{"ref", "atspi:" + std::to_string(i)}, {"parent_ref", nullptr}, {"role", "application"},
                             {"name", "a"}, {"depth", 0}, {"focused", false}, {"focusable", false}, {"enabled", true}});
  for (int i = 0; many["nodes"].size() <= kMaxNodes; ++i)
    many["nodes"].push_back({{"ref", fmt::format("atspi:{}/{}", i % 80, i / 80)}, {"parent_ref", fmt::format("atspi:{}", i % 80)},
                             {"role", "label"}, {"name", "b"}, {"depth", 1}, {"focused", false}, {"focusable", false},
                             {"enabled", true}});
  try {
    parse_snapshot(many.dump());
    ADD_FAILURE() << "601 nodes taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("601 nodes, more than 600"), std::string::npos) << e.what();
  }
  many["nodes"].erase(many["nodes"].end() - 1);
  EXPECT_EQ(parse_snapshot(many.dump()).nodes.size(), kMaxNodes);
  // A ref 13 levels below the applications.
  std::string deep = "atspi:0", parent = "atspi:0";
  for (int level = 1; level <= 13; ++level) {
    parent = deep;
    deep += "/0";
  }
  json too_deep = {{"format", "at-spi-snapshot-v1"}, {"truncated", false},
                   {"nodes", {{{"ref", "atspi:0"}, {"parent_ref", nullptr}, {"role", "application"}, {"name", ""},
                               {"depth", 0}, {"focused", false}, {"focusable", false}, {"enabled", true}},
                              {{"ref", deep}, {"parent_ref", "atspi:0"}, {"role", "label"}, {"name", ""}, {"depth", 13},
                               {"focused", false}, {"focusable", false}, {"enabled", true}}}}};
  EXPECT_THROW(parse_snapshot(too_deep.dump()), Error);
  // JSON nested a million levels deep, where a name should be: refused, the stack intact.
  const std::string nested = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_THROW(parse_snapshot(R"({"format":"at-spi-snapshot-v1","truncated":false,"nodes":[{"ref":"atspi:0","name":)" +
                              nested + "}]}"),
               Error);
}

TEST(AccessibilitySnapshot, NamesLoseControlCharactersAndLength) {
  json doc = json::parse(kGood);
  // An escape sequence, line breaks, a right-to-left override, a C1 control; 1000 characters.
  doc["nodes"][4]["name"] = "Save\x1b[31m\nnow\t\u202Egnp.exe\u0085" + std::string(1000, 'x');
  doc["nodes"][4]["role"] = std::string(500, 'r');
  doc["nodes"][4]["actions"] = {"cl\nick"};
  const Node n = parse_snapshot(doc.dump()).nodes[4];
  EXPECT_EQ(n.name.substr(0, 30), "Save [31m now  gnp.exe xxxxxxx");
  EXPECT_EQ(n.name.size(), 200u) << "200 characters";
  EXPECT_EQ(n.role, std::string(64, 'r'));
  EXPECT_EQ(n.actions, std::vector<std::string>{"cl ick"});
  // A name with quotes stays one line in the text.
  Snapshot quoted;
  quoted.nodes.push_back(Node{.ref = "atspi:0", .role = "application", .name = "say \"hi\" \\ bye"});
  EXPECT_EQ(snapshot_text(quoted), R"(- application "say \"hi\" \\ bye" [ref=atspi:0])");
  // Bytes that are not UTF-8 are not JSON.
  std::string raw = kGood;
  raw.replace(raw.find("Untitled 1"), 1, "\xff");
  EXPECT_THROW(parse_snapshot(raw), Error);
}

TEST(AccessibilityElement, AnElementAndAnActionAnswerAreChecked) {
  const Node n = parse_element(
      R"({"ref":"atspi:4/0/0/0/0/0","parent_ref":"atspi:4/0/0/0/0","role":"menu","name":"File","depth":5,"focused":false,"focusable":false,"enabled":true,"bounds":{"x":5,"y":56,"width":39,"height":25},"actions":["click"]})");
  EXPECT_EQ(n.name, "File");
  EXPECT_EQ(n.parent_ref, "atspi:4/0/0/0/0");
  EXPECT_EQ(n.bounds->width, 39);
  EXPECT_THROW(parse_element(R"({"ref":"atspi:4/0","depth":1,"role":"menu","name":"File"})"), Error);
  try {
    parse_element(R"x({"error":"element atspi:4/9 is no longer there (the tree changed: take a new snapshot)"})x");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "accessibility: element atspi:4/9 is no longer there (the tree changed: take a new snapshot)");
  }
  EXPECT_NO_THROW(parse_action(R"({"ok":true,"ref":"atspi:4/0","name":"click"})"));
  EXPECT_THROW(parse_action(R"({"ok":"true"})"), Error);
  EXPECT_THROW(parse_action(R"({"error":"element atspi:4/0 has no action 'press'; its actions: click"})"), Error);
}

TEST(AccessibilityRefs, OnlyAtspiAndChildIndicesAreRefs) {
  for (const char* good : {"atspi:0", "atspi:8/0/2", "atspi:79/199/0/0/0/0/0/0/0/0/0/0/0"}) EXPECT_TRUE(valid_ref(good)) << good;
  for (const char* bad : {"", "atspi:", "atspi:/1", "atspi:1/", "atspi:1//2", "atspi:a", "atspi:+1", "atspi:-1",
                          "ATSPI:1", " atspi:1", "atspi:1\n", "atspi:12345", "atspi:0/0/0/0/0/0/0/0/0/0/0/0/0/0"})
    EXPECT_FALSE(valid_ref(bad)) << bad;
}

// The helper itself (no session needed): a request it cannot take is answered with its error,
// on stdout as JSON and on stderr as a line, and exit 1.
TEST(AccessibilityHelper, ARequestItCannotTakeIsAnsweredWithItsError) {
  std::vector<std::string> argv = atspi_command();
  ASSERT_EQ(argv[0], "python3");
  const CommandResult r = run_command(argv, R"({"op": 5})");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "the request must be a JSON object with an op\n");
  try {
    parse_snapshot(r.out);
    ADD_FAILURE() << r.out;
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "accessibility: the request must be a JSON object with an op");
  }
  EXPECT_EQ(run_command(argv, "{nope").exit_code, 1);
}

}  // namespace
}  // namespace nshpc::desktop
