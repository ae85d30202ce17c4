// The request metadata headers of MCP 2026-07-28 over streamable HTTP (SEP-2243): the body's
// version, method and name mirrored into MCP-Protocol-Version, Mcp-Method and Mcp-Name so that
// intermediaries can route without parsing the body. A server that reads the body must refuse a
// request whose headers disagree with it (HeaderMismatch, -32020, HTTP 400): a gateway that
// routed or authorised by a header must not have seen a different request than the one served.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "mcp/protocol.hpp"

namespace nshpc::transport {

// The value of a request header by its lower-case name; nullopt when the request has none.
// (Repeated fields come joined with ", ", as HTTP reads them: they then never match.)
using HeaderLookup = std::function<std::optional<std::string>(std::string_view lower_name)>;

// Decodes a header value that may use the Base64 sentinel form `=?base64?<standard base64>?=`
// (markers case-sensitive). A plain value is returned as is. nullopt: the value has characters a
// header value may not carry (outside visible ASCII, space and tab), or the sentinel's payload is
// not valid base64.
std::optional<std::string> decode_header_value(std::string_view value);

// Checks a modern request's headers against its body, in the spec's order: MCP-Protocol-Version
// (equal to the envelope's version), Mcp-Method (equal to `method`), then Mcp-Name for the
// methods that name something (params.name for tools/call and prompts/get, params.uri for
// resources/read, params.taskId for tasks/get, tasks/update and tasks/cancel), sentinel-decoded.
// Returns ProtocolError(kHeaderMismatch) naming the header and both values, or nullopt. A
// notification (no "id") and a legacy message are not checked.
std::optional<mcp::ProtocolError> check_request_headers(const HeaderLookup& header, const mcp::json& message,
                                                        const mcp::Envelope& envelope);

}  // namespace nshpc::transport
