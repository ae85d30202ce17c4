#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "config/config.hpp"
#include "config/keys.hpp"
#include "common/temp_dir.hpp"

namespace stdfs = std::filesystem;
namespace config = nshpc::config;

using Lines = std::vector<std::string>;

namespace {

// Each test gets a temp folder with a home inside, and an injected environment (HOME only, unless
// a test adds variables), so nothing of the real user's configuration is read.
class ConfigTest : public ::testing::Test {
 protected:
  ConfigTest() { vars_["HOME"] = home().string(); }

  stdfs::path root() const { return root_; }
  stdfs::path home() const { return root_ / "home"; }
  void set_env(const std::string& name, const std::string& value) { vars_[name] = value; }

  config::EnvLookup env() const {
    return [vars = vars_](std::string_view name) -> std::optional<std::string> {
      const auto it = vars.find(std::string(name));
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  }

  // Writes `text` at `relative` (below the temp folder) and returns its absolute path.
  stdfs::path write(const stdfs::path& relative, std::string_view text) const {
    const stdfs::path path = root_ / relative;
    stdfs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path;
  }

  stdfs::path write_user_file(std::string_view text) const {
    return write("home/.config/ns-hpc/config.toml", text);
  }

  config::LoadOptions options(std::optional<stdfs::path> explicit_path = std::nullopt) const {
    return {.explicit_path = std::move(explicit_path), .read_user_file = true, .env = env(), .as_root = false};
  }

  // Loads the defaults and one explicit file with `text`.
  config::Loaded load_text(std::string_view text) const {
    return config::load(options(write("c.toml", text)));
  }

  // The problems of a load that must fail.
  static std::vector<std::string> problems(const config::LoadOptions& options) {
    try {
      config::load(options);
    } catch (const config::ConfigError& error) {
      return error.problems();
    }
    ADD_FAILURE() << "the configuration was accepted";
    return {};
  }

  // The problems of loading the defaults and one explicit file with `text`, whose path is file().
  std::vector<std::string> problems_of(std::string_view text) const {
    return problems(options(write("c.toml", text)));
  }
  std::string file() const { return (root_ / "c.toml").string(); }

 private:
  nshpc::tests::TempDir tmp_{"nshpc-config"};
  const stdfs::path root_ = tmp_.path();
  std::map<std::string, std::string> vars_;
};

Lines strings(std::initializer_list<const char*> items) { return {items.begin(), items.end()}; }

// Paths as strings, so failures print readably.
Lines strings(const std::vector<stdfs::path>& paths) {
  Lines out;
  for (const stdfs::path& path : paths) out.push_back(path.string());
  return out;
}

bool has_line(const Lines& lines, std::string_view line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

bool has_line_starting(const Lines& lines, std::string_view prefix) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& line) { return line.starts_with(prefix); });
}

bool has_line_containing(const Lines& lines, std::string_view part) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& line) { return line.find(part) != std::string::npos; });
}

std::string dump(const Lines& lines) {
  std::string text = "lines:";
  for (const std::string& line : lines) text += "\n  " + line;
  return text;
}

// A line expected in a problem report: the whole line, or how it starts.
struct Expected {
  bool whole;
  std::string text;
};
Expected line_is(std::string text) { return {true, std::move(text)}; }
Expected line_starts(std::string text) { return {false, std::move(text)}; }

// `found` has as many lines as `expected`, and each expected line is among them.
void expect_problems(const Lines& found, const std::vector<Expected>& expected) {
  EXPECT_EQ(found.size(), expected.size()) << dump(found);
  for (const Expected& e : expected)
    EXPECT_TRUE(e.whole ? has_line(found, e.text) : has_line_starting(found, e.text))
        << (e.whole ? "no line " : "no line starting ") << e.text << "\n" << dump(found);
}

// ---- defaults ---------------------------------------------------------------------------------

TEST_F(ConfigTest, DefaultsOfNamespace) {
  const auto loaded = config::load(options());
  const config::Namespace& ns = loaded.config.ns;
  EXPECT_EQ(ns.instances_dir.string(), (home() / ".local/share/ns-hpc/instances").string());
  EXPECT_EQ(
      ns.bwrap_command,
      strings({"bwrap",     "--unshare-all", "--share-net", "--proc",    "/proc",     "--dev",     "/dev",
               "--tmpfs",   "/tmp",          "--ro-bind",   "/usr",      "/usr",      "--ro-bind", "/lib",
               "/lib",      "--ro-bind",     "/lib64",      "/lib64",    "--ro-bind", "/bin",      "/bin",
               "--ro-bind", "/sbin",         "/sbin",       "--ro-bind", "/etc",      "/etc"}));
  EXPECT_EQ(ns.workspace_mount, "/workspace");
  EXPECT_EQ(ns.output_mount, "/output");
  EXPECT_EQ(ns.shared_output_mount, "/shared-output");
  EXPECT_FALSE(ns.shared_output);
  EXPECT_EQ(ns.status_fd, 3);
  EXPECT_TRUE(ns.hardening);
  EXPECT_TRUE(ns.seccomp);
  EXPECT_EQ(ns.sandbox_uid, 65534u);
  EXPECT_EQ(ns.sandbox_gid, 65534u);
  EXPECT_EQ(ns.default_network, config::DefaultNetwork::automatic);
  EXPECT_FALSE(ns.bwrap_shares_net);  // the built-in bwrap_command has --share-net: it does not count
  EXPECT_EQ(ns.path, "/usr/local/bin:/usr/bin:/bin");
  EXPECT_TRUE(ns.env.empty());
  EXPECT_TRUE(ns.pass_env.empty());
  EXPECT_EQ(loaded.warnings, Lines{});
  EXPECT_TRUE(loaded.config.sources.empty());
}

