// The desktop's tools, for both entry points (`ns-hpc run` names instances with instance_id, the
// computer with computer_id): set_desktop_environment; `computer` with Anthropic's computer-use
// actions (computer_20251124, the 17 members of computer_toolset_20260801) and an ordered
// `actions` batch; mcp-virtual-computer's screen tools (look_at_screen, click, type, scroll and
// the window tools); clipboard and open. The screen tools are listed only while a desktop is on.
#pragma once

#include <functional>
#include <string>

#include "instances/desktops.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

struct DesktopFace {
  ToolContext ctx;
  mcp::Server* server = nullptr;  // for list_changed
  std::string id_name;            // "computer_id" or "instance_id"
  mcp::json id_schema;            // that argument's schema in every tool
  // The instance a call works on.
  std::function<store::Instance(const mcp::json& args, mcp::RequestContext& rc)> instance_for;
  // A handler that words errors as the face does (the computer's JSON errors, ns-hpc run's text).
  std::function<ToolHandler(const char* operation,
                            std::function<mcp::ToolResult(const mcp::json&, mcp::RequestContext&)> body)>
      working;
  // The fields every result of the face carries (the computer's operation, computer_id,
  // desktop_environment, ...; ns-hpc run's instance_id).
  std::function<mcp::json(const store::Instance& inst, const char* operation)> common;
  // set_desktop_environment in tools/list (the computer's: with its lifecycle tools); it is
  // answered either way.
  bool switch_listed = true;
  // set_desktop_environment's words when the root has no desktop.
  std::function<std::string(const instances::DesktopUnavailable& why)> unavailable_text;
};

void add_desktop_tools(mcp::Server& server, DesktopFace face);

// mcp-virtual-computer's resources computer://screen/current.png and
// computer://screen/accessibility.json, of the instance `instance` names while its desktop is on.
std::shared_ptr<mcp::ResourceProvider> screen_resources(ToolContext ctx,
                                                        std::function<std::optional<store::Instance>()> instance);

// The screenshot size a model gets for a screen of w×h (Anthropic's bounds: at most 1568 pixels on
// the long side and 1568 tiles of 28×28), and the factor screen pixels are multiplied by.
struct ShotSize {
  int width = 0, height = 0;
  double scale = 1.0;
};
ShotSize shot_size(int width, int height);

}  // namespace nshpc::tools
