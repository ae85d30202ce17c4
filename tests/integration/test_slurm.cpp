// Slurm jobs from the command line against a real single-node cluster (tests/slurm/cluster.sh).
// They run only with NSHPC_SLURM_TESTS=1 (tests/slurm/run-tests.sh sets it after starting the
// cluster); elsewhere they are skipped.
#include <sys/stat.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

bool slurm_enabled() {
  const char* v = std::getenv("NSHPC_SLURM_TESTS");
  return v && std::string(v) == "1";
}

// A counting wrapper: every call of `program` appends a line to <dir>/<name>.calls.
std::string counting_wrapper(const fs::path& dir, const std::string& program) {
  const fs::path wrapper = dir / ("count-" + program);
  std::ofstream(wrapper) << "#!/bin/sh\necho x >> '" << (dir / (program + ".calls")).string() << "'\nexec " << program
                         << " \"$@\"\n";
  ::chmod(wrapper.c_str(), 0755);
  return wrapper.string();
}

std::size_t calls(const fs::path& dir, const std::string& program) {
  std::ifstream in(dir / (program + ".calls"));
  std::size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

std::string config_for(const fs::path& root, const std::string& extra = "") {
  return "[jobs]\ncancel_grace = 1\n[jobs.slurm]\npoll_interval = 0.5\n"
         "sbatch_command = [\"" + counting_wrapper(root, "sbatch") +
         "\", \"--partition\", \"cpu\", \"--cpus-per-task={cpus}\", \"--mem={memory}M\"]\n"
         "squeue_command = [\"" + counting_wrapper(root, "squeue") + "\"]\n"
         "sacct_command = [\"" + counting_wrapper(root, "sacct") + "\"]\n"
         "scancel_command = [\"" + counting_wrapper(root, "scancel") + "\"]\n" + extra +
         "[jobs.slurm.limit]\ncpus = { default = 1, max = 64 }\nmemory = { default = 500, max = 4096 }\n";
}

class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!slurm_enabled()) GTEST_SKIP() << "no Slurm cluster here (tests/slurm/run-tests.sh runs these)";
    env_ = std::make_unique<Env>();
    std::ofstream(env_->config_file(), std::ios::app) << config_for(env_->root());
    env_->create("alpha");
  }
  json run(std::vector<std::string> extra, const std::string& command, int* exit_code = nullptr,
           std::string* err = nullptr) {
    std::vector<std::string> args{"instance", "run", "alpha", "--slurm", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--");
    args.push_back(command);
    Result r = env_->run(args, "", std::chrono::seconds(180));
    if (exit_code) *exit_code = r.exit_code;
    if (err) *err = r.err;
    auto j = nshpc::parse_json_or_discarded(r.out);
    if (!err) EXPECT_TRUE(j.is_object()) << r.out << r.err;
    return j;
  }
  json status(const std::string& job, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"instance", "status", "alpha", job, "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = env_->run(args, "", std::chrono::seconds(180));
    auto j = nshpc::parse_json_or_discarded(r.out);
    EXPECT_TRUE(j.is_object()) << r.out << r.err;
    return j;
  }
  std::size_t records() const {
    std::size_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(env_->instances() / "alpha" / ".ns_hpc_jobs", ec))
      n += e.path().extension() == ".state";
    return n;
  }
  std::unique_ptr<Env> env_;
};

}  // namespace

TEST_F(Slurm, JobCompletesWithItsOutput) {
  int rc = -1;
  json j = run({"-t", "120"}, "echo hello from slurm; echo oops >&2; id -u", &rc);
  EXPECT_EQ(j["status"], "completed") << j.dump(2);
  EXPECT_EQ(j["mode"], "slurm");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["scheduler_state"], "COMPLETED");
  EXPECT_FALSE(j["slurm_job_id"].get<std::string>().empty());
  const std::string out = j["stdout_tail"];
  EXPECT_NE(out.find("hello from slurm"), std::string::npos) << out;
  // The command ran in the sandbox: as the sandbox uid when ns-hpc runs as root.
  if (::geteuid() == 0) EXPECT_NE(out.find("65534"), std::string::npos) << out;
  EXPECT_EQ(j["stderr_tail"], "oops");
  EXPECT_EQ(rc, 0);
  // The audit log has the submission and the end.
  const std::string audit = read_text(env_->instances() / "alpha" / "audit.log");
  EXPECT_NE(audit.find("job.submitted"), std::string::npos);
  EXPECT_NE(audit.find("job.completed"), std::string::npos);
}

TEST_F(Slurm, ExitCodeIsKept) {
  int rc = -1;
  json j = run({"-t", "120"}, "exit 42", &rc);
  EXPECT_EQ(j["status"], "failed") << j.dump(2);
  EXPECT_EQ(j["exit_code"], 42);
  EXPECT_EQ(j["scheduler_state"], "FAILED");
  EXPECT_EQ(rc, 42);
}

