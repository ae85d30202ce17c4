#include <array>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/random.hpp"
#include "store/store.hpp"

namespace nshpc::store {

namespace {

constexpr std::array kAdjectives = {"amber", "brave",  "calm",  "clever", "crisp", "eager",
                                    "gentle", "golden", "happy", "keen",   "lucid", "mellow",
                                    "nimble", "quiet",  "rapid", "silver", "steady", "sunny",
                                    "swift",  "tidy",   "vivid", "warm",   "wise",  "zesty"};
constexpr std::array kNouns = {"badger", "crane", "dolphin", "falcon", "finch",  "fox",
                               "heron",  "ibis",  "koala",   "lynx",   "marten", "newt",
                               "otter",  "owl",   "panda",   "puffin", "quail",  "raven",
                               "seal",   "stoat", "swan",    "tapir",  "wren",   "yak"};

bool is_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

}  // namespace

void validate_id(std::string_view id) {
  if (id.empty()) throw UsageError("instance id is empty; use 1-63 characters from A-Z a-z 0-9 _ . -");
  if (id.size() > 63)
    throw UsageError(fmt::format("instance id '{}…' is {} characters long; the limit is 63",
                                 id.substr(0, 20), id.size()));
  for (char c : id) {
    if (!is_id_char(c)) {
      std::string shown = (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
                              ? fmt::format("\\x{:02x}", static_cast<unsigned char>(c))
                              : std::string(1, c);
      throw UsageError(fmt::format(
          "invalid instance id '{}': character '{}' is not allowed; use A-Z a-z 0-9 _ . - only",
          std::string(id.begin(), id.end()).size() > 40 ? std::string(id.substr(0, 40)) : std::string(id),
          shown));
    }
  }
  if (id.front() == '.' || id.front() == '-' || id.front() == '_')
    throw UsageError(fmt::format(
        "invalid instance id '{}': it must start with a letter or digit (names starting with '.' are reserved)",
        id));
  if (id == "output")
    throw UsageError("'output' is a reserved name (the folder holding every instance's output); choose another id");
}

std::string generate_id() {
  return fmt::format("{}-{}-{}", kAdjectives[random::below(kAdjectives.size())],
                     kNouns[random::below(kNouns.size())], random::hex(2));
}

}  // namespace nshpc::store
