// The live views' WebSockets: an instance's desktop (its x11vnc, relayed) and a terminal in it.
//   /desktop/<id>/vnc  binary frames: RFB, the browser's half filtered (desktop/rfb.hpp), view-only
//                      until the page sends the text frame {"control": true} (audited as
//                      desktop.control; input then audited in batches as desktop.input: how many
//                      keys, pointer events and clipboard sends, never what was typed).
//   /terminal/<id>     binary frames: the terminal's bytes both ways; text frames from the page:
//                      {"resize": [rows, cols]}; the last text frame to it: {"exit": code}. Opened as
//                      `instance enter` opens one (instances/terminal.hpp), with ?rows=&cols=.
// Both are browser routes: the token, or the dashboard's cookie with this server's own Origin.
#pragma once

#include <vector>

#include "instances/instances.hpp"
#include "transport/http.hpp"

namespace nshpc::dashboard {

std::vector<transport::WebSocketRoute> relay_routes(instances::Service& service);

}  // namespace nshpc::dashboard
