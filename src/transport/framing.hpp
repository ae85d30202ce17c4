// Newline-delimited message framing with a size cap (the stdio transport's wire format).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::transport {

struct Frame {
  enum class Kind { message, too_long };
  Kind kind = Kind::message;
  std::string text;       // the message (without the newline; a trailing '\r' removed)
  std::size_t size = 0;   // bytes of the line (for too_long: how many were discarded)
};

// Splits a byte stream into lines of at most `max_bytes`. A longer line is reported once as
// too_long (its bytes are dropped, not buffered) and reading resumes after its newline.
// Blank lines are skipped.
class LineFramer {
 public:
  explicit LineFramer(std::size_t max_bytes) : max_bytes_(max_bytes) {}
  std::vector<Frame> feed(std::string_view bytes);
  // End of input: the unterminated last line, if any.
  std::optional<Frame> finish();

 private:
  void complete_line(std::vector<Frame>& out);

  std::size_t max_bytes_;
  std::string buffer_;
  bool discarding_ = false;
  std::size_t discarded_ = 0;
};

}  // namespace nshpc::transport
