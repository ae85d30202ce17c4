#include "tools/confirm.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "files/content.hpp"

namespace nshpc::tools {

using mcp::json;

namespace {

// How long a legacy client may take to show the question and have it answered.
constexpr std::chrono::minutes kAnswerTimeout{5};
constexpr std::string_view kKey = "confirm";  // the inputRequests key and the schema's one field

std::string base64url(std::string_view data) {
  std::string s = files::base64_encode(data);
  while (!s.empty() && s.back() == '=') s.pop_back();
  std::replace(s.begin(), s.end(), '+', '-');
  std::replace(s.begin(), s.end(), '/', '_');
  return s;
}

std::optional<std::string> unbase64url(std::string text) {
  // Only the url alphabet: the standard one's '+', '/' and padding would be a second spelling.
  for (char c : text)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return std::nullopt;
  std::replace(text.begin(), text.end(), '-', '+');
  std::replace(text.begin(), text.end(), '_', '/');
  while (text.size() % 4 != 0) text.push_back('=');
  return files::base64_decode(text);
}

std::string hmac_sha256(const std::string& key, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), mac.data(), &size) == nullptr)
    throw Error("HMAC-SHA256 failed in libcrypto; the confirmation cannot be signed");
  return std::string(reinterpret_cast<const char*>(mac.data()), size);
}

// The arguments a state is bound to: canonical JSON (nlohmann's objects are sorted by key)
// without `confirm`, hashed.
std::string args_digest(const json& args) {
  json bound = args.is_object() ? args : json::object();
  bound.erase(std::string(kKey));
  return files::sha256_hex(bound.dump(-1, ' ', true, json::error_handler_t::replace));
}

std::int64_t unix_seconds(ConfirmStates::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

bool declared_elicitation(const json& caps) {
  if (!caps.is_object()) return false;
  auto e = caps.find("elicitation");
  if (e == caps.end() || !e->is_object()) return false;
  // {} is form mode (2025-06-18's meaning); from 2025-11-25 a client names the modes it has.
  return e->empty() || e->contains("form");
}

[[noreturn]] void declined(const std::string& what, const json& answer) {
  const std::string action = answer.is_object() ? answer.value("action", "") : "";
  throw UsageError(fmt::format("not done: the user declined ({}): {}", action.empty() ? "no answer" : action,
                               what));
}

// The record that the action was confirmed and how, in the store's log (it outlives a deleted
// instance); the tool's own mcp.tool_call line follows it.
void audit_confirmation(const ToolContext& ctx, mcp::RequestContext& rc, std::string_view tool, const json& args,
                        ConfirmedBy how) {
  json fields = {{"tool", tool}, {"confirmed_by", to_string(how)}};
  for (const char* name : {"instance_id", "computer_id", "archive_name", "name"})
    if (auto it = args.find(name); it != args.end() && it->is_string()) fields[name] = *it;
  try {
    ctx.services.instances.store().audit_store("mcp.confirmed", actor(rc), fields);
  } catch (const std::exception& e) {
    log::error("audit log not written for the confirmation of {}: {}", tool, e.what());
  }
}

}  // namespace

json confirmation_request(const std::string& what) {
  return {{"mode", "form"},
          {"message", what},
          {"requestedSchema",
           {{"type", "object"},
            {"properties",
             {{kKey, {{"type", "boolean"}, {"title", "Go ahead"}, {"description", "This cannot be undone."}}}}},
            {"required", {kKey}}}}};
}

bool accepts(const json& response) {
  if (!response.is_object() || response.value("action", "") != "accept") return false;
  auto content = response.find("content");
  if (content == response.end() || !content->is_object()) return false;
  auto yes = content->find(kKey);
  return yes != content->end() && yes->is_boolean() && yes->get<bool>();
}

std::string_view to_string(ConfirmedBy how) {
  switch (how) {
    case ConfirmedBy::not_asked: return "not_asked";
    case ConfirmedBy::argument: return "confirm_argument";
    case ConfirmedBy::elicitation: return "elicitation";
    case ConfirmedBy::input_required: return "input_required";
  }
  return "?";
}

json with_confirm(json input_schema) {
  // Short: every tool's schema is read on every turn, and a refusal says when to pass it.
  input_schema["properties"][std::string(kKey)] = {{"type", "boolean"}, {"description", "The user said yes."}};
  return input_schema;
}

ConfirmedBy confirm(const ToolContext& ctx, mcp::RequestContext& rc, std::string_view tool, const json& args,
                    const std::string& what) {
  if (!ctx.services.config.mcp.confirm_destructive) return ConfirmedBy::not_asked;
  const auto by = [&](ConfirmedBy how) {
    audit_confirmation(ctx, rc, tool, args, how);
    return how;
  };
  if (auto c = args.find(kKey); c != args.end() && c->is_boolean() && c->get<bool>()) return by(ConfirmedBy::argument);
  const json caps = rc.client_capabilities();
  if (declared_elicitation(caps)) {
    if (rc.era() == mcp::Era::legacy) {
      json answer;
      try {
        answer = rc.request_client("elicitation/create", confirmation_request(what),
                                   std::chrono::duration_cast<std::chrono::milliseconds>(kAnswerTimeout));
      } catch (const mcp::ProtocolError& e) {
        throw UsageError(fmt::format("not done: the confirmation was not answered ({}): {}", e.what(),
                                     what));
      }
      if (!accepts(answer)) declined(what, answer);
      return by(ConfirmedBy::elicitation);
    }
    ConfirmStates& states = confirm_states(ctx.services);
    if (!rc.request_state().empty()) {
      if (const std::string why = states.redeem(rc.request_state(), tool, args); !why.empty())
        throw UsageError(fmt::format("refused: the confirmation's state was altered or already used ({}); call "
                                     "again without requestState to be asked afresh",
                                     why));
      const json& responses = rc.input_responses();
      if (responses.is_object() && responses.contains(kKey)) {
        const json& answer = responses.at(std::string(kKey));
        if (!accepts(answer)) declined(what, answer);
        return by(ConfirmedBy::input_required);
      }
      // A retry without the answer is asked again (MRTR: request what is missing once more).
    }
    throw mcp::InputRequired{
        json{{kKey, {{"method", "elicitation/create"}, {"params", confirmation_request(what)}}}},
        states.mint(tool, args)};
  }
  throw UsageError(fmt::format("{} This cannot be undone; ask the user, then call again with confirm: true", what));
}

