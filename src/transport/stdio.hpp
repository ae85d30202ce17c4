// The stdio transport: newline-delimited JSON on stdin/stdout; stdout carries only MCP messages.
#pragma once

#include <cstddef>

#include "mcp/server.hpp"

namespace nshpc::transport {

struct StdioOptions {
  std::size_t max_message_bytes = 8 * 1024 * 1024;
  // Tool calls run on worker threads, never on the I/O thread; threads are added on demand up
  // to one per request the session accepts (mcp::ServerOptions::max_in_flight), so a long wait
  // never queues another call.
  std::size_t worker_threads = 128;
  int in_fd = 0;
  int out_fd = 1;
};

// Serves one MCP session until end of input (requests still running are answered first) or
// SIGTERM/SIGINT/SIGHUP (requests still running are cancelled). Pending output is flushed and 0
// is returned.
int serve_stdio(mcp::Server& server, const StdioOptions& options = {});

}  // namespace nshpc::transport
