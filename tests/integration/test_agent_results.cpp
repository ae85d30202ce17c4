// What the agent sees (issue 13, "Result size" and "Jobs"), through the real `ns-hpc run` on
// stdio: results sized for a model, tool schemas that say their bounds, and jobs that take
// terminal_execute's options and speak one status vocabulary. And image previews (issue 29):
// decoded by the ns-hpc binary in a process of its own, refused from the header when too large.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <webp/encode.h>

#include "base/error.hpp"
#include "base/json.hpp"
#include "base/text.hpp"
#include "common/png.hpp"
#include "files/content.hpp"
#include "files/image.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

bool is_root() { return ::geteuid() == 0; }

std::size_t chars(const std::string& s) { return nshpc::text::utf8_length(s); }

class AgentResults : public ::testing::Test {
 protected:
  void SetUp() override { env_.create("agentview"); }
  // The whole response to a tools/call, as the client received it.
  json call(McpSession& server, const std::string& tool, const json& args) {
    json r = server.call_and_wait(tool, args);
    EXPECT_TRUE(r.is_object() && r.contains("result")) << r.dump().substr(0, 500);
    return r;
  }
  // Files of the instance's workspace folder .ns_hpc_output whose names start with `prefix`.
  std::set<std::string> outputs(const std::string& prefix) {
    std::set<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(env_.instances() / "agentview" / "workspace" / ".ns_hpc_output", ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) names.insert(e.path().filename().string());
    return names;
  }
  Env env_{"[jobs]\ncancel_grace = 1\n"};
};

}  // namespace

