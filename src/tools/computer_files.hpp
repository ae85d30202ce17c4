// The file tools of the mcp-virtual-computer entry point (read_file, write_file, edit_file;
// tools/computer_files.cpp), registered by register_computer (tools/computer_tools.cpp) with what
// they share with the computer's other tools.
#pragma once

#include <functional>

#include "store/store.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools::computer {

// A working tool's body, before the computer's error wording.
using FileToolBody = std::function<mcp::ToolResult(const mcp::json& args, mcp::RequestContext& rc)>;

struct FileToolHooks {
  ToolContext ctx;
  // The computer a call works in: computer_id when given, else the server's own (made on first use).
  std::function<store::Instance(const mcp::json& args, mcp::RequestContext& rc)> computer_for;
  // The handler of a working tool: its errors become the seed's JSON error object.
  std::function<ToolHandler(const char* operation, FileToolBody body)> working;
  // The fields every file result carries (operation, computer_id, desktop_environment, ...).
  std::function<mcp::json(const store::Instance& inst, const char* operation)> common;
  // The JSON object as the text and as structuredContent.
  std::function<mcp::ToolResult(mcp::json object)> result;
  mcp::json computer_arg;  // the computer_id argument's schema
  // --whole-output: read_file returns a whole file (up to the seed's 1 MiB), not a page that
  // keeps the result under 64 KB.
  bool whole_output = false;
};

void add_file_tools(mcp::Server& server, FileToolHooks hooks);

}  // namespace nshpc::tools::computer