// ---------------------------------------------------------------------------------------------

ConfirmStates::ConfirmStates(std::string key) : key_(std::move(key)) {
  if (key_.size() != 32) throw Error(fmt::format("a confirmation key is 32 bytes, not {}", key_.size()));
}

std::string ConfirmStates::load_key(const std::filesystem::path& file) {
  const auto parse = [&](const std::string& text) {
    std::string hex = text;
    while (!hex.empty() && std::isspace(static_cast<unsigned char>(hex.back()))) hex.pop_back();
    std::string key;
    if (hex.size() == 64 && std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
      for (std::size_t i = 0; i < 64; i += 2) key.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    if (key.size() != 32)
      throw Error(fmt::format("{} holds no confirmation key (64 hex digits); delete it to get a new one",
                              file.string()));
    return key;
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0) {
      if ((st.st_mode & 077) != 0)
        throw Error(fmt::format("{} is readable by other users (mode {:o}); run 'chmod 600 {}' or delete it",
                                file.string(), st.st_mode & 0777, file.string()));
      std::optional<std::string> text = fs::read_file(file);
      if (!text) throw SysError(ENOENT, "read", file.string());
      return parse(*text);
    }
    if (errno != ENOENT) throw SysError(errno, "stat", file.string());
    fs::make_dirs(file.parent_path(), 0711);
    // Written whole under a temporary name, then linked into place: link(2) fails on an existing
    // file, so two servers starting at once end up with the same key.
    const std::filesystem::path tmp = file.string() + ".tmp-" + random::hex(8);
    fs::atomic_write(tmp, random::hex(32) + "\n", 0600);
    const int linked = ::link(tmp.c_str(), file.c_str());
    const int err = errno;
    ::unlink(tmp.c_str());
    if (linked != 0 && err != EEXIST) throw SysError(err, "link", file.string());
  }
  throw Error(fmt::format("{} could not be made or read; check its folder", file.string()));
}

std::string ConfirmStates::mint(std::string_view tool, const json& args, Clock::time_point now) const {
  const json payload = {{"t", tool},
                        {"a", args_digest(args)},
                        {"e", unix_seconds(now + kLifetime)},
                        {"n", random::hex(16)}};
  const std::string body = base64url(payload.dump());
  return body + "." + base64url(hmac_sha256(key_, body));
}

std::string ConfirmStates::redeem(const std::string& state, std::string_view tool, const json& args,
                                  Clock::time_point now) {
  if (state.size() > 1024) return "too long";
  const std::size_t dot = state.find('.');
  if (dot == std::string::npos) return "not a state this server made";
  const std::string body = state.substr(0, dot);
  const std::optional<std::string> mac = unbase64url(state.substr(dot + 1));
  const std::string expected = hmac_sha256(key_, body);
  if (!mac || mac->size() != expected.size() || CRYPTO_memcmp(mac->data(), expected.data(), expected.size()) != 0)
    return "its signature does not match";
  // Signed by this key: from here on the payload is ours.
  const std::optional<std::string> text = unbase64url(body);
  if (!text) return "not a state this server made";
  const json payload = json::parse(*text, nullptr, false);
  if (!payload.is_object() || !payload.contains("e") || !payload["e"].is_number_integer() ||
      !payload.contains("n") || !payload["n"].is_string())
    return "not a state this server made";
  const std::int64_t expiry = payload["e"].get<std::int64_t>();
  if (unix_seconds(now) > expiry) return "expired";
  if (payload.value("t", "") != tool || payload.value("a", "") != args_digest(args))
    return "made for another call";
  std::lock_guard lock(mu_);
  const std::int64_t t = unix_seconds(now);
  std::erase_if(used_, [t](const auto& entry) { return entry.second < t; });
  if (used_.contains(payload["n"].get<std::string>())) return "already used";
  // Past the bound, the state that expires first is forgotten (a flood of confirmations could
  // only shorten the replay memory of the oldest, never grow the process).
  if (used_.size() >= kMaxRemembered)
    used_.erase(std::min_element(used_.begin(), used_.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; }));
  used_.emplace(payload["n"].get<std::string>(), expiry);
  return {};
}

ConfirmSigner::ConfirmSigner() = default;
ConfirmSigner::~ConfirmSigner() = default;

ConfirmStates& confirm_states(const Services& services) {
  ConfirmSigner& signer = *services.confirmations;
  std::lock_guard lock(signer.mutex);
  if (!signer.states)
    signer.states = std::make_unique<ConfirmStates>(
        ConfirmStates::load_key(services.config.server.state_dir / "confirm-key"));
  return *signer.states;
}

}  // namespace nshpc::tools
