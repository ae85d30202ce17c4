// The one translation unit that generates nlohmann::json's code (see json.hpp).
#include "base/json.hpp"

template class nlohmann::basic_json<>;

namespace nshpc {

nlohmann::json parse_json(std::string_view text) { return nlohmann::json::parse(text); }

nlohmann::json parse_json_or_discarded(std::string_view text) { return nlohmann::json::parse(text, nullptr, false); }

}  // namespace nshpc