TEST_F(ConfigTest, DefaultsOfJobsResourcesMcpDavAndServers) {
  const config::Config cfg = config::load(options()).config;
  EXPECT_EQ(cfg.jobs.max_timeout, 3600);
  EXPECT_TRUE(cfg.jobs.local.use_cgroups);
  EXPECT_TRUE(cfg.jobs.local.cgroups_command.empty());
  EXPECT_TRUE(cfg.jobs.local.proc_check);
  EXPECT_EQ(cfg.jobs.max_running_per_instance, 256);
  EXPECT_EQ(cfg.jobs.max_running, 512);
  EXPECT_EQ(cfg.jobs.cancel_grace, 5);
  ASSERT_EQ(cfg.jobs.local.limit.size(), 5u);
  EXPECT_EQ(cfg.jobs.local.limit.at("memory").default_value, 4096);
  EXPECT_EQ(cfg.jobs.local.limit.at("time").default_value, 3600);
  EXPECT_EQ(cfg.jobs.local.limit.at("cpus").max, 64);
  EXPECT_EQ(cfg.jobs.slurm.sbatch_command,
            strings({"sbatch", "--partition", "cpu", "--cpus-per-task={cpus}", "--mem={memory}M"}));
  ASSERT_EQ(cfg.jobs.slurm.limit.size(), 2u);
  EXPECT_EQ(cfg.jobs.slurm.limit.at("cpus").default_value, 1);
  EXPECT_EQ(cfg.jobs.slurm.limit.at("cpus").max, 8);
  EXPECT_EQ(cfg.jobs.slurm.limit.at("memory").default_value, 4096);
  EXPECT_EQ(cfg.jobs.slurm.limit.at("memory").max, 32768);

  EXPECT_EQ(strings(cfg.resource.context_dirs), Lines{(home() / ".config/ns-hpc/context").string()});
  EXPECT_EQ(cfg.resource.resource_patterns, Lines{"*.md"});
  EXPECT_EQ(cfg.mcp.result_type, config::ResultType::both);
  EXPECT_FALSE(cfg.dav.enabled);
  EXPECT_TRUE(cfg.dav.extras.empty());
  EXPECT_TRUE(cfg.host_commands.empty());
  EXPECT_TRUE(cfg.proxied_mcps.empty());  // reserved: no example entry pretends to work
  EXPECT_EQ(cfg.jobs.slurm.status_source, config::StatusSource::automatic);
  EXPECT_EQ(cfg.jobs.slurm.squeue_command, Lines{"squeue"});
  EXPECT_EQ(cfg.jobs.slurm.poll_interval, 2.0);
  EXPECT_EQ(cfg.terminal.limits,
            (std::map<std::string, std::int64_t>{{"cpus", 2}, {"memory", 4096}, {"pids", 1024}, {"output", 1024}}));
  EXPECT_EQ(cfg.audit.max_size, 64);
  EXPECT_EQ(cfg.audit.keep, 3);
}

TEST_F(ConfigTest, BuiltInIsTheDefaultsAlone) {
  write_user_file("[jobs]\nmax_timeout = 60\n");
  set_env("NS_HPC_CONFIG", write("c.toml", "[jobs]\nmax_timeout = 70\n").string());
  const config::Config built_in = config::built_in(env(), false);
  EXPECT_EQ(built_in.jobs.max_timeout, 3600);
  EXPECT_TRUE(built_in.sources.empty());
  set_env("NS_HPC_CONFIG", "");
  auto opts = options();
  opts.read_user_file = false;
  EXPECT_EQ(config::to_json(built_in), config::to_json(config::load(opts).config));
}

TEST_F(ConfigTest, UserFileAndDefaultContextDirFollowXdgConfigHome) {
  set_env("XDG_CONFIG_HOME", (root() / "xdg").string());
  const auto user_file = write("xdg/ns-hpc/config.toml", "[jobs]\nmax_timeout = 60\n");
  const auto loaded = config::load(options());
  EXPECT_EQ(loaded.config.jobs.max_timeout, 60);
  EXPECT_EQ(strings(loaded.config.sources), Lines{user_file.string()});
  EXPECT_EQ(strings(loaded.config.resource.context_dirs), Lines{(root() / "xdg/ns-hpc/context").string()});
}

TEST_F(ConfigTest, UserFileIsSkippedWhenAskedTo) {
  write_user_file("[jobs]\nmax_timeout = 60\n");
  auto opts = options();
  opts.read_user_file = false;
  const auto loaded = config::load(opts);
  EXPECT_EQ(loaded.config.jobs.max_timeout, 3600);
  EXPECT_TRUE(loaded.config.sources.empty());
}

// ---- layers and merge -------------------------------------------------------------------------

TEST_F(ConfigTest, ExplicitFileWinsOverUserFileAndTablesMergeDeeply) {
  const auto user_file = write_user_file(R"(
[namespace]
hardening = false
[jobs]
max_timeout = 100
[jobs.slurm.limit.cpus]
max = 16
[host_commands.uptime]
command = "uptime"
)");
  const auto explicit_file = write("site/ns-hpc.toml", R"(
[jobs]
max_timeout = 200
[host_commands.uptime]
timeout = 5
)");
  const auto loaded = config::load(options(explicit_file));
  const config::Config& cfg = loaded.config;
  EXPECT_EQ(cfg.jobs.max_timeout, 200);
  EXPECT_FALSE(cfg.ns.hardening);
  EXPECT_EQ(cfg.jobs.slurm.limit.at("cpus").default_value, 1);  // from the defaults
  EXPECT_EQ(cfg.jobs.slurm.limit.at("cpus").max, 16);           // from the user file
  EXPECT_EQ(cfg.jobs.slurm.limit.at("memory").max, 32768);
  EXPECT_EQ(cfg.host_commands.at("uptime").command, "uptime");
  EXPECT_EQ(cfg.host_commands.at("uptime").timeout, 5.0);
  EXPECT_EQ(strings(cfg.sources), (Lines{user_file.string(), explicit_file.string()}));
  EXPECT_EQ(loaded.warnings, Lines{explicit_file.string() + ":4:1: reserved key 'host_commands.uptime' read but not "
                                                            "used: host commands are not there yet"});
}

TEST_F(ConfigTest, ListsAreReplacedWhole) {
  write_user_file("[proxied_mcps.filesystem]\ncommand = \"npx\"\nargs = [\"-y\", \"pkg\", \"/a\", \"/b\"]\n");
  const auto explicit_file = write("c.toml", R"(
[namespace]
bwrap_command = ["/opt/bwrap", "--unshare-all"]
[proxied_mcps.filesystem]
args = ["/c"]
)");
  const config::Config cfg = config::load(options(explicit_file)).config;
  EXPECT_EQ(cfg.ns.bwrap_command, strings({"/opt/bwrap", "--unshare-all"}));
  EXPECT_EQ(cfg.proxied_mcps.at("filesystem").args, strings({"/c"}));
  EXPECT_EQ(cfg.proxied_mcps.at("filesystem").command, "npx");
}