// A command that prints 5 MB: the output limit (2 MiB) kills it, and the result carries at most
// [mcp] max_result_chars of output, head and tail, with a marker naming the file with the whole.
TEST_F(AgentResults, BigOutputIsCutToMaxResultCharsWithHeadTailAndTheWholeInAFile) {
  McpSession server(env_);
  json r = call(server, "terminal_execute",
                {{"instance_id", "agentview"}, {"command", "seq 1 1000000 | head -c 5000000; echo done-writing >&2"}});
  const std::size_t response_bytes = r.dump().size();
  std::printf("[ result of a 5 MB output: %zu bytes ]\n", response_bytes);
  const json out = r["result"]["structuredContent"];
  const std::string stdout_text = out["stdout"];
  // The bound is per result: the output's two copies (the text and structuredContent, for
  // clients that read only one) share it.
  EXPECT_LE(chars(stdout_text) + chars(out["stderr"].get<std::string>()) + chars(result_text(r)), 30000u);
  EXPECT_GT(chars(stdout_text), 10000u) << "each copy gets about half";
  EXPECT_EQ(stdout_text.rfind("1\n2\n3\n", 0), 0u) << stdout_text.substr(0, 100);
  const auto marker = stdout_text.find("characters cut here; the whole output is in /workspace/.ns_hpc_output/term-");
  ASSERT_NE(marker, std::string::npos) << stdout_text.substr(0, 200);
  ASSERT_TRUE(out.contains("stdout_file")) << out.dump().substr(0, 300);
  const std::string file = out["stdout_file"];
  EXPECT_NE(stdout_text.find(file), std::string::npos);
  // The whole output (up to the 2 MiB output limit) is there, readable from the sandbox.
  json whole = server.tool("terminal_execute", {{"instance_id", "agentview"}, {"command", "wc -c < " + file + "; head -2 " + file}});
  EXPECT_GE(std::stoul(whole["stdout"].get<std::string>()), 2000000u) << whole.dump();
  EXPECT_NE(whole["stdout"].get<std::string>().find("\n1\n2\n"), std::string::npos) << whole.dump();
  // Owned by the sandbox's uid (65534 when the server runs as root).
  struct stat st{};
  ASSERT_EQ(::stat((env_.instances() / "agentview" / "workspace" / file.substr(std::string("/workspace/").size())).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, is_root() ? 65534u : ::geteuid());
  // The text is a readable summary and the (cut) output, not a JSON copy of structuredContent.
  const std::string text = result_text(r);
  EXPECT_EQ(text.rfind("exit code 1 (", 0), 0u) << text.substr(0, 100);
  EXPECT_EQ(text.find("{\"stdout\""), std::string::npos);
  EXPECT_NE(text.find("output limit exceeded"), std::string::npos) << text.substr(text.size() - 400);
}

TEST_F(AgentResults, CharactersNotBytesAreCountedAndOnlyTheLastFiveWholeOutputsAreKept) {
  McpSession server(env_);
  // 100,000 two-byte characters: 200,000 bytes, cut to characters.
  for (int i = 0; i < 7; ++i) {
    json out = server.tool("terminal_execute",
                           {{"instance_id", "agentview"}, {"command", "for i in $(seq 1 1000); do printf 'é%.0s' $(seq 1 100); echo; done"}});
    const std::string s = out["stdout"];
    EXPECT_LE(chars(s), 15000u) << "half of the result's budget: the text carries the other copy";
    EXPECT_GT(s.size(), 15000u) << "two-byte characters: more bytes than characters";
    EXPECT_TRUE(out.contains("stdout_file"));
    EXPECT_FALSE(out.contains("stderr_file")) << "only a cut stream gets a file";
  }
  EXPECT_EQ(outputs("term-").size(), 5u);
  // Nothing cut, nothing written: a small output costs little and makes no file.
  json r = call(server, "terminal_execute", {{"instance_id", "agentview"}, {"command", "echo hi"}});
  EXPECT_EQ(result_text(r).find("\n--- stdout ---\nhi\n"), result_text(r).find('\n')) << result_text(r);
  EXPECT_LT(r.dump().size(), 300u) << r.dump();
  EXPECT_EQ(outputs("term-").size(), 5u);
}

TEST_F(AgentResults, ASmallerMaxResultCharsIsHonouredAndEveryTextIsBounded) {
  Env small("[mcp]\nmax_result_chars = 2000\n");
  small.create("beta");
  McpSession server(small);
  json r = call(server, "terminal_execute", {{"instance_id", "beta"}, {"command", "seq 1 100000; seq 1 50000 >&2"}});
  const json out = r["result"]["structuredContent"];
  EXPECT_LE(chars(out["stdout"].get<std::string>()) + chars(out["stderr"].get<std::string>()) + chars(result_text(r)),
            2000u);
  EXPECT_TRUE(out.contains("stdout_file") && out.contains("stderr_file")) << out.dump();
  // A job's tails fit too.
  json job = call(server, "submit_job", {{"instance_id", "beta"}, {"command", "seq 1 100000"}, {"tail", 1000}, {"timeout", 30}});
  EXPECT_LE(chars(result_text(job)), 2000u);
  EXPECT_LE(chars(job["result"]["structuredContent"]["stdout_tail"].get<std::string>()), 1000u);
  // A listing ends its page where the bound is reached; the cursor leads on from there.
  for (int i = 0; i < 12; ++i) small.create(fmt::format("gamma-{:02}", i), {"-d", std::string(120, 'd')});
  json page = call(server, "list_instances", {{"limit", 50}, {"sort", "id"}});
  const json listed = page["result"]["structuredContent"];
  const std::size_t count = listed["count"];
  EXPECT_GT(count, 0u);
  EXPECT_LT(count, 13u) << "the page stopped short of the limit";
  EXPECT_EQ(listed["next_cursor"], std::to_string(count));
  EXPECT_LE(chars(result_text(page)) + chars(listed.dump()), 2000u);
  json rest = call(server, "list_instances", {{"limit", 50}, {"sort", "id"}, {"cursor", listed["next_cursor"]}});
  // By id: beta, gamma-00, gamma-01, …; the next page starts with the first one left out.
  EXPECT_EQ(rest["result"]["structuredContent"]["instances"][0]["id"], fmt::format("gamma-{:02}", count - 1));
}

// tools/list: bounds and a description for every argument, the same words for the same argument.
TEST_F(AgentResults, ToolSchemasDeclareTheirBoundsAndDescribeEveryField) {
  McpSession server(env_);
  json list = server.wait_for(server.request("tools/list", json::object()));
  std::printf("[ tools/list: %zu bytes ]\n", list["result"].dump().size());
  std::map<std::string, json> tools;
  for (const auto& t : list["result"]["tools"]) tools[t["name"]] = t;
  // The execution tools, read by the model on every turn: 12,132 bytes before issue 13 (with
  // fewer arguments, undescribed fields and untyped list items).
  std::size_t execution = 0;
  for (const auto& name : {"terminal_execute", "submit_job", "poll_job", "list_jobs", "cancel_job"})
    execution += tools[name].dump().size();
  std::printf("[ terminal_execute + job tools in tools/list: %zu bytes ]\n", execution);
  EXPECT_LT(execution, 11500u);
  const json timeout = tools["terminal_execute"]["inputSchema"]["properties"]["timeout"];
  EXPECT_EQ(timeout["minimum"], 1);
  EXPECT_EQ(timeout["maximum"], 3600);
  // The server enforces exactly that.
  json over = call(server, "terminal_execute", {{"instance_id", "agentview"}, {"command", "true"}, {"timeout", 3601}});
  EXPECT_TRUE(over["result"].value("isError", false));
  // Every argument of every tool is described, instance_id in the same words wherever it names
  // an existing instance (create_instance and restore_instance name a new one), and no tool's
  // description runs on.
  std::set<std::string> instance_descriptions;
  for (const auto& [name, tool] : tools) {
    const json props = tool["inputSchema"]["properties"];
    for (const auto& [arg, schema] : props.items())
      EXPECT_TRUE(schema.contains("description")) << name << "." << arg << " has no description";
    if (props.contains("instance_id") && name != "create_instance" && name != "restore_instance")
      instance_descriptions.insert(props["instance_id"]["description"].get<std::string>());
    EXPECT_LE(tool["description"].get<std::string>().size(), 560u) << name << ": " << tool["description"];
  }
  EXPECT_EQ(instance_descriptions.size(), 1u) << "instance_id is described the same everywhere";
  EXPECT_EQ(tools["terminal_execute"]["inputSchema"]["properties"]["command"],
            tools["submit_job"]["inputSchema"]["properties"]["command"]);
  // An outputSchema names what every result has; the statuses are in list_jobs' status argument.
  EXPECT_EQ(tools["list_jobs"]["outputSchema"], (json{{"type", "object"}, {"required", {"jobs", "total"}}}));
  EXPECT_TRUE(tools["list_jobs"]["inputSchema"]["properties"]["status"]["enum"].dump().find("output_limit") !=
              std::string::npos);
  const json limits = tools["submit_job"]["inputSchema"]["properties"]["limits"]["properties"];
  EXPECT_NE(limits["memory"]["description"].get<std::string>().find("MiB"), std::string::npos);
  EXPECT_EQ(limits["memory"]["minimum"], 16);
  EXPECT_EQ(limits["cpus"]["minimum"], 1);
}

// Jobs run by the same shell as terminal_execute and take its options.
TEST_F(AgentResults, JobsTakeTerminalExecutesShellArgsDirectoryStdinAndEnv) {
  McpSession server(env_);
  json bash = server.tool("submit_job", {{"instance_id", "agentview"},
                                         {"command", "echo {1..3}; [[ 1 == 1 ]] && echo bash"},
                                         {"timeout", 30}});
  EXPECT_EQ(bash["status"], "completed") << bash.dump();
  EXPECT_EQ(bash["stdout_tail"], "1 2 3\nbash");
  json exact = server.tool("submit_job", {{"instance_id", "agentview"}, {"args", {"printf", "[%s]", "a b", "$HOME"}},
                                          {"working_directory", "/tmp"}, {"timeout", 30}});
  EXPECT_EQ(exact["stdout_tail"], "[a b][$HOME]") << exact.dump();
  json options = server.tool("submit_job", {{"instance_id", "agentview"},
                                            {"command", "pwd; cat; echo \"$GREETING\""},
                                            {"working_directory", "/tmp"},
                                            {"stdin", "from stdin\n"},
                                            {"env", {{"GREETING", "hello there"}}},
                                            {"timeout", 30}});
  EXPECT_EQ(options["stdout_tail"], "/tmp\nfrom stdin\nhello there") << options.dump();
  json relative = call(server, "submit_job", {{"instance_id", "agentview"}, {"command", "true"}, {"working_directory", "tmp"}});
  EXPECT_NE(result_text(relative).find("must be an absolute path"), std::string::npos) << relative.dump();
}

// A local job's result carries what is known: no null Slurm fields, no empty strings.
TEST_F(AgentResults, LocalJobResultsCarryNoNullSlurmFieldsOrEmptyStrings) {
  McpSession server(env_);
  json r = call(server, "submit_job", {{"instance_id", "agentview"}, {"command", "echo hi"}, {"timeout", 30}});
  const json job = r["result"]["structuredContent"];
  EXPECT_EQ(job["status"], "completed") << job.dump();
  for (const auto& [key, value] : job.items()) {
    EXPECT_FALSE(value.is_null()) << key;
    EXPECT_FALSE(value.is_string() && value.get<std::string>().empty()) << key << " is an empty string";
  }
  EXPECT_FALSE(job.contains("slurm_job_id"));
  std::printf("[ submit_job echo hi: %zu bytes ]\n", r.dump().size());
  // What every local job carries (a host that cannot enforce limits adds its reasons).
  json known = job;
  known.erase("unenforced");
  EXPECT_LT(known.dump().size(), 650u) << known.dump();
  json running = server.tool("submit_job", {{"instance_id", "agentview"}, {"command", "sleep 30"}, {"timeout", 0}});
  EXPECT_FALSE(running.contains("finished_at")) << running.dump();
  server.tool("cancel_job", {{"instance_id", "agentview"}, {"job_id", running["job_id"]}});
}

// The limits are visible inside: variables, and nproc (and, with cgroups, CPU affinity) = cpus.
// A running job has no exit code yet: its result leaves the field out (never null), as the last
// page of list_jobs leaves out next_offset. Deleting or archiving its instance is refused naming
// the job and the tool that ends it.
TEST_F(AgentResults, ARunningJobCarriesNoNullAndARefusedDeleteNamesIt) {
  env_.create("busy");
  McpSession server(env_);
  json running = server.tool("submit_job", {{"instance_id", "busy"}, {"command", "sleep 300"}, {"timeout", 0}});
  ASSERT_EQ(running["status"], "running") << running.dump();
  for (const auto& [key, value] : running.items()) EXPECT_FALSE(value.is_null()) << key << " is null";
  EXPECT_FALSE(running.contains("exit_code")) << running.dump();
  json listed = server.tool("list_jobs", {{"instance_id", "busy"}});
  EXPECT_FALSE(listed.contains("next_offset")) << listed.dump();
  for (const auto& [key, value] : listed["jobs"][0].items()) EXPECT_FALSE(value.is_null()) << key << " is null";
  const std::string job = running["job_id"];
  for (const char* tool : {"delete_instance", "archive_instance"}) {
    json refused = call(server, tool, {{"instance_id", "busy"}});
    EXPECT_TRUE(refused["result"].value("isError", false)) << refused.dump();
    const std::string said = result_text(refused);
    EXPECT_NE(said.find("1 job still running (" + job + "); cancel them first (cancel_job"), std::string::npos)
        << said;
  }
  server.tool("cancel_job", {{"instance_id", "busy"}, {"job_id", job}});
  json done = server.tool("poll_job", {{"instance_id", "busy"}, {"job_id", job}});
  EXPECT_EQ(done["status"], "cancelled") << done.dump();
  EXPECT_TRUE(done.contains("exit_code")) << done.dump();
  EXPECT_EQ(server.tool("delete_instance", {{"instance_id", "busy"}})["deleted"], "busy");
}

TEST_F(AgentResults, AJobSeesItsLimits) {
  McpSession server(env_);
  json j = server.tool("submit_job",
                       {{"instance_id", "agentview"},
                        {"command", "echo $NS_HPC_JOB_ID $NS_HPC_LIMIT_CPUS $NS_HPC_LIMIT_MEMORY_MIB $NS_HPC_LIMIT_TIME_S; nproc; "
                                    "grep -c . /dev/null; grep Cpus_allowed_list /proc/self/status | tr -d '\\t'"},
                        {"limits", {{"cpus", 1}, {"memory", 512}, {"time", 60}}},
                        {"timeout", 30}});
  ASSERT_EQ(j["status"], "completed") << j.dump();
  const std::string tail = j["stdout_tail"];
  EXPECT_EQ(tail.rfind(j["job_id"].get<std::string>() + " 1 512 60\n1\n", 0), 0u) << tail;
  if (is_root() && std::thread::hardware_concurrency() > 1) {
    // One core allowed: "Cpus_allowed_list:N" with a single number.
    const std::string allowed = tail.substr(tail.find("Cpus_allowed_list:") + 18);
    EXPECT_EQ(allowed.find_first_of(",-"), std::string::npos) << tail;
  }
}

// One status vocabulary: output_limit and out_of_memory for local jobs too, found by the filter.
TEST_F(AgentResults, OutputLimitAndOutOfMemoryAreStatusesTheFilterFinds) {
  McpSession server(env_);
  // The shell goes on after the write failed, and exits 0: still output_limit.
  json cut = server.tool("submit_job", {{"instance_id", "agentview"},
                                        {"command", "head -c 3000000 /dev/zero; echo after >&2; true"},
                                        {"limits", {{"output", 1}}},
                                        {"timeout", 30}});
  EXPECT_EQ(cut["status"], "output_limit") << cut.dump();
  EXPECT_NE(cut["reason"].get<std::string>().find("stdout reached the 1 MiB limit"), std::string::npos) << cut.dump();
  json found = server.tool("list_jobs", {{"instance_id", "agentview"}, {"status", "output_limit"}});
  ASSERT_EQ(found["total"], 1) << found.dump();
  EXPECT_EQ(found["jobs"][0]["job_id"], cut["job_id"]);
  if (is_root()) {
    json oom = server.tool("submit_job", {{"instance_id", "agentview"},
                                          {"command", "perl -e '@a=(); while(1){push @a, q(x) x (1<<20)}'"},
                                          {"limits", {{"memory", 64}}},
                                          {"timeout", 60}});
    EXPECT_EQ(oom["status"], "out_of_memory") << oom.dump();
    json list = server.tool("list_jobs", {{"instance_id", "agentview"}, {"status", "out_of_memory"}});
    EXPECT_EQ(list["total"], 1) << list.dump();
  }
}

TEST_F(AgentResults, ACancelledJobSaysTheSignalThatEndedIt) {
  McpSession server(env_);
  json j = server.tool("submit_job",
                       {{"instance_id", "agentview"}, {"command", "echo started; exec sleep 300"}, {"timeout", 0}});
  ASSERT_EQ(j["status"], "running") << j.dump();
  // Cancelled once its command runs: a cancel during the sandbox's set-up, before there is a
  // command to take SIGTERM, ends in SIGKILL after the grace (and says so).
  const fs::path out = env_.instances() / "agentview/workspace/.ns_hpc_output" / (j["job_id"].get<std::string>() + ".out");
  ASSERT_TRUE(eventually([&] { return read_text(out) == "started\n"; }, std::chrono::seconds(20)));
  json c = server.tool("cancel_job", {{"instance_id", "agentview"}, {"job_id", j["job_id"]}});
  EXPECT_EQ(c["status"], "cancelled") << c.dump();
  EXPECT_EQ(c["exit_code"], 143) << c.dump();
  EXPECT_EQ(c["signal"], 15) << c.dump();
  EXPECT_NE(c["reason"].get<std::string>().find("SIGTERM"), std::string::npos) << c.dump();
}

TEST_F(AgentResults, AFilterMatchingNothingSaysHowManyJobsAreInOtherStates) {
  McpSession server(env_);
  server.tool("submit_job", {{"instance_id", "agentview"}, {"command", "true"}, {"timeout", 30}});
  server.tool("submit_job", {{"instance_id", "agentview"}, {"command", "false"}, {"timeout", 30}});
  json r = call(server, "list_jobs", {{"instance_id", "agentview"}, {"status", "running"}});
  EXPECT_EQ(result_text(r), "No running jobs (2 in other states).") << r.dump();
}

// ---------------------------------------------------------------------------------------------
// Image previews: files::make_thumbnail runs this build's ns-hpc as its decoder.

namespace {

using nshpc::tests::declared_png;
using nshpc::tests::make_png;

nshpc::files::ImageLimits decoder_limits() {
  nshpc::files::ImageLimits limits;
  limits.program = binary();
  return limits;
}

// The message of the Error make_thumbnail throws ("" when it returns).
std::string refusal(const std::string& data, const std::string& mime, const nshpc::files::ImageLimits& limits) {
  try {
    nshpc::files::make_thumbnail(data, mime, limits);
  } catch (const nshpc::Error& e) {
    return e.what();
  }
  return "";
}

// The server's peak resident memory (VmHWM of /proc/PID/status), in KiB.
std::size_t peak_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}

}  // namespace

