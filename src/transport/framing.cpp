#include "transport/framing.hpp"

namespace nshpc::transport {

void LineFramer::complete_line(std::vector<Frame>& out) {
  if (discarding_) {
    out.push_back({Frame::Kind::too_long, {}, discarded_});
    discarding_ = false;
    discarded_ = 0;
    return;
  }
  if (!buffer_.empty() && buffer_.back() == '\r') buffer_.pop_back();
  bool blank = buffer_.find_first_not_of(" \t\r") == std::string::npos;
  if (!blank) out.push_back({Frame::Kind::message, buffer_, buffer_.size()});
  buffer_.clear();
}

std::vector<Frame> LineFramer::feed(std::string_view bytes) {
  std::vector<Frame> out;
  while (!bytes.empty()) {
    const std::size_t newline = bytes.find('\n');
    const std::string_view chunk = bytes.substr(0, newline);
    if (discarding_) {
      discarded_ += chunk.size();
    } else if (buffer_.size() + chunk.size() > max_bytes_) {
      discarding_ = true;
      discarded_ = buffer_.size() + chunk.size();
      buffer_.clear();
      buffer_.shrink_to_fit();
    } else {
      buffer_.append(chunk);
    }
    if (newline == std::string_view::npos) break;
    complete_line(out);
    bytes.remove_prefix(newline + 1);
  }
  return out;
}

std::optional<Frame> LineFramer::finish() {
  std::vector<Frame> out;
  if (discarding_ || !buffer_.empty()) complete_line(out);
  if (out.empty()) return std::nullopt;
  return out.front();
}

}  // namespace nshpc::transport