TEST_F(ConfigTest, EnabledFalseRemovesDefaultEntries) {
  const config::Config cfg = load_text(R"(
[proxied_mcps.filesystem]
enabled = false
[proxied_mcps.git]
command = "mcp-git"
enabled = true
[jobs.slurm.limit.memory]
enabled = false
)")
                                 .config;
  EXPECT_FALSE(cfg.proxied_mcps.contains("filesystem"));
  EXPECT_TRUE(cfg.proxied_mcps.contains("git"));
  EXPECT_FALSE(cfg.jobs.slurm.limit.contains("memory"));
  EXPECT_TRUE(cfg.jobs.slurm.limit.contains("cpus"));
}

TEST_F(ConfigTest, EnabledMustBeABoolean) {
  EXPECT_EQ(problems_of("[jobs.slurm.limit.cpus]\nenabled = \"no\"\n"),
            Lines{file() + ":2:11: jobs.slurm.limit.cpus.enabled: expected a boolean (true keeps the "
                           "entry, false removes it), got a string"});
}

TEST_F(ConfigTest, NsHpcConfigIsTheExplicitFileWhenNoPathIsGiven) {
  const auto from_env = write("env.toml", "[mcp]\nresult_type = \"text\"\n");
  const auto from_option = write("option.toml", "[mcp]\nresult_type = \"structured\"\n");
  set_env("NS_HPC_CONFIG", from_env.string());
  EXPECT_EQ(config::load(options()).config.mcp.result_type, config::ResultType::text);
  EXPECT_EQ(config::load(options(from_option)).config.mcp.result_type, config::ResultType::structured);
}

// ---- paths ------------------------------------------------------------------------------------

TEST_F(ConfigTest, InstancesDirExpandsTildeAndVariables) {
  set_env("SCRATCH", "/scratch/ada");
  EXPECT_EQ(load_text("[namespace]\ninstances_dir = \"~/inst\"\n").config.ns.instances_dir.string(),
            (home() / "inst").string());
  EXPECT_EQ(load_text("[namespace]\ninstances_dir = \"$SCRATCH/inst/\"\n").config.ns.instances_dir.string(),
            "/scratch/ada/inst");
  EXPECT_EQ(
      load_text("[namespace]\ninstances_dir = \"${SCRATCH}2/x/../inst\"\n").config.ns.instances_dir.string(),
      "/scratch/ada2/inst");
}

TEST_F(ConfigTest, InstancesDirEmptyAfterExpansionIsAnError) {
  EXPECT_EQ(problems_of("[namespace]\ninstances_dir = \"$UNSET\"\n"),
            Lines{file() + ":2:17: namespace.instances_dir: \"$UNSET\" is empty after expanding ~ and "
                           "$VARs; give a folder path"});
}

TEST_F(ConfigTest, RelativePathsAreResolvedAgainstTheFolderOfTheirFile) {
  const auto explicit_file = write("site/conf/c.toml", R"(
[namespace]
instances_dir = "state"
[resource]
context_dirs = ["ctx", "../shared", "/abs/docs", "~/notes"]
[dav.extras.data]
path = "data"
)");
  const config::Config cfg = config::load(options(explicit_file)).config;
  const stdfs::path folder = root() / "site/conf";
  EXPECT_EQ(cfg.ns.instances_dir.string(), (folder / "state").string());
  EXPECT_EQ(strings(cfg.resource.context_dirs),
            (Lines{(folder / "ctx").string(), (root() / "site/shared").string(), "/abs/docs",
                   (home() / "notes").string()}));
  EXPECT_EQ(cfg.dav.extras.at("data").path.string(), (folder / "data").string());
  EXPECT_TRUE(cfg.dav.extras.at("data").ro);
}

// ---- warnings ---------------------------------------------------------------------------------

TEST_F(ConfigTest, UnknownKeysAreWarnedWithTheirPosition) {
  const auto loaded = load_text(R"([namespace]
bwrap_comand = ["bwrap"]
[jobs.slurm.limit.gpus]
defualt = 1
default = 0
max = 2
[colour]
)");
  EXPECT_EQ(loaded.warnings, (Lines{file() + ":2:1: unknown key 'namespace.bwrap_comand' ignored",
                                    file() + ":4:1: unknown key 'jobs.slurm.limit.gpus.defualt' ignored",
                                    file() + ":7:2: unknown key 'colour' ignored"}));
  EXPECT_EQ(loaded.config.jobs.slurm.limit.at("gpus").max, 2);
}

// Keys of features that are not there yet are read and checked (old files still load), and each
// one a file sets is a warning that says so; config show leaves them out when nothing sets them.
TEST_F(ConfigTest, ReservedKeysAreReadAndWarnedAbout) {
  const auto loaded = load_text(R"([dav]
enabled = true
[dav.extras.data]
path = "/srv/data"
[proxied_mcps.fs]
command = "mcp-fs"
[host_commands.uptime]
command = "uptime"
)");
  // [dav] is no longer reserved (WebDAV is served): no warning for it.
  EXPECT_EQ(loaded.warnings,
            (Lines{file() + ":5:1: reserved key 'proxied_mcps.fs' read but not used: proxied MCP servers are "
                            "not there yet",
                   file() + ":7:1: reserved key 'host_commands.uptime' read but not used: host commands are not "
                            "there yet"}));
  EXPECT_EQ(loaded.config.proxied_mcps.at("fs").command, "mcp-fs");
  EXPECT_EQ(loaded.config.host_commands.at("uptime").timeout, 30.0);  // an entry field's default
  EXPECT_TRUE(loaded.config.dav.extras.at("data").ro);

  const nlohmann::json defaults = config::to_json(config::load(options()).config);
  for (const char* key : {"proxied_mcps", "host_commands"}) EXPECT_FALSE(defaults.contains(key)) << key;
  EXPECT_TRUE(defaults.contains("dav"));
  const std::string shown = config::to_toml(loaded.config);
  const auto reserved = shown.find("# Reserved: read but not used yet");
  ASSERT_NE(reserved, std::string::npos) << shown;
  EXPECT_GT(shown.find("[proxied_mcps.fs]"), reserved) << shown;
  EXPECT_LT(shown.find("[dav]"), reserved) << shown;
  EXPECT_EQ(config::to_toml(config::load(options()).config).find("Reserved"), std::string::npos);
}

