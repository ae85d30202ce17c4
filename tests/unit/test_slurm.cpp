// The Slurm client against fake scheduler commands (shell scripts): the sbatch argv, parsing
// squeue and sacct, the fallback to accounting for forgotten jobs, and failures said as such.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "jobs/slurm.hpp"
#include "common/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using nshpc::jobs::SchedulerError;
using nshpc::jobs::State;
using nshpc::jobs::SlurmClient;

class SlurmClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.sbatch_command = {"sbatch", "--partition", "cpu", "--cpus-per-task={cpus}", "--mem={memory}M"};
  }
  std::string script(const std::string& name, const std::string& body) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
    ::chmod(p.c_str(), 0755);
    return p.string();
  }
  nshpc::tests::TempDir tmp_{"nshpc-slurm-unit"};
  const fs::path dir_ = tmp_.path();
  nshpc::config::JobsSlurm cfg_ = nshpc::config::built_in().jobs.slurm;
};

}  // namespace

TEST_F(SlurmClientTest, SbatchArgvFillsResourcesAndAddsItsOwnOptions) {
  SlurmClient client(cfg_);
  auto argv = client.sbatch_argv({{"cpus", 4}, {"memory", 2048}}, "ns-hpc-abc", "/w/o.out", "/w/o.err", "/inst");
  EXPECT_EQ(argv[3], "--cpus-per-task=4");
  EXPECT_EQ(argv[4], "--mem=2048M");
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--parsable"), argv.end());
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--job-name=ns-hpc-abc"), argv.end());
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--output=/w/o.out"), argv.end());
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--error=/w/o.err"), argv.end());
  cfg_.sbatch_command.push_back("--gres=gpu:{gpus}");
  SlurmClient with_gpus(cfg_);
  try {
    with_gpus.sbatch_argv({{"cpus", 1}, {"memory", 1}}, "n", "o", "e", "d");
    FAIL() << "a placeholder naming no resource was accepted";
  } catch (const nshpc::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("{gpus}"), std::string::npos) << e.what();
  }
}

TEST_F(SlurmClientTest, SubmitReturnsTheIdAndSaysWhySbatchFailed) {
  SlurmClient client(cfg_);
  EXPECT_EQ(client.submit({script("ok", "cat >/dev/null; echo '4242;cluster'")}, "#!/bin/sh\ntrue\n"), "4242");
  try {
    client.submit({script("bad", "echo 'sbatch: error: invalid partition specified: gpu' >&2; exit 1")}, "x");
    FAIL();
  } catch (const SchedulerError& e) {
    EXPECT_NE(std::string(e.what()).find("invalid partition specified: gpu"), std::string::npos) << e.what();
  }
  try {
    client.submit({(dir_ / "missing-sbatch").string()}, "x");
    FAIL();
  } catch (const SchedulerError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run"), std::string::npos) << e.what();
    EXPECT_EQ(e.cause(), SchedulerError::Cause::not_started);
    EXPECT_EQ(e.code(), ENOENT);
  }
  EXPECT_THROW(client.submit({script("noid", "echo Submitted batch job")}, "x"), SchedulerError);
}

TEST_F(SlurmClientTest, OneSqueueCallGivesStatesReasonsAndExitStatuses) {
  cfg_.squeue_command = {script("squeue", "echo x >> '" + (dir_ / "calls").string() + "'\n"
                                          "printf '1|PENDING|Resources|0|\\n2|RUNNING|None|0|\\n3|FAILED|NonZeroExitCode|768|\\n"
                                          "4|CANCELLED|None|15|\\n5|OUT_OF_MEMORY|OutOfMemory|125|\\n'")};
  SlurmClient client(cfg_);
  auto st = client.query({"1", "2", "3", "4", "5"});
  ASSERT_EQ(st.size(), 5u);
  EXPECT_EQ(st["1"].scheduler_state, "PENDING");
  EXPECT_EQ(st["1"].state, State::pending);
  EXPECT_EQ(st["1"].reason, "Resources");
  EXPECT_EQ(st["2"].scheduler_state, "RUNNING");
  EXPECT_EQ(st["2"].state, State::running);
  EXPECT_EQ(st["3"].state, State::failed);
  EXPECT_EQ(st["3"].exit_code, 3);
  EXPECT_EQ(st["3"].signal, 0);
  EXPECT_EQ(st["4"].signal, 15);
  EXPECT_EQ(st["5"].state, State::out_of_memory);
  EXPECT_EQ(client.invocations(), 1u);
}

TEST_F(SlurmClientTest, ForgottenJobsComeFromAccountingOrNowhere) {
  cfg_.squeue_command = {script("squeue", "printf '1|RUNNING|None|0|\\n'")};
  cfg_.sacct_command = {script("sacct", "printf '2|COMPLETED|0:0|None\\n3|CANCELLED by 0|0:15|None\\n'")};
  SlurmClient client(cfg_);
  auto st = client.query({"1", "2", "3"});
  EXPECT_EQ(st["2"].scheduler_state, "COMPLETED");
  EXPECT_EQ(st["2"].state, State::completed);
  EXPECT_EQ(st["3"].scheduler_state, "CANCELLED");
  EXPECT_EQ(st["3"].state, State::cancelled);
  EXPECT_EQ(st["3"].signal, 15);
  EXPECT_EQ(client.source(), nshpc::config::StatusSource::sacct);
  // Nothing forgotten: squeue alone.
  const auto before = client.invocations();
  client.query({"1"});
  EXPECT_EQ(client.invocations(), before + 1);

  // A cluster without accounting: decided once, the forgotten job is simply absent.
  cfg_.sacct_command = {script("sacct-off", "echo 'Slurm accounting storage is disabled' >&2; exit 1")};
  SlurmClient plain(cfg_);
  auto st2 = plain.query({"1", "2"});
  EXPECT_EQ(st2.count("2"), 0u);
  EXPECT_EQ(plain.source(), nshpc::config::StatusSource::squeue);
}

TEST_F(SlurmClientTest, AFailingQueryIsASchedulerError) {
  cfg_.squeue_command = {script("squeue", "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1")};
  SlurmClient client(cfg_);
  try {
    client.query({"1"});
    FAIL();
  } catch (const SchedulerError& e) {
    EXPECT_NE(std::string(e.what()).find("Unable to contact slurm controller"), std::string::npos) << e.what();
    EXPECT_EQ(e.cause(), SchedulerError::Cause::failed);
  }
}
