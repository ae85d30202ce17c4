// Runs the real ns-hpc binary in a private instances folder and config, as a user would.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/json.hpp"

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

// `ns-hpc run` on stdio, spoken to line by line as an MCP client (initialized on construction).
class McpSession {
 public:
  // `extra_env`: NAME=value for the server, replacing the harness's of that name (PATH).
  // `command`: the entry point and its arguments (`computer`: the mcp-virtual-computer one).
  // `initialize`: open a 2025-era session first; false for a 2026-07-28 client, whose requests
  // carry their own _meta.
  explicit McpSession(const Env& env, const std::vector<std::string>& extra_env = {},
                      const std::vector<std::string>& command = {"run"}, bool initialize = true);
  ~McpSession();  // closes stdin and waits for the server to stop
  McpSession(const McpSession&) = delete;
  McpSession& operator=(const McpSession&) = delete;

  pid_t pid() const { return pid_; }
  void crash();  // SIGKILL, as a crash would: nothing of the server runs afterwards

  void send(const nlohmann::json& message);
  int request(const std::string& method, const nlohmann::json& params);  // returns the id
  int call(const std::string& tool, const nlohmann::json& args) {
    return request("tools/call", {{"name", tool}, {"arguments", args}});
  }
  // The response to `id` (messages for other ids are kept for later waits); null on timeout.
  nlohmann::json wait_for(int id, std::chrono::seconds timeout = std::chrono::seconds(60));
  nlohmann::json call_and_wait(const std::string& tool, const nlohmann::json& args,
                               std::chrono::seconds timeout = std::chrono::seconds(60)) {
    return wait_for(call(tool, args), timeout);
  }
  // A tool's structuredContent; a tool error or no answer fails the test.
  nlohmann::json tool(const std::string& name, const nlohmann::json& args);
  // Whether a notification `method` came (waiting up to `timeout` for it); taken off the queue.
  bool notified(const std::string& method, std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  int next_id_ = 0;
  std::string buffer_;
  std::vector<nlohmann::json> pending_;
};

// All the text content of a tools/call response.
std::string result_text(const nlohmann::json& response);

int wait_child(pid_t pid, std::chrono::seconds timeout);
// Host pids whose command line contains `marker`.
std::vector<pid_t> processes_with(const std::string& marker);
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit);
std::string read_text(const fs::path& file);

// make test's image cache (scripts/test-image.sh): image 'test' and the local apt repository,
// root's in /var/cache/ns-hpc-test, a normal user's in ~/.cache/ns-hpc-test.
fs::path test_image_cache();

}  // namespace nshpc::test