TEST_F(ConfigTest, LegacyKeysAreWarnedWithTheirReplacement) {
  const auto loaded = load_text(R"(instances_dir = "/old"
[namespace_defaults]
bind_ro = ["/usr"]
[slurm]
partition = "gpu"
)");
  EXPECT_EQ(loaded.warnings,
            (Lines{file() + ":1:1: 'instances_dir' is a legacy ns-hpc key and is ignored; use "
                            "namespace.instances_dir instead",
                   file() + ":3:1: 'namespace_defaults.bind_ro' is a legacy ns-hpc key and is ignored; "
                            "use namespace.bwrap_command instead",
                   file() + ":5:1: 'slurm.partition' is a legacy ns-hpc key and is ignored; use "
                            "jobs.slurm.sbatch_command instead"}));
  EXPECT_EQ(loaded.config.ns.instances_dir.string(), (home() / ".local/share/ns-hpc/instances").string());
}

// ---- errors -----------------------------------------------------------------------------------

TEST_F(ConfigTest, WrongTypeNamesPositionKeyExpectedAndActualType) {
  EXPECT_EQ(problems_of("[jobs]\nmax_timeout = \"1h\"\n"),
            Lines{file() + ":2:15: jobs.max_timeout: expected an integer (seconds, 1..604800), got a "
                           "string"});
  EXPECT_EQ(problems_of("mcp = 3\n"), Lines{file() + ":1:7: mcp: expected a table, got an integer"});
  EXPECT_EQ(problems_of("[namespace]\nhardening = 1\n"),
            Lines{file() + ":2:13: namespace.hardening: expected a boolean (true or false), got an "
                           "integer"});
}

TEST_F(ConfigTest, OutOfRangeNumbersAreErrors) {
  EXPECT_EQ(problems_of("[jobs]\nmax_timeout = 0\n"),
            Lines{file() + ":2:15: jobs.max_timeout: 0 is out of range; use an integer (seconds, "
                           "1..604800)"});
  EXPECT_EQ(problems_of("[namespace]\nstatus_fd = 2\n"),
            Lines{file() + ":2:13: namespace.status_fd: 2 is out of range; use an integer (a file "
                           "descriptor number, 3 or more)"});
  EXPECT_EQ(problems_of("[host_commands.x]\ncommand = \"true\"\ntimeout = 0\n"),
            Lines{file() + ":3:11: host_commands.x.timeout: 0 is out of range; use a number (seconds, "
                           "more than 0)"});
}

TEST_F(ConfigTest, IntegersAreAcceptedWhereNumbersAreAllowed) {
  const config::Config cfg = load_text(R"(
[proxied_mcps.filesystem]
command = "npx"
idle_timeout = 300
[host_commands.x]
command = "true"
timeout = 2.5
)")
                                 .config;
  EXPECT_EQ(cfg.proxied_mcps.at("filesystem").idle_timeout, 300.0);
  EXPECT_EQ(cfg.host_commands.at("x").timeout, 2.5);
  EXPECT_EQ(cfg.host_commands.at("x").description, "");
}

// `auto`: nat where it works, else filtered; host only when the user's own bwrap_command asks for
// --share-net (the original's way); a mode named is kept as it is.
TEST_F(ConfigTest, TheDefaultNetworkIsTheSafestThatWorksUnlessTheUserAsksForTheHosts) {
  using config::DefaultNetwork;
  using config::Network;
  const config::Namespace plain = load_text("").config.ns;
  EXPECT_EQ(plain.default_network, DefaultNetwork::automatic);
  EXPECT_EQ(config::resolve_default_network(plain.default_network, plain.bwrap_shares_net, true), Network::nat);
  EXPECT_EQ(config::resolve_default_network(plain.default_network, plain.bwrap_shares_net, false), Network::filtered);
  const config::Namespace shares =
      load_text("[namespace]\nbwrap_command = [\"bwrap\", \"--ro-bind\", \"/usr\", \"/usr\", \"--share-net\"]\n")
          .config.ns;
  EXPECT_TRUE(shares.bwrap_shares_net);
  EXPECT_EQ(config::resolve_default_network(shares.default_network, shares.bwrap_shares_net, true), Network::host);
  const config::Namespace off = load_text("[namespace]\ndefault_network = \"off\"\n").config.ns;
  EXPECT_EQ(config::resolve_default_network(off.default_network, true, true), Network::off);
  const config::Namespace no_share =
      load_text("[namespace]\nbwrap_command = [\"bwrap\", \"--ro-bind\", \"/usr\", \"/usr\"]\n").config.ns;
  EXPECT_FALSE(no_share.bwrap_shares_net);
}

TEST_F(ConfigTest, NetworkEntriesAreCheckedAndNamed) {
  EXPECT_EQ(problems_of("[network]\nallow = [\"pypi.org\", \"bad entry\"]\n"),
            Lines{file() + ":2:9: network.allow: \"bad entry\" is not a name, *.domain or address (with an optional "
                           ":port)"});
  EXPECT_EQ(problems_of("[network]\nresolve = [\"allowed.test\"]\n"),
            Lines{file() + ":2:11: network.resolve: \"allowed.test\" is not a \"name=address\" pair"});
  const config::Config c =
      load_text("[network]\nallow = [\"*.debian.org:443\", \"10.1.2.3\"]\nresolve = [\"a.test=127.0.0.1\"]\n").config;
  EXPECT_EQ(c.network.allow, (std::vector<std::string>{"*.debian.org:443", "10.1.2.3"}));
  EXPECT_EQ(c.network.resolve, std::vector<std::string>{"a.test=127.0.0.1"});
}