TEST(ImagePreviews, DecodedInAProcessOfTheirOwnAndScaledDown) {
  namespace files = nshpc::files;
  const files::ImageLimits limits = decoder_limits();
  const std::string small = make_png(3, 2);
  files::Thumbnail t = files::make_thumbnail(small, "image/png", limits);
  EXPECT_EQ(t.original_width, 3);
  EXPECT_EQ(t.original_height, 2);
  EXPECT_FALSE(t.scaled);
  EXPECT_EQ(t.data, small);
  const std::string wide = make_png(2000, 10);
  files::Thumbnail s = files::make_thumbnail(wide, "image/png", limits);
  EXPECT_TRUE(s.scaled);
  EXPECT_EQ(s.original_width, 2000);
  EXPECT_EQ(s.width, 1568);
  EXPECT_EQ(s.height, 8);
  EXPECT_EQ(s.mime, "image/jpeg");  // no transparency
  EXPECT_EQ(s.data.substr(0, 3), "\xff\xd8\xff");
  const std::string corrupt = small.substr(0, 40) + std::string(100, '\xff');
  EXPECT_NE(refusal(corrupt, "image/png", limits), "");
  EXPECT_NE(refusal("GIF89a\xff\xff\xff\xff", "image/gif", limits), "");
  EXPECT_NE(refusal(small, "image/tiff", limits).find("image/tiff images are not decoded"), std::string::npos);
  files::ImageLimits few = limits;
  few.max_pixels = 10000;
  EXPECT_EQ(refusal(wide, "image/png", few),
            "the image is 2000×10 (20000 pixels); previews are made of images up to 10000 pixels");
}

