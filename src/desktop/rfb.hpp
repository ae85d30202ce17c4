// What a browser may send to an instance's VNC server through the live-view relay: the client's
// half of RFB (RFC 6143), framed and checked, nothing else. Pure: bytes in, bytes out, no I/O.
//
// The handshake the filter passes, as the sandbox's x11vnc (-nopw) leads it:
//   ProtocolVersion  12 bytes "RFB 003.00x\n", x = 3, 7 or 8 (any other version is refused)
//   security type    1 byte, 3.7 and 3.8 only, and only None (1): the server offers no other, and
//                    a stream after another type (VNC auth, TLS) could not be framed. In 3.3 the
//                    server names the type and the client sends nothing here.
//   ClientInit       1 byte, the shared flag, forwarded as 1: one browser never disconnects the
//                    other viewers (nor an agent's).
// Then the client's messages (type byte first, lengths big-endian):
//   0 SetPixelFormat 20 · 2 SetEncodings 4 + 4n (n <= kMaxEncodings) · 3 FramebufferUpdateRequest
//   10 · 4 KeyEvent 8 · 5 PointerEvent 6 · 6 ClientCutText 8 + |length| (<= kMaxCutText; a negative
//   length is the Extended Clipboard form noVNC sends when the server accepts that encoding).
// Any other type cannot be framed (its length is unknown): an RfbError, and the relay closes.
//
// view_only (the default) drops KeyEvent, PointerEvent and ClientCutText. It may change at any
// time; it applies from the next message on (a message is forwarded or dropped whole). The counts
// of input messages passed are for the audit's batches: how many, never what was typed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.hpp"

namespace nshpc::desktop {

inline constexpr std::size_t kMaxEncodings = 1024;
inline constexpr std::size_t kMaxCutText = std::size_t{1} << 20;

// A browser's stream that is not the client's half of RFB as the filter allows it.
class RfbError : public Error {
 public:
  using Error::Error;
};

class RfbClientFilter {
 public:
  struct Counts {
    std::uint64_t keys = 0;       // KeyEvent messages passed (a press and a release are two)
    std::uint64_t pointer = 0;    // PointerEvent messages passed
    std::uint64_t clipboard = 0;  // ClientCutText messages passed
    bool operator==(const Counts&) const = default;
  };

  explicit RfbClientFilter(bool view_only = true) : view_only_(view_only) {}

  void set_view_only(bool view_only) { view_only_ = view_only; }
  bool view_only() const { return view_only_; }

  // Takes the next bytes from the browser (split anywhere) and returns those to send on to the
  // VNC server. Throws RfbError saying what was wrong; after that every call throws.
  std::string feed(std::string_view bytes);

  Counts counts() const { return counts_; }
  // Whether the handshake is through (the stream is at message boundaries or inside a message).
  bool handshaken() const { return phase_ == Phase::message || phase_ == Phase::body; }

 private:
  enum class Phase { version, security, client_init, message, body, failed };
  [[noreturn]] void fail(std::string why);
  // A message's fixed part is in pending_: its variable part's length checked, its bytes passed
  // or dropped, counted.
  void finish_header(std::string& out);

  Phase phase_ = Phase::version;
  bool view_only_;
  bool forward_ = true;        // the current message's fate, decided at its first byte
  std::string pending_;        // a handshake step's or a message header's bytes so far (<= 20)
  std::uint64_t body_left_ = 0;  // the current message's variable part not yet seen
  int minor_ = 0;              // the protocol version agreed: 3.minor_
  Counts counts_;
};

}  // namespace nshpc::desktop