TEST_F(ConfigTest, BadEnumValueListsTheAllowedOnes) {
  EXPECT_EQ(problems_of("[mcp]\nresult_type = \"json\"\n"),
            Lines{file() + ":2:15: mcp.result_type: \"json\" is not allowed; use \"text\", \"structured\" "
                           "or \"both\""});
  EXPECT_EQ(problems_of("[namespace]\ndefault_network = \"none\"\n"),
            Lines{file() + ":2:19: namespace.default_network: \"none\" is not allowed; use \"auto\", \"host\", "
                           "\"off\", \"nat\" or \"filtered\""});
}

TEST_F(ConfigTest, LimitDefaultAboveMaxAndMissingFieldsAreErrors) {
  EXPECT_EQ(problems_of("[jobs.slurm.limit.gpus]\ndefault = 4\nmax = 2\n"),
            Lines{file() + ":2:11: jobs.slurm.limit.gpus.default: 4 is larger than max (2); use 0 <= "
                           "default <= max"});
  EXPECT_EQ(problems_of("[jobs.local.limit]\ngpus = { default = 1 }\n"),
            Lines{file() + ":2:8: jobs.local.limit.gpus.max: missing; a limit needs both default and max "
                           "(integers, 0 <= default <= max)"});
  EXPECT_EQ(problems_of("[jobs.slurm.limit.cpus]\ndefault = -1\n"),
            Lines{file() + ":2:11: jobs.slurm.limit.cpus.default: -1 is out of range; use an integer (0 "
                           "or more)"});
}

TEST_F(ConfigTest, BadMountPathsAreErrors) {
  const std::string allowed =
      " is not allowed; use an absolute sandbox path (starting with /, not / itself, without ..)";
  EXPECT_EQ(problems_of(R"([namespace]
workspace_mount = "work"
output_mount = "/a/../b"
shared_output_mount = "/"
)"),
            (Lines{file() + ":2:19: namespace.workspace_mount: \"work\"" + allowed,
                   file() + ":3:16: namespace.output_mount: \"/a/../b\"" + allowed,
                   file() + ":4:23: namespace.shared_output_mount: \"/\"" + allowed}));
  EXPECT_EQ(problems_of("[namespace]\noutput_mount = \"/workspace/\"\n"),
            Lines{file() + ":2:16: namespace.output_mount: \"/workspace\" is also "
                           "namespace.workspace_mount; the three mounts must differ"});
}

TEST_F(ConfigTest, BadCommandListsAreErrors) {
  EXPECT_EQ(problems_of("[namespace]\nbwrap_command = []\n"),
            Lines{file() + ":2:17: namespace.bwrap_command: must be a non-empty list of strings"});
  EXPECT_EQ(problems_of("[namespace]\nbwrap_command = \"bwrap\"\n"),
            Lines{file() + ":2:17: namespace.bwrap_command: expected a non-empty list of strings, got a "
                           "string"});
  EXPECT_EQ(problems_of("[jobs.slurm]\nsbatch_command = [\"sbatch\", 4]\n"),
            Lines{file() + ":2:29: jobs.slurm.sbatch_command[1]: expected a string, got an integer"});
}

TEST_F(ConfigTest, BadNamesAreErrors) {
  const Lines found = problems_of(R"(
[proxied_mcps.a__b]
command = "x"
[proxied_mcps."-x"]
command = "x"
[jobs.slurm.limit.GPUs]
default = 0
max = 1
[dav.extras.instances]
path = "/srv"
)");
  expect_problems(found, {
      line_starts(file() + ":2:15: proxied_mcps.a__b: \"a__b\" is not a valid name; use letters, digits, _ and -"),
      line_starts(file() + ":4:15: proxied_mcps.-x: \"-x\" is not a valid name"),
      line_starts(file() + ":6:19: jobs.slurm.limit.GPUs: \"GPUs\" is not a valid name; use lowercase letters"),
      line_starts(file() + ":9:13: dav.extras.instances: \"instances\" is not a valid name"),
  });
}

TEST_F(ConfigTest, BadEnvironmentEntriesAreErrors) {
  const Lines found = problems_of(R"([namespace]
env = { PATH = "/x", "MY VAR" = "y", OK = 3 }
pass_env = ["LANG", "A-B"]
)");
  expect_problems(found, {
      line_is(file() + ":2:9: namespace.env.PATH: PATH cannot be set here; use namespace.path"),
      line_starts(file() + ":2:22: namespace.env.\"MY VAR\": \"MY VAR\" is not a valid variable name"),
      line_is(file() + ":2:43: namespace.env.OK: expected a string (the variable's value), got an integer"),
      line_starts(file() + ":3:21: namespace.pass_env[1]: \"A-B\" is not a valid variable name"),
  });
}

TEST_F(ConfigTest, RequiredEntryFieldsAreErrors) {
  const Lines found = problems_of(R"([proxied_mcps.git]
args = ["serve"]
[host_commands.h]
command = ""
[dav.extras.data]
ro = false
)");
  expect_problems(found, {
      line_is(file() + ":1:1: proxied_mcps.git.command: missing; give the program to run (a non-empty string)"),
      line_is(file() + ":4:11: host_commands.h.command: must not be empty; give a shell command"),
      line_is(file() + ":5:1: dav.extras.data.path: missing; give the folder to serve (a string)"),
  });
}

TEST_F(ConfigTest, AllProblemsAreReportedAtOnce) {
  try {
    load_text(R"([mcp]
result_type = "json"
[jobs]
max_timeout = -5
[namespace]
seccomp = "yes"
)");
    FAIL() << "the configuration was accepted";
  } catch (const config::ConfigError& error) {
    const Lines& found = error.problems();
    ASSERT_EQ(found.size(), 3u) << dump(found);
    EXPECT_EQ(std::string(error.what()), found[0] + "\n" + found[1] + "\n" + found[2]);
    EXPECT_TRUE(has_line_containing(found, "mcp.result_type")) << dump(found);
    EXPECT_TRUE(has_line_containing(found, "jobs.max_timeout")) << dump(found);
    EXPECT_TRUE(has_line_containing(found, "namespace.seccomp")) << dump(found);
  }
}

TEST_F(ConfigTest, SyntaxErrorsNameTheirPositionInEveryLayer) {
  const auto user_file = write_user_file("[jobs\n");
  const Lines found = problems(options(write("c.toml", "a = 1\nb = \n")));
  ASSERT_EQ(found.size(), 2u) << dump(found);
  EXPECT_TRUE(found[0].starts_with(user_file.string() + ":1:6: TOML syntax error: ")) << found[0];
  EXPECT_TRUE(found[1].starts_with(file() + ":2:5: TOML syntax error: ")) << found[1];
}

