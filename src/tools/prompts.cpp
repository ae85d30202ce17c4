// Prompts: reusable starting points an agent's user can pick.
#include <fmt/format.h>

#include "tools/internal.hpp"

namespace nshpc::tools {

void add_prompts(mcp::Server& server, const ToolContext&) {
  mcp::Prompt prompt;
  prompt.name = "work_in_sandbox";
  prompt.title = "Work on a task in an ns-hpc sandbox";
  prompt.description = "Sets up an agent to carry out a task inside a persistent ns-hpc instance.";
  prompt.arguments = {{"goal", "What should be done", true},
                      {"instance_id", "An existing instance to use (default: pick or create one)", false}};
  prompt.handler = [](const mcp::json& args) {
    const std::string goal = args.value("goal", "");
    const std::string instance = args.value("instance_id", "");
    std::string text = fmt::format(
        "Goal: {}\n\nUse the ns-hpc tools. {}Keep files you need later in the instance's workspace "
        "(/workspace) and final results in /output; /tmp is wiped after every command. Read "
        "resource://ns-hpc/context/ns-hpc.md first if you have not used ns-hpc before.",
        goal,
        instance.empty() ? "Call list_instances and reuse a fitting instance, or create_instance with a "
                           "short description of the goal. "
                         : fmt::format("Work in instance '{}' (describe_instance shows its details). ", instance));
    return mcp::json{{"description", "Work on: " + goal},
                     {"messages", {{{"role", "user"}, {"content", {{"type", "text"}, {"text", text}}}}}}};
  };
  server.add_prompt(std::move(prompt));
}

}  // namespace nshpc::tools
