#include "desktop/rfb.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace nshpc::desktop {

namespace {

constexpr std::size_t kVersionLength = 12;  // "RFB 003.008\n"
constexpr unsigned char kSecurityNone = 1;

enum : unsigned char {
  kSetPixelFormat = 0,
  kSetEncodings = 2,
  kFramebufferUpdateRequest = 3,
  kKeyEvent = 4,
  kPointerEvent = 5,
  kClientCutText = 6,
};

// The fixed part of each message the filter allows, by type (0: not allowed).
constexpr std::size_t fixed_length(unsigned char type) {
  switch (type) {
    case kSetPixelFormat: return 20;
    case kSetEncodings: return 4;
    case kFramebufferUpdateRequest: return 10;
    case kKeyEvent: return 8;
    case kPointerEvent: return 6;
    case kClientCutText: return 8;
    default: return 0;
  }
}

constexpr bool is_input(unsigned char type) {
  return type == kKeyEvent || type == kPointerEvent || type == kClientCutText;
}

std::uint32_t be(std::string_view bytes, std::size_t at, std::size_t width) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < width; ++i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

}  // namespace

void RfbClientFilter::fail(std::string why) {
  phase_ = Phase::failed;
  pending_.clear();
  throw RfbError("the live view's client sent what RFB does not allow here: " + why);
}

std::string RfbClientFilter::feed(std::string_view bytes) {
  if (phase_ == Phase::failed) throw RfbError("the live view's client stream was refused already; it cannot go on");
  std::string out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    switch (phase_) {
      case Phase::version: {
        const std::size_t n = std::min(kVersionLength - pending_.size(), bytes.size() - at);
        pending_.append(bytes.substr(at, n));
        at += n;
        if (pending_.size() < kVersionLength) break;
        if (pending_ == "RFB 003.003\n") minor_ = 3;
        else if (pending_ == "RFB 003.007\n") minor_ = 7;
        else if (pending_ == "RFB 003.008\n") minor_ = 8;
        else fail("a protocol version other than 3.3, 3.7 or 3.8");
        out += pending_;
        pending_.clear();
        // In 3.3 the server names the security type; the client chooses nothing.
        phase_ = minor_ == 3 ? Phase::client_init : Phase::security;
        break;
      }
      case Phase::security:
        if (static_cast<unsigned char>(bytes[at]) != kSecurityNone)
          fail(fmt::format("security type {} (only None, 1, is offered)", static_cast<unsigned char>(bytes[at])));
        out += bytes[at++];
        phase_ = Phase::client_init;
        break;
      case Phase::client_init:
        ++at;
        out += '\x01';  // shared, whatever the browser asked
        phase_ = Phase::message;
        break;
      case Phase::message: {
        if (pending_.empty()) {
          const auto type = static_cast<unsigned char>(bytes[at]);
          if (fixed_length(type) == 0) fail(fmt::format("message type {}, which the live view does not pass", type));
          forward_ = !(view_only_ && is_input(type));
        }
        const std::size_t length = fixed_length(static_cast<unsigned char>(pending_.empty() ? bytes[at] : pending_[0]));
        const std::size_t n = std::min(length - pending_.size(), bytes.size() - at);
        pending_.append(bytes.substr(at, n));
        at += n;
        if (pending_.size() == length) finish_header(out);
        break;
      }
      case Phase::body: {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(body_left_, bytes.size() - at));
        if (forward_) out.append(bytes.substr(at, n));
        at += n;
        body_left_ -= n;
        if (body_left_ == 0) phase_ = Phase::message;
        break;
      }
      case Phase::failed:
        break;  // fail() threw
    }
  }
  return out;
}

void RfbClientFilter::finish_header(std::string& out) {
  const auto type = static_cast<unsigned char>(pending_[0]);
  body_left_ = 0;
  if (type == kSetEncodings) {
    const std::uint32_t count = be(pending_, 2, 2);
    if (count > kMaxEncodings) fail(fmt::format("SetEncodings with {} encodings (at most {})", count, kMaxEncodings));
    body_left_ = std::uint64_t{count} * 4;
  } else if (type == kClientCutText) {
    // A negative length (as a signed 32-bit number) is the Extended Clipboard pseudo-encoding's
    // form, which noVNC uses once the server accepts that encoding: its body is -length bytes.
    const auto length = static_cast<std::int32_t>(be(pending_, 4, 4));
    const std::uint64_t body = length < 0 ? static_cast<std::uint64_t>(-static_cast<std::int64_t>(length))
                                          : static_cast<std::uint64_t>(length);
    if (body > kMaxCutText)
      fail(fmt::format("ClientCutText of {} bytes (at most {})", body, kMaxCutText));
    body_left_ = body;
  }
  if (forward_) {
    out += pending_;
    if (type == kKeyEvent) ++counts_.keys;
    else if (type == kPointerEvent) ++counts_.pointer;
    else if (type == kClientCutText) ++counts_.clipboard;
  }
  pending_.clear();
  phase_ = body_left_ > 0 ? Phase::body : Phase::message;
}

}  // namespace nshpc::desktop