TEST_F(ConfigTest, MissingExplicitFileIsAnError) {
  const auto missing = root() / "nope.toml";
  EXPECT_EQ(problems(options(missing)),
            Lines{missing.string() + ": config file (from --config) does not exist"});
  set_env("NS_HPC_CONFIG", missing.string());
  EXPECT_EQ(problems(options()),
            Lines{missing.string() + ": config file (from NS_HPC_CONFIG) does not exist"});
}

TEST_F(ConfigTest, UnreadableExplicitFileIsAnError) {
  const auto folder = root() / "folder.toml";
  stdfs::create_directories(folder);
  EXPECT_EQ(problems(options(folder)),
            Lines{folder.string() + ": config file (from --config) cannot be read: Is a directory"});
}

TEST_F(ConfigTest, UnreadableUserFileIsAnErrorToo) {
  const auto user_file = home() / ".config/ns-hpc/config.toml";
  stdfs::create_directories(user_file);
  EXPECT_EQ(problems(options()),
            Lines{user_file.string() + ": user config file cannot be read: Is a directory"});
}

TEST_F(ConfigTest, FileWithoutReadPermissionIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  const auto locked = write("locked.toml", "");
  ::chmod(locked.c_str(), 0);
  EXPECT_EQ(problems(options(locked)),
            Lines{locked.string() + ": config file (from --config) cannot be read: Permission denied"});
}

TEST_F(ConfigTest, AsRootTheDefaultStateFolderIsTheSystemOne) {
  auto opts = options();
  opts.as_root = true;
  EXPECT_EQ(config::load(opts).config.ns.instances_dir.string(), std::string(config::kRootInstancesDir));
  // A configured folder still wins.
  opts.explicit_path = write("c.toml", "[namespace]\ninstances_dir = \"/srv/ns\"\n");
  EXPECT_EQ(config::load(opts).config.ns.instances_dir.string(), "/srv/ns");
}

// ---- check_file -------------------------------------------------------------------------------

TEST_F(ConfigTest, CheckFileValidatesOneFileOverTheDefaultsOnly) {
  write_user_file("[mcp]\nresult_type = \"json\"\n");  // would fail a full load
  const auto good = write("good.toml", "[jobs]\nmax_timeout = 10\n");
  const auto checked = config::check_file(good, env());
  EXPECT_EQ(checked.config.jobs.max_timeout, 10);
  EXPECT_EQ(strings(checked.config.sources), Lines{good.string()});

  const auto bad = write("bad.toml", "[jobs]\nmax_timeout = true\n");
  EXPECT_THROW(config::check_file(bad, env()), config::ConfigError);

  const auto missing = root() / "missing.toml";
  try {
    config::check_file(missing, env());
    FAIL() << "a missing file was accepted";
  } catch (const config::ConfigError& error) {
    EXPECT_EQ(error.problems(), Lines{missing.string() + ": config file does not exist"});
  }
}

// ---- output -----------------------------------------------------------------------------------

constexpr std::string_view kRichConfig = R"(
[namespace]
instances_dir = "~/inst"
env = { LANG = "C.UTF-8", "MY_VAR" = "a \"quoted\" value" }
pass_env = ["TERM"]
default_network = "off"
sandbox_uid = 0
[jobs.local]
cgroups_command = ["systemd-run", "--user", "--scope", "--"]
[jobs.local.limit.cpus]
default = 2
max = 4
[jobs.slurm.limit.memory]
enabled = false
[jobs.slurm.limit.gpus]
default = 0
max = 2
[resource]
context_dirs = ["ctx"]
[mcp]
result_type = "text"
[dav]
enabled = true
[dav.extras."data.set"]
path = "/srv/data"
ro = false
[proxied_mcps.filesystem]
enabled = false
[proxied_mcps.git]
command = "mcp-git"
env = { TOKEN = "t" }
include = ["log*"]
idle_timeout = 0.25
[host_commands.uptime]
command = "uptime"
description = "load of the host"
)";

TEST_F(ConfigTest, ToTomlLoadsBackToTheSameConfig) {
  const config::Config original = load_text(kRichConfig).config;
  const auto shown = write("shown/effective.toml", config::to_toml(original));
  const auto reloaded = config::check_file(shown, env());
  EXPECT_EQ(reloaded.warnings.size(), 2u) << dump(reloaded.warnings);  // proxied_mcps, host_commands
  for (const std::string& warning : reloaded.warnings)
    EXPECT_NE(warning.find("read but not used"), std::string::npos) << warning;
  nlohmann::json expected = config::to_json(original);
  nlohmann::json actual = config::to_json(reloaded.config);
  expected.erase("sources");
  actual.erase("sources");
  EXPECT_EQ(actual, expected);
  EXPECT_FALSE(reloaded.config.proxied_mcps.contains("filesystem"));
  EXPECT_FALSE(reloaded.config.jobs.slurm.limit.contains("memory"));
}

TEST_F(ConfigTest, ToJsonUsesTheTomlNames) {
  const nlohmann::json json = config::to_json(load_text(kRichConfig).config);
  EXPECT_EQ(json["namespace"]["instances_dir"], (home() / "inst").string());
  EXPECT_EQ(json["namespace"]["default_network"], "off");
  EXPECT_EQ(json["namespace"]["env"]["LANG"], "C.UTF-8");
  EXPECT_EQ(json["namespace"]["sandbox_uid"], 0);
  EXPECT_EQ(json["jobs"]["max_timeout"], 3600);
  EXPECT_EQ(json["jobs"]["local"]["limit"]["cpus"], (nlohmann::json{{"default", 2}, {"max", 4}}));
  EXPECT_EQ(json["jobs"]["slurm"]["limit"],
            (nlohmann::json{{"cpus", {{"default", 1}, {"max", 8}}}, {"gpus", {{"default", 0}, {"max", 2}}}}));
  EXPECT_EQ(json["resource"]["context_dirs"], nlohmann::json::array({(root() / "ctx").string()}));
  EXPECT_EQ(json["mcp"]["result_type"], "text");
  EXPECT_EQ(json["dav"]["extras"]["data.set"], (nlohmann::json{{"path", "/srv/data"}, {"ro", false}}));
  EXPECT_EQ(json["proxied_mcps"]["git"]["idle_timeout"], 0.25);
  EXPECT_EQ(json["proxied_mcps"]["git"]["include"], nlohmann::json::array({"log*"}));
  EXPECT_FALSE(json["proxied_mcps"].contains("filesystem"));
  EXPECT_EQ(json["host_commands"]["uptime"],
            (nlohmann::json{{"command", "uptime"}, {"description", "load of the host"}, {"timeout", 30.0}}));
  EXPECT_EQ(json["sources"], nlohmann::json::array({file()}));
}

}  // namespace