TEST_F(Slurm, CancelOfARunningJob) {
  json j = run({"-t", "0"}, "echo started; sleep 300");
  const std::string id = j["job_id"];
  // Wait until Slurm runs it.
  ASSERT_TRUE(eventually([&] { return status(id)["status"] == "running"; }, std::chrono::seconds(60)));
  Result r = env_->run({"instance", "cancel", "alpha", id, "--json"}, "", std::chrono::seconds(120));
  json c = nshpc::parse_json_or_discarded(r.out);
  ASSERT_TRUE(c.is_object()) << r.out << r.err;
  EXPECT_EQ(c["status"], "cancelled") << c.dump(2);
  EXPECT_EQ(c["scheduler_state"], "CANCELLED");
  EXPECT_TRUE(processes_with("sleep 300").empty());
}

TEST_F(Slurm, MoreCpusThanTheNodeHasIsPendingWithItsReason) {
  json j = run({"-t", "3", "-r", "cpus=64"}, "true");
  const std::string id = j["job_id"];
  EXPECT_EQ(j["status"], "pending") << j.dump(2);
  EXPECT_EQ(j["scheduler_state"], "PENDING");
  const std::string reason = j["scheduler_reason"];
  EXPECT_FALSE(reason.empty());
  EXPECT_NE(reason, "None") << j.dump(2);
  Result list = env_->run({"instance", "jobs", "alpha"});
  EXPECT_NE(list.out.find("PENDING"), std::string::npos) << list.out;
  Result r = env_->run({"instance", "cancel", "alpha", id, "--json"}, "", std::chrono::seconds(120));
  EXPECT_EQ(nshpc::parse_json_or_discarded(r.out)["status"], "cancelled") << r.out << r.err;
}

TEST_F(Slurm, BadResourcesAreRefusedBeforeSbatch) {
  const std::size_t before = calls(env_->root(), "sbatch");
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"-r", "cpus=65"}, {"-r", "gpus=1"}, {"-r", "memory=-5"}, {"-r", "cpus=two"}, {"-r", "cpus"}}) {
    std::vector<std::string> args{"instance", "run", "alpha", "--slurm"};
    args.insert(args.end(), bad.begin(), bad.end());
    args.insert(args.end(), {"--", "true"});
    Result r = env_->run(args);
    EXPECT_NE(r.exit_code, 0) << bad[1];
    EXPECT_FALSE(r.err.empty()) << bad[1];
  }
  Result over = env_->run({"instance", "run", "alpha", "--slurm", "-r", "cpus=65", "--", "true"});
  EXPECT_NE(over.err.find("maximum of 64"), std::string::npos) << over.err;
  Result unknown = env_->run({"instance", "run", "alpha", "--slurm", "-r", "gpus=1", "--", "true"});
  EXPECT_NE(unknown.err.find("unknown resource 'gpus'"), std::string::npos) << unknown.err;
  EXPECT_EQ(calls(env_->root(), "sbatch"), before) << "sbatch ran for a refused job";
  EXPECT_EQ(records(), 0u);
}

// A Slurm submit through `sbatch_command` (TOML) that cannot succeed: it fails, its error says
// each of `says`, and no job is left on record.
static void expect_submit_refused(const std::string& sbatch_command, const std::vector<std::string>& says) {
  Env env;
  std::ofstream(env.config_file(), std::ios::app) << "[jobs.slurm]\nsbatch_command = " << sbatch_command << "\n";
  env.create("alpha");
  Result r = env.run({"instance", "run", "alpha", "--slurm", "--", "true"});
  EXPECT_NE(r.exit_code, 0);
  for (const auto& s : says) EXPECT_NE(r.err.find(s), std::string::npos) << r.err;
  Result list = env.run({"instance", "jobs", "alpha", "--json"});
  EXPECT_EQ(nshpc::parse_json_or_discarded(list.out).size(), 0u) << list.out;
}

TEST_F(Slurm, SbatchMissingOrFailingIsAClearErrorWithNothingLeft) {
  expect_submit_refused("[\"/nonexistent/sbatch\"]", {"cannot run /nonexistent/sbatch"});
  expect_submit_refused("[\"sbatch\", \"--partition\", \"nosuchpartition\"]",
                        {"submitting failed: sbatch exited with", "nosuchpartition"});
}

