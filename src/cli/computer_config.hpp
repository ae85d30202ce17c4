// The mcp-virtual-computer entry point's settings (`ns-hpc computer`, or the binary invoked as
// `mcp-virtual-computer`): the seed's flags and environment, read and checked as the seed does,
// with its messages word for word (reference/virtual-computer.md §2.2, §6).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>
#include <optional>
#include <string>
#include <string_view>

namespace nshpc::cli {

// What the seed prefixes every start-up error with (exit 1; usage errors exit 2).
inline constexpr std::string_view kComputerProgram = "mcp-virtual-computer";

struct ComputerConfig {
  std::string transport = "stdio";  // stdio | http
  std::string host = "127.0.0.1";
  std::int64_t port = 8435;
  std::int64_t timeout = 120;            // seconds, a command's default
  std::int64_t output_limit = 2097152;   // stdout + stderr bytes of one command
  std::int64_t session_timeout = 300;    // seconds an HTTP session may idle
  std::string computer_id;               // COMPUTER_ID as given (validate_computer_id trims it)
  bool desktop_environment = false;      // DESKTOP_ENVIRONMENT
  bool network_access = true;            // NETWORK_ACCESS, else --network/--no-network
  // WHOLE_OUTPUT, else --whole-output (not the seed's): a command's whole stdout and stderr in its
  // result, as the seed returns them, instead of head and tail with the whole in a file.
  bool whole_output = false;
  std::optional<std::string> tool_instruction_override;
  std::optional<std::string> extended_tool_instruction;
  std::optional<std::string> auth_token;  // --auth-token, else KILNTAINERS_AUTH_TOKEN
  bool allow_unauthenticated_http = false;
  std::string shell = "/bin/bash";
  // The seed's Docker resource flags, mapped onto the instance's limits.
  std::optional<double> cpus;                  // --cpu
  std::optional<std::int64_t> memory_mib;      // --memory (Docker's 512m, 2g, …)
};

// A command line the entry point cannot take: argparse's usage errors, exit 2.
class ComputerArgumentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the command line and environment ask for. `help` is set (and nothing else read) for -h/--help.
struct ComputerStart {
  ComputerConfig config;
  std::optional<std::string> help;
};

// Reads the seed's flags (args without the program name) and its environment through `env`
// (COMPUTER_ID, DESKTOP_ENVIRONMENT, NETWORK_ACCESS over --network, WHOLE_OUTPUT over
// --whole-output, KILNTAINERS_AUTH_TOKEN under --auth-token). Throws ComputerArgumentError for a flag it does not know, a bad value, or a
// Docker flag that has no meaning here (saying what to use instead), and UsageError for an
// environment variable that is not a boolean. startup_problem() is the next check.
ComputerStart parse_computer_args(const std::vector<std::string>& args,
                                  const std::function<const char*(const char*)>& env);

// The seed's env_flag: true/false, 1/0, yes/no, on/off, trimmed, any case; nullopt otherwise.
std::optional<bool> parse_flag(std::string_view text);

// A boolean environment variable: `fallback` when unset, else parse_flag's answer. Throws
// UsageError naming the variable and the values it takes (the seed ended in a traceback).
bool env_flag(std::string_view name, const char* value, bool fallback);


// The seed's validate_config: the first rule `config` breaks, as its message, or nullopt.
std::optional<std::string> startup_problem(const ComputerConfig& config);


}  // namespace nshpc::cli
