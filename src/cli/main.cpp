#include <string_view>

#include "base/copy_tree.hpp"
#include "cli/app.hpp"
#include "desktop/agent.hpp"
#include "desktop/wire.hpp"
#include "files/broker.hpp"
#include "files/image.hpp"
#include "network/forward.hpp"
#include "network/netns.hpp"
#include "network/proxy.hpp"
#include "sandbox/keeper.hpp"

int main(int argc, char** argv) {
  // A job keeper (sandbox/keeper.hpp) needs nothing of the CLI: dispatched before any of it.
  if (argc > 1 && std::string_view(argv[1]) == nshpc::sandbox::kKeeperCommand)
    return nshpc::sandbox::keeper_main(argc, argv);
  // So does a pasta watcher (network/netns.hpp).
  if (argc > 1 && std::string_view(argv[1]) == nshpc::network::kWatchCommand)
    return nshpc::network::watch_main(argc, argv);
  // And the forwarder of an exposed port (network/forward.hpp).
  if (argc > 1 && std::string_view(argv[1]) == nshpc::network::kForwardCommand)
    return nshpc::network::forward_main(argc, argv);
  // And the holder of an instance's network namespace (network/netns.hpp).
  if (argc > 1 && std::string_view(argv[1]) == nshpc::network::kHoldCommand)
    return nshpc::network::hold_main(argc, argv);
  // So does a file broker (files/broker.hpp).
  if (argc > 1 && std::string_view(argv[1]) == nshpc::files::kBrokerCommand)
    return nshpc::files::broker_main(argc, argv);
  // And the copy of an instance's tree (base/copy_tree.hpp).
  if (argc > 1 && std::string_view(argv[1]) == nshpc::fs::kCopyTreeCommand)
    return nshpc::fs::copy_tree_main(argc, argv);
  // And the network proxy of a `filtered` instance (network/proxy.hpp).
  if (argc > 1 && std::string_view(argv[1]) == nshpc::network::kProxyCommand)
    return nshpc::network::proxy_main(argc, argv);
  // And the decoder of an image preview (files/image.hpp).
  if (argc > 1 && std::string_view(argv[1]) == nshpc::files::kImagePreviewCommand)
    return nshpc::files::image_preview_main(argc, argv);
  // And the display agent of a desktop (desktop/agent.hpp).
  if (argc > 1 && std::string_view(argv[1]) == nshpc::desktop::kAgentCommand)
    return nshpc::desktop::agent_main(argc, argv);
  return nshpc::cli::main(argc, argv);
}