TEST_F(Slurm, QueryFailureIsReportedAsSuchNotAsJobNotFound) {
  Env broken;
  std::ofstream(broken.config_file(), std::ios::app)
      << "[jobs.slurm]\npoll_interval = 0.5\nsqueue_command = [\"/bin/false\"]\n"
      << "sbatch_command = [\"sbatch\", \"--partition\", \"cpu\", \"--mem=100M\"]\n";
  broken.create("alpha");
  Result r = broken.run({"instance", "run", "alpha", "--slurm", "-t", "3", "--json", "--", "true"});
  json j = nshpc::parse_json_or_discarded(r.out);
  ASSERT_TRUE(j.is_object()) << r.out << r.err;
  EXPECT_EQ(j["status"], "pending");
  EXPECT_NE(j["scheduler_error"].get<std::string>().find("/bin/false exited with 1"), std::string::npos) << j.dump(2);
  Result text = broken.run({"instance", "status", "alpha", j["job_id"]});
  EXPECT_NE(text.out.find("Asking the scheduler failed"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("not found"), std::string::npos) << text.out;
  // Clean up the real job.
  std::system(("scancel " + j["slurm_job_id"].get<std::string>()).c_str());
}

TEST_F(Slurm, ARestartedWatcherRecoversTheFinalState) {
  // Submitted by one process that returns at once; the job ends while nobody watches.
  json j = run({"-t", "0"}, "sleep 2; echo late; exit 3");
  const std::string id = j["job_id"];
  EXPECT_TRUE(j["status"] == "pending" || j["status"] == "running") << j.dump(2);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  // Another process (as a restarted server would) finds the real ending.
  json s = status(id, {"-t", "60"});
  EXPECT_EQ(s["status"], "failed") << s.dump(2);
  EXPECT_EQ(s["exit_code"], 3);
  EXPECT_EQ(s["stdout_tail"], "late");
  const std::string audit = read_text(env_->instances() / "alpha" / "audit.log");
  std::size_t finals = 0;
  for (std::size_t pos = 0; (pos = audit.find("\"job.failed\"", pos)) != std::string::npos; ++pos) ++finals;
  EXPECT_EQ(finals, 1u) << audit;
}

TEST_F(Slurm, FiftyJobsAtOnceAllReachTheirFinalStateWithOneQueryPerPoll) {
  std::vector<std::string> ids;
  for (int i = 0; i < 50; ++i) {
    json j = run({"-t", "0"}, "echo job " + std::to_string(i) + (i % 10 == 9 ? "; exit 7" : ""));
    ASSERT_TRUE(j.contains("job_id")) << j.dump();
    ids.push_back(j["job_id"]);
  }
  // One process watches all 50: wait for the last one, then check all.
  const std::size_t before = calls(env_->root(), "sacct") + calls(env_->root(), "squeue");
  const auto t0 = std::chrono::steady_clock::now();
  json last = status(ids.back(), {"-t", "170"});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::size_t queries = calls(env_->root(), "sacct") + calls(env_->root(), "squeue") - before;
  Result list = env_->run({"instance", "jobs", "alpha", "--json"}, "", std::chrono::seconds(120));
  json all = nshpc::parse_json_or_discarded(list.out);
  ASSERT_TRUE(all.is_array()) << list.out;
  ASSERT_EQ(all.size(), 50u);
  int completed = 0, failed = 0;
  for (const auto& rec : all) {
    if (rec["status"] == "completed") ++completed;
    if (rec["status"] == "failed" && rec["exit_code"] == 7) ++failed;
  }
  // Some may still be finishing after the last one; wait for each that is not final.
  for (const auto& id : ids) {
    json s = status(id, {"-t", "120"});
    EXPECT_TRUE(s["status"] == "completed" || s["status"] == "failed") << s.dump(2);
  }
  (void)completed;
  (void)failed;
  // The waiting process asked the scheduler about once per poll interval (0.5 s), not per job.
  EXPECT_LE(static_cast<double>(queries), waited / 0.5 + 5) << queries << " queries in " << waited << " s";
}

TEST_F(Slurm, SandboxRunsAsANonRootUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to the cluster's test user";
  // ns-hpc run by an unprivileged user (the HPC case): its own instances, its own sandbox uid.
  const std::string user = "nshpc-slurm";
  char tmpl[] = "/tmp/nshpc-slurm-user-XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  ::chmod(root.c_str(), 0755);
  const std::string cfg = (root / "config.toml").string();
  std::ofstream(cfg) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << (root / "instances").string() << "\"\n"
                     << "[jobs.slurm]\npoll_interval = 0.5\nsbatch_command = [\"sbatch\", \"--partition\", \"cpu\", \"--mem=200M\"]\n";
  std::system(("chown -R " + user + " '" + root.string() + "'").c_str());
  auto as_user = [&](const std::string& args) {
    const std::string cmd = "runuser -u " + user + " -- env HOME='" + root.string() + "' PATH=/usr/bin:/bin '" + binary() +
                            "' --config '" + cfg + "' " + args + " 2>&1";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  };
  as_user("instance create beta");
  const std::string out = as_user("instance run beta --slurm -t 120 --json -- 'id -u; echo user-ok'");
  json j = nshpc::parse_json_or_discarded(out);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["status"], "completed") << out;
  const std::string uid = std::to_string(::getpwnam(user.c_str())->pw_uid);
  EXPECT_NE(j["stdout_tail"].get<std::string>().find(uid), std::string::npos) << out;
  EXPECT_NE(j["stdout_tail"].get<std::string>().find("user-ok"), std::string::npos) << out;
  std::system(("rm -rf '" + root.string() + "'").c_str());
}
