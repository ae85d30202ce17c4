// Runs the real ns-hpc binary in a private instances folder and config, as a user would.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace nshpc::test {

namespace fs = std::filesystem;

struct Result {
  int exit_code = -1;  // 128+N when killed by signal N
  std::string out;
  std::string err;
};

std::string binary();  // NSHPC_BINARY from the environment, else the build's path
std::string probe();   // NSHPC_PROBE likewise

class Env {
 public:
  explicit Env(const std::string& extra_toml = "");
  ~Env();
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  const fs::path& root() const { return root_; }
  fs::path instances() const { return root_ / "instances"; }
  fs::path config_file() const { return root_ / "config.toml"; }

  // ns-hpc --config <file> args... ; stdin from `input`; environment = a small fixed set plus
  // NSHPC_TEST_SECRET (which no sandbox may see) plus `extra_env`.
  Result run(const std::vector<std::string>& args, const std::string& input = "",
             std::chrono::seconds timeout = std::chrono::seconds(60),
             const std::vector<std::string>& extra_env = {}) const;
  // Starts ns-hpc in the background; returns its pid (reap with wait_child).
  pid_t start(const std::vector<std::string>& args) const;

  void create(const std::string& id, const std::vector<std::string>& flags = {}) const;
  // Copies the probe into the instance's workspace (as /workspace/probe).
  void install_probe(const std::string& id) const;

  std::vector<std::string> argv_for(const std::vector<std::string>& args) const;
  std::vector<std::string> env_for(const std::vector<std::string>& extra) const;

 private:
  fs::path root_;
};

inline constexpr const char* kSecret = "nshpc-secret-7f3a9c1e";

int wait_child(pid_t pid, std::chrono::seconds timeout);
// Host pids whose command line contains `marker`.
std::vector<pid_t> processes_with(const std::string& marker);
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit);
std::string read_text(const fs::path& file);

}  // namespace nshpc::test
