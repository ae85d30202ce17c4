#include "cli/computer_config.hpp"

#include <algorithm>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "instances/computers.hpp"

namespace nshpc::cli {

std::optional<bool> parse_flag(std::string_view text) {
  std::string value(text::trim(text, instances::kPythonSpace));
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (value == "true" || value == "1" || value == "yes" || value == "on") return true;
  if (value == "false" || value == "0" || value == "no" || value == "off") return false;
  return std::nullopt;
}

bool env_flag(std::string_view name, const char* value, bool fallback) {
  if (value == nullptr) return fallback;
  if (const auto flag = parse_flag(value)) return *flag;
  throw UsageError(fmt::format("{} must be true or false (also 1/0, yes/no, on/off), not \"{}\".", name, value));
}

std::optional<std::string> startup_problem(const ComputerConfig& c) {
  if (c.transport == "stdio") {
    if (c.host != "127.0.0.1")
      return "--host is only valid with --transport http. In stdio mode, there is no HTTP server to bind.";
    if (c.port != 8435)
      return "--port is only valid with --transport http. In stdio mode, there is no HTTP server to bind.";
    if (c.session_timeout != 300)
      return "--session-timeout is only valid with --transport http. In stdio mode, the session lives as long as "
             "the process.";
  }
  if (c.tool_instruction_override && c.extended_tool_instruction)
    return "Cannot use both --tool-instruction-override and --extended-tool-instruction. Use override to replace the "
           "description entirely, or extended to append to the backend default.";
  if (c.timeout < 1) return "--timeout must be at least 1 second.";
  if (c.output_limit < 1) return "--output-limit must be at least 1 byte.";
  if (c.computer_id.empty()) return "COMPUTER_ID is required (example: COMPUTER_ID=agent-workstation).";
  if (!instances::is_computer_id(text::trim(c.computer_id, instances::kPythonSpace))) {
    std::string message(instances::kComputerIdRule);
    message.replace(0, std::string_view("computer_id").size(), "COMPUTER_ID");
    return message;
  }
  if (c.transport == "http" && c.host != "127.0.0.1" && c.host != "localhost" && c.host != "::1" &&
      (!c.auth_token || c.auth_token->empty()) && !c.allow_unauthenticated_http)
    return "A non-loopback HTTP listener can execute arbitrary sandbox commands. Set KILNTAINERS_AUTH_TOKEN/"
           "--auth-token, or explicitly pass --allow-unauthenticated-http behind a trusted private network.";
  return std::nullopt;
}

namespace {

// Docker's --memory: a whole number with an optional b, k, m or g (any case); at least 6 MiB, as
// Docker requires. In MiB, rounded up.
std::optional<std::int64_t> docker_memory_mib(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 15 || text.size() - digits > 1) return std::nullopt;
  std::int64_t n = std::stoll(std::string(text.substr(0, digits)));
  const char unit = digits < text.size() ? static_cast<char>(std::tolower(static_cast<unsigned char>(text[digits]))) : 'b';
  std::int64_t scale = 0;
  switch (unit) {
    case 'b': scale = 1; break;
    case 'k': scale = 1024; break;
    case 'm': scale = 1024 * 1024; break;
    case 'g': scale = 1024LL * 1024 * 1024; break;
    default: return std::nullopt;
  }
  if (n > (std::int64_t{1} << 50) / scale) return std::nullopt;
  const std::int64_t bytes = n * scale;
  if (bytes < 6 * 1024 * 1024) return std::nullopt;
  return (bytes + 1024 * 1024 - 1) / (1024 * 1024);
}

}  // namespace

