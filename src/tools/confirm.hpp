// Confirmations for what cannot be undone ([mcp] confirm_destructive), in both MCP eras: the
// legacy elicitation/create request, the 2026-07-28 input_required round (MRTR) with a
// requestState this server signs, or, for a client that can be asked neither way, an explicit
// `confirm: true` argument the caller passes after asking the user itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "mcp/server.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

// The elicitation/create params asking the user to confirm `what` (form mode: message `what`, a
// requestedSchema with one required boolean `confirm`). The same params go into a 2026-07-28
// inputRequests entry, a legacy elicitation/create request and a task's input_requests.
mcp::json confirmation_request(const std::string& what);

// Whether an elicitation result says yes: action "accept" and content.confirm == true.
bool accepts(const mcp::json& response);

// How an action came to be confirmed (for the audit line).
enum class ConfirmedBy { not_asked, argument, elicitation, input_required };
std::string_view to_string(ConfirmedBy how);

// Returns when the action `what` of `tool` called with `args` may go ahead:
//  - [mcp] confirm_destructive off: at once (not_asked);
//  - args.confirm == true: the caller takes responsibility (argument);
//  - a legacy session whose client declared elicitation: asks it with elicitation/create;
//  - a 2026-07-28 request whose clientCapabilities declare elicitation: the first round throws
//    mcp::InputRequired (key "confirm", a signed requestState), the retry's state is verified
//    and its inputResponses.confirm read (input_required);
//  - neither: UsageError "... cannot be undone; ask the user, then call again with confirm: true".
// A declined or cancelled answer is UsageError "not done: the user declined ..."; a retry whose
// requestState is forged, altered, expired, for other arguments or already used is UsageError
// "refused: the confirmation's state was altered or already used ...". The tool's handler lets
// the UsageError become its isError result.
ConfirmedBy confirm(const ToolContext& ctx, mcp::RequestContext& rc, std::string_view tool, const mcp::json& args,
                    const std::string& what);

// `input_schema` with the `confirm` boolean added (the destructive tools').
mcp::json with_confirm(mcp::json input_schema);

// ---------------------------------------------------------------------------------------------
// The requestState codec (exposed for its tests). A state is base64url(payload) "." base64url(MAC),
// the MAC HMAC-SHA256 under a 32-byte key, the payload binding the tool, a hash of the arguments
// (canonical JSON without `confirm`), the expiry and a random nonce. A used nonce is remembered
// until its state expires (per process: a restart forgets them, but a state outlives a restart by
// at most its 5 minutes, and the key file persists, so a state minted before a restart can be
// replayed once after it within that window).
class ConfirmStates {
 public:
  using Clock = std::chrono::system_clock;
  static constexpr std::chrono::seconds kLifetime{300};
  static constexpr std::size_t kMaxRemembered = 4096;  // used nonces kept at most

  explicit ConfirmStates(std::string key);  // 32 bytes
  // The key in `file` (0600, its folder made 0711), made of 32 random bytes on first use. Throws
  // SysError, or Error when the file is readable by others or not a key.
  static std::string load_key(const std::filesystem::path& file);

  std::string mint(std::string_view tool, const mcp::json& args, Clock::time_point now = Clock::now()) const;
  // Whether `state` is one this key minted for this tool and arguments, not expired and not used
  // before; marks it used. Returns "" when good, else why not (for the error message).
  std::string redeem(const std::string& state, std::string_view tool, const mcp::json& args,
                     Clock::time_point now = Clock::now());

 private:
  std::string key_;
  std::mutex mu_;
  std::unordered_map<std::string, std::int64_t> used_;  // nonce -> expiry (unix seconds)
};

// The server's codec (Services::confirmations), its key in <[server] state_dir>/confirm-key,
// loaded on first use.
ConfirmStates& confirm_states(const Services& services);

}  // namespace nshpc::tools