TEST(ImagePreviews, WebPIsDecodedAndScaled) {
  namespace files = nshpc::files;
  const int w = 1800, h = 20;
  std::vector<std::uint8_t> rgba(static_cast<std::size_t>(w) * h * 4);
  for (std::size_t i = 0; i < rgba.size(); ++i) rgba[i] = (i % 4 == 3) ? 255 : static_cast<std::uint8_t>(i * 7);
  std::uint8_t* out = nullptr;
  const std::size_t size = WebPEncodeLosslessRGBA(rgba.data(), w, h, w * 4, &out);
  ASSERT_GT(size, 0u);
  const std::string webp(reinterpret_cast<const char*>(out), size);
  WebPFree(out);
  EXPECT_EQ(files::sniff(webp).mime, "image/webp");
  files::Thumbnail t = files::make_thumbnail(webp, "image/webp", decoder_limits());
  EXPECT_EQ(t.original_width, w);
  EXPECT_EQ(t.original_height, h);
  EXPECT_TRUE(t.scaled);
  EXPECT_EQ(t.width, 1568);
  EXPECT_EQ(t.mime, "image/jpeg");
  EXPECT_NE(refusal(webp.substr(0, webp.size() / 2), "image/webp", decoder_limits()), "");
}

// The decoder's memory is a limit of its own process: an image that needs more than it is told
// so, whatever the server's own size.
TEST(ImagePreviews, TheDecodersMemoryLimitIsItsOwnAndSaidWhenReached) {
  nshpc::files::ImageLimits tight = decoder_limits();
  tight.max_memory = std::size_t{96} << 20;
  // 16 megapixels (under the size limit): its 48 MB of pixels do not fit in 96 MiB with the binary.
  const std::string message = refusal(declared_png(4000, 4000), "image/png", tight);
  EXPECT_NE(message.find("decoding it needs more than the 96 MiB the image decoder may use"), std::string::npos)
      << message;
  // With the default limit the same file gets as far as its data: too short, not too large.
  const std::string short_data = refusal(declared_png(4000, 4000), "image/png", decoder_limits());
  EXPECT_NE(short_data, "");
  EXPECT_EQ(short_data.find("MiB"), std::string::npos) << short_data;
}