// ---- [server] ---------------------------------------------------------------------------------

TEST_F(ConfigTest, ServerDefaultsAndOverrides) {
  const config::Config defaults = load_text("").config;
  EXPECT_EQ(defaults.server.host, "127.0.0.1");
  EXPECT_EQ(defaults.server.port, 8000);
  EXPECT_EQ(defaults.server.path, "/mcp");
  EXPECT_EQ(defaults.server.session_idle_timeout, 300);
  EXPECT_TRUE(defaults.server.auth_token.empty());
  EXPECT_EQ(defaults.server.state_dir.filename(), "ns-hpc");

  const config::Config cfg = load_text(R"([server]
port = 0
path = "/api/mcp"
allowed_hosts = ["hpc-login", "hpc-login.example.org"]
session_idle_timeout = 60
auth_token = "s3cret-s3cret-s3cret"
)")
                                 .config;
  EXPECT_EQ(cfg.server.port, 0);
  EXPECT_EQ(cfg.server.path, "/api/mcp");
  EXPECT_EQ(cfg.server.allowed_hosts, strings({"hpc-login", "hpc-login.example.org"}));
  EXPECT_EQ(cfg.server.session_idle_timeout, 60);
  // config show never prints the secret.
  EXPECT_EQ(config::to_json(cfg)["server"]["auth_token"], "<set, hidden>");
}

TEST_F(ConfigTest, ServerRefusesBadValuesNamingTheKey) {
  const Lines found = problems_of(R"([server]
port = 70000
path = "mcp"
session_idle_timeout = 0
max_sessions = "many"
)");
  EXPECT_TRUE(has_line_containing(found, "server.port")) << dump(found);
  EXPECT_TRUE(has_line_containing(found, "server.path")) << dump(found);
  EXPECT_TRUE(has_line_containing(found, "server.session_idle_timeout")) << dump(found);
  EXPECT_TRUE(has_line_containing(found, "server.max_sessions")) << dump(found);
}

// The caps that keep one client, sandbox or local user from starving the others.
TEST_F(ConfigTest, ServerCapsDefaultsOverridesAndBounds) {
  const config::Config defaults = load_text("").config;
  EXPECT_EQ(defaults.server.header_timeout, 10);
  EXPECT_EQ(defaults.server.max_connections, 1024);
  EXPECT_EQ(defaults.server.max_connections_per_peer, 256);
  EXPECT_EQ(defaults.server.max_sessions_per_peer, 32);
  EXPECT_EQ(defaults.server.max_requests_per_session, 16);
  EXPECT_EQ(defaults.server.max_requests_per_peer, 128);
  EXPECT_EQ(defaults.server.max_session_buffer_bytes, 32 * 1024 * 1024);
  EXPECT_EQ(defaults.server.max_buffer_bytes, 256 * 1024 * 1024);

  const config::Config cfg = load_text(R"([server]
header_timeout = 2
max_connections = 64
max_connections_per_peer = 8
max_sessions_per_peer = 4
max_requests_per_session = 2
max_requests_per_peer = 6
max_session_buffer_bytes = 1048576
max_buffer_bytes = 4194304
)")
                                 .config;
  EXPECT_EQ(cfg.server.header_timeout, 2);
  EXPECT_EQ(cfg.server.max_connections, 64);
  EXPECT_EQ(cfg.server.max_connections_per_peer, 8);
  EXPECT_EQ(cfg.server.max_sessions_per_peer, 4);
  EXPECT_EQ(cfg.server.max_requests_per_session, 2);
  EXPECT_EQ(cfg.server.max_requests_per_peer, 6);
  EXPECT_EQ(cfg.server.max_session_buffer_bytes, 1048576);
  EXPECT_EQ(cfg.server.max_buffer_bytes, 4194304);
  const auto shown = config::to_json(cfg)["server"];
  EXPECT_EQ(shown["header_timeout"], 2);
  EXPECT_EQ(shown["max_connections_per_peer"], 8);
  EXPECT_EQ(shown["max_buffer_bytes"], 4194304);

  const Lines found = problems_of(R"([server]
header_timeout = 0
max_connections = 0
max_connections_per_peer = -1
max_sessions_per_peer = 0
max_requests_per_session = 0
max_requests_per_peer = "many"
max_session_buffer_bytes = 1000
max_buffer_bytes = 0
)");
  for (const char* key : {"server.header_timeout", "server.max_connections", "server.max_connections_per_peer",
                          "server.max_sessions_per_peer", "server.max_requests_per_session", "server.max_requests_per_peer",
                          "server.max_session_buffer_bytes", "server.max_buffer_bytes"})
    EXPECT_TRUE(has_line_containing(found, std::string(key) + ":")) << key << "\n" << dump(found);
}

TEST_F(ConfigTest, ServerStateDirIsTheSystemOneAsRoot) {
  auto opts = options(write("c.toml", ""));
  opts.as_root = true;
  EXPECT_EQ(config::load(opts).config.server.state_dir, stdfs::path(config::kRootStateDir));
}

// ---- enumerations, terminal limits, the key table ---------------------------------------------