ComputerStart parse_computer_args(const std::vector<std::string>& args,
                                  const std::function<const char*(const char*)>& env) {
  ComputerStart start;
  ComputerConfig& c = start.config;
  CLI::App app{"MCP server providing one persistent local computer for LLM agents (ns-hpc: bubblewrap, no Docker). "
               "The computer is named by COMPUTER_ID (required); DESKTOP_ENVIRONMENT and NETWORK_ACCESS take "
               "true/false.",
               std::string(kComputerProgram)};
  app.set_help_flag();
  bool help = false;
  app.add_flag("-h,--help", help, "show this help message and exit");
  app.add_option("--transport", c.transport, "MCP transport (default: stdio)")->check(CLI::IsMember({"stdio", "http"}));
  app.add_option("--host", c.host, "HTTP bind address (default: 127.0.0.1, HTTP mode only)");
  app.add_option("--port", c.port, "HTTP listen port (default: 8435, HTTP mode only)");
  app.add_option("--timeout", c.timeout, "Default exec timeout in seconds (default: 120)");
  app.add_option("--output-limit", c.output_limit,
                 "Max combined stdout+stderr bytes per exec (default: 2097152 = 2 MiB)");
  app.add_option("--session-timeout", c.session_timeout, "Idle session timeout in seconds (default: 300, HTTP mode only)");
  std::string token;
  auto* token_option = app.add_option("--auth-token", token, "Static bearer token for HTTP (default: KILNTAINERS_AUTH_TOKEN)");
  app.add_flag("--allow-unauthenticated-http", c.allow_unauthenticated_http,
               "Allow a non-loopback HTTP listener without authentication. Only use behind a trusted private network "
               "or auth proxy.");
  app.add_option("--shell", c.shell, "Shell binary for command mode (default: /bin/bash)");
  bool network = true;
  app.add_flag("--network,!--no-network", network,
               "Network access for the computer (default: enabled; NETWORK_ACCESS takes precedence)");
  bool whole_output = false;
  app.add_flag("--whole-output", whole_output,
               "Return a command's whole stdout and stderr (up to --output-limit) and read_file's whole file (up to "
               "1 MiB) as the seed does, instead of results under 64 KB: a command's head and tail with the whole in "
               "a file of the computer, a long file in pages (WHOLE_OUTPUT takes precedence)");
  std::string override_text, extended_text;
  auto* override_option =
      app.add_option("--tool-instruction-override", override_text, "Replace the entire terminal_execute tool description");
  auto* extended_option =
      app.add_option("--extended-tool-instruction", extended_text, "Append to the default tool description");
  double cpus = 0;
  auto* cpu_option = app.add_option("--cpu", cpus, "CPUs for the computer (Docker's --cpus; a cgroup limit here)")
                         ->check(CLI::PositiveNumber);
  std::string memory;
  auto* memory_option = app.add_option("--memory", memory, "Memory for the computer (Docker's form: 512m, 2g)");
  // The Docker flags that mean nothing without Docker: taken, so the message can say what to use.
  std::string engine, docker_host, image;
  std::vector<std::string> run_flags;
  auto* engine_option = app.add_option("--engine", engine, "(Docker only; refused: ns-hpc runs bubblewrap)");
  auto* docker_host_option = app.add_option("--docker-host", docker_host, "(Docker only; refused)");
  auto* image_option = app.add_option("--image", image, "(refused: ns-hpc images come from `ns-hpc image`)");
  auto* run_flag_option = app.add_option("--docker-run-flag", run_flags, "(Docker only; refused)");

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw ComputerArgumentError(e.what());
  }
  if (help) {
    start.help = app.help();
    return start;
  }
  if (*engine_option || *docker_host_option || *run_flag_option)
    throw ComputerArgumentError(fmt::format(
        "{} is a Docker option; ns-hpc runs the computer in a bubblewrap sandbox without Docker. Drop it (limits: "
        "--cpu and --memory; isolation is always on)",
        *engine_option ? "--engine" : *docker_host_option ? "--docker-host" : "--docker-run-flag"));
  if (*image_option)
    throw ComputerArgumentError(
        "--image names a Docker image; ns-hpc's computers use its own Debian image ([namespace] default_image, "
        "built by `ns-hpc image build`). Drop --image");
  if (*cpu_option) c.cpus = cpus;
  if (*memory_option) {
    c.memory_mib = docker_memory_mib(memory);
    if (!c.memory_mib)
      throw ComputerArgumentError(fmt::format(
          "--memory \"{}\" is not a size such as 512m or 2g (a whole number with b, k, m or g; at least 6m)", memory));
  }
  if (*override_option) c.tool_instruction_override = override_text;
  if (*extended_option) c.extended_tool_instruction = extended_text;
  if (*token_option) {
    c.auth_token = token;
  } else if (const char* from_env = env("KILNTAINERS_AUTH_TOKEN")) {
    c.auth_token = std::string(from_env);
  }
  const char* id = env("COMPUTER_ID");
  c.computer_id = id ? id : "";  // as given: startup_problem and validate_computer_id trim it
  c.desktop_environment = env_flag("DESKTOP_ENVIRONMENT", env("DESKTOP_ENVIRONMENT"), false);
  c.network_access = env_flag("NETWORK_ACCESS", env("NETWORK_ACCESS"), network);
  c.whole_output = env_flag("WHOLE_OUTPUT", env("WHOLE_OUTPUT"), whole_output);
  return start;
}

}  // namespace nshpc::cli