// Issue 29: two concurrent previews of a 203 KiB PNG declaring 7000x7000 took the server to ~910
// MiB, and at 4-8 concurrent calls every preview failed. Now eight at once each get a refusal
// naming the size (from the header: nothing is decoded), eight normal images at once each come
// back as an image, and the server stays small.
TEST_F(AgentResults, EightConcurrentPreviewsEachGetTheImageOrARefusalNamingTheSize) {
  const fs::path ws = env_.instances() / "agentview" / "workspace";
  struct stat owner{};
  ASSERT_EQ(::stat(ws.c_str(), &owner), 0);
  auto put = [&](const std::string& name, const std::string& data) {
    std::ofstream(ws / name, std::ios::binary) << data;
    ASSERT_EQ(::chown((ws / name).c_str(), owner.st_uid, owner.st_gid), 0);  // as if the sandbox wrote it
  };
  put("bomb.png", declared_png(7000, 7000));
  put("photo.png", make_png(1000, 800));
  McpSession server(env_);
  auto eight = [&](const std::string& path) {
    std::vector<int> ids;
    for (int i = 0; i < 8; ++i) ids.push_back(server.call("read_file", {{"instance_id", "agentview"}, {"path", path}}));
    std::vector<json> responses;
    for (int id : ids) responses.push_back(server.wait_for(id, std::chrono::seconds(120)));
    return responses;
  };
  for (const json& r : eight("/workspace/bomb.png")) {
    ASSERT_TRUE(r.contains("result")) << r.dump().substr(0, 300);
    EXPECT_TRUE(r["result"].value("isError", false));
    EXPECT_NE(result_text(r).find("the image is 7000×7000 (49 megapixels); previews are made of images up to 25 "
                                  "megapixels"),
              std::string::npos)
        << result_text(r);
  }
  for (const json& r : eight("/workspace/photo.png")) {
    ASSERT_TRUE(r.contains("result")) << r.dump().substr(0, 300);
    EXPECT_FALSE(r["result"].value("isError", false)) << result_text(r);
    bool image = false;
    for (const json& c : r["result"]["content"]) image = image || (c.value("type", "") == "image");
    EXPECT_TRUE(image) << r.dump().substr(0, 300);
    EXPECT_EQ(r["result"]["structuredContent"].value("width", 0), 1000);
    EXPECT_EQ(r["result"]["structuredContent"].value("height", 0), 800);
  }
  const std::size_t peak = peak_kib(server.pid());
  std::printf("[ the server's peak resident memory: %zu KiB ]\n", peak);
  EXPECT_GT(peak, 0u);
  EXPECT_LT(peak, 100u * 1024) << "the server's own memory stays under 100 MiB";
}