TEST_F(ConfigTest, StatusSourceIsAnEnumSpelledAsInToml) {
  EXPECT_EQ(load_text("[jobs.slurm]\nstatus_source = \"sacct\"\n").config.jobs.slurm.status_source,
            config::StatusSource::sacct);
  EXPECT_EQ(problems_of("[jobs.slurm]\nstatus_source = \"accounting\"\n"),
            Lines{file() + ":2:17: jobs.slurm.status_source: \"accounting\" is not allowed; use \"auto\", "
                           "\"sacct\" or \"squeue\""});
  EXPECT_EQ(config::to_json(load_text("").config)["jobs"]["slurm"]["status_source"], "auto");
  EXPECT_EQ(config::to_string(config::StatusSource::automatic), "auto");
  EXPECT_EQ(config::from_string<config::StatusSource>("squeue"), config::StatusSource::squeue);
  EXPECT_EQ(config::from_string<config::StatusSource>("automatic"), std::nullopt);
  EXPECT_EQ(config::parse_network("off"), config::Network::off);
  EXPECT_EQ(config::parse_network("none"), std::nullopt);
}

TEST_F(ConfigTest, TerminalLimitsKeepTheirDefaultsMinimumsAndMaximums) {
  const auto loaded = load_text("[terminal.limits]\nmemory = 512\ngpus = 1\n");
  EXPECT_EQ(loaded.config.terminal.limits.at("memory"), 512);
  EXPECT_EQ(loaded.config.terminal.limits.at("cpus"), 2);
  EXPECT_EQ(loaded.warnings, Lines{file() + ":3:1: unknown key 'terminal.limits.gpus' ignored"});
  EXPECT_EQ(problems_of("[terminal.limits]\npids = 0\n"),
            Lines{file() + ":2:8: terminal.limits.pids: 0 is out of range; use an integer (processes, 8..4194304)"});
  EXPECT_EQ(problems_of("[terminal.limits]\ncpus = 1025\n"),
            Lines{file() + ":2:8: terminal.limits.cpus: 1025 is out of range; use an integer (cores, 1..1024)"});
}

// [namespace] limits: absent or 0 is no limit; a value is at least the local minimum (a sandbox
// cannot start below it); names are the cgroup limits only.
TEST_F(ConfigTest, NamespaceLimitsAreOffByDefaultAndCheckedLikeLocalLimits) {
  const auto defaults = load_text("");
  EXPECT_EQ(defaults.config.ns.limits, (std::map<std::string, std::int64_t>{{"cpus", 0}, {"memory", 0}, {"pids", 0}}));
  const auto loaded = load_text("[namespace]\nlimits = { memory = 64, pids = 0, output = 5 }\n");
  EXPECT_EQ(loaded.config.ns.limits.at("memory"), 64);
  EXPECT_EQ(loaded.config.ns.limits.at("pids"), 0);
  EXPECT_EQ(loaded.config.ns.limits.at("cpus"), 0);
  EXPECT_EQ(loaded.config.ns.limits.count("output"), 0u);
  EXPECT_EQ(loaded.warnings, Lines{file() + ":2:35: unknown key 'namespace.limits.output' ignored"});
  EXPECT_EQ(problems_of("[namespace.limits]\nmemory = 8\n"),
            Lines{file() + ":2:10: namespace.limits.memory: 8 is below the minimum of 16 for memory; use 0 for no "
                           "limit, or 16 or more"});
  EXPECT_EQ(problems_of("[namespace.limits]\npids = -1\ncpus = 1025\n"),
            (Lines{file() + ":3:8: namespace.limits.cpus: 1025 is out of range; use an integer (cores, 0..1024)",
                   file() + ":2:8: namespace.limits.pids: -1 is out of range; use an integer (processes, 0..4194304)"}));
  const auto least = load_text("[namespace.limits]\ncpus = 1\nmemory = 16\npids = 8\n");
  EXPECT_EQ(least.config.ns.limits, (std::map<std::string, std::int64_t>{{"cpus", 1}, {"memory", 16}, {"pids", 8}}));
}

TEST_F(ConfigTest, AMountEqualToADefaultMountIsAnErrorAtTheGivenOne) {
  EXPECT_EQ(problems_of("[namespace]\nworkspace_mount = \"/output\"\n"),
            Lines{file() + ":2:19: namespace.workspace_mount: \"/output\" is also namespace.output_mount; the "
                           "three mounts must differ"});
}

TEST(ConfigKeys, EveryKeyHasHelpAndADefaultOrIsRequired) {
  using nshpc::config::detail::KeyDoc;
  using nshpc::config::detail::KeyKind;
  int values = 0;
  nshpc::config::detail::for_each_key([&](const KeyDoc& doc, const std::string& key, const std::string&) {
    if (doc.kind == KeyKind::table) return;
    EXPECT_FALSE(doc.about.help.empty()) << key;
    if (doc.kind != KeyKind::value) return;
    ++values;
    EXPECT_NE(doc.about.defaults_to.empty(), doc.about.required.empty())
        << key << ": a key has a default or is required, not both and not neither";
  });
  EXPECT_GT(values, 70);
}

// The README's table of keys is generated from the key table (src/config/keys.cpp).
TEST(ConfigKeys, ReadmeTableIsTheKeyTable) {
  constexpr std::string_view kBegin =
      "<!-- config-keys: generated from src/config/keys.cpp by `ns-hpc config keys --markdown` -->\n";
  constexpr std::string_view kEnd = "<!-- config-keys: end -->";
  const stdfs::path readme = stdfs::path(NSHPC_SOURCE_DIR) / "README.md";
  std::ifstream in(readme);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::size_t begin = text.find(kBegin);
  ASSERT_NE(begin, std::string::npos) << readme << " lacks the line " << kBegin;
  const std::size_t start = begin + kBegin.size();
  const std::size_t end = text.find(kEnd, start);
  ASSERT_NE(end, std::string::npos) << readme << " lacks the line " << kEnd;
  const std::string expected = config::keys_markdown();
  const std::string found = text.substr(start, end - start);
  if (found != expected && std::getenv("NSHPC_REFRESH_README")) {
    std::ofstream(readme) << text.substr(0, start) << expected << text.substr(end);
    GTEST_SKIP() << "refreshed the table of " << readme;
  }
  EXPECT_EQ(found, expected)
      << "README.md's table of configuration keys differs from the key table (src/config/keys.cpp). Refresh "
         "it: NSHPC_REFRESH_README=1 build/tests/nshpc_unit --gtest_filter=ConfigKeys.ReadmeTableIsTheKeyTable "
         "(or paste `ns-hpc config keys --markdown` between the config-keys lines of README.md)";
}
