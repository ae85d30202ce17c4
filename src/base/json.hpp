// nlohmann-json as ns-hpc uses it: compiled once, one way to read JSON text, and std::optional as
// a value or null.
//
// base/json.cpp instantiates nlohmann::json (basic_json<>) and its parser once; every other
// translation unit only declares them (the extern template below), so the compiler does not
// generate the library again in each of them. Include this header, never <nlohmann/json.hpp>.
#pragma once

#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

extern template class nlohmann::basic_json<>;

namespace nshpc {

// `text` as JSON. Throws nlohmann::json::parse_error, whose message names the byte that is wrong.
nlohmann::json parse_json(std::string_view text);

// `text` as JSON; a discarded value (`is_discarded()`) when it is not JSON.
nlohmann::json parse_json_or_discarded(std::string_view text);

}  // namespace nshpc

// nlohmann-json 3.11 lacks these conversions: std::optional as the value or null.
NLOHMANN_JSON_NAMESPACE_BEGIN
template <typename T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& value) {
    if (value) j = *value;
    else j = nullptr;
  }
  static void from_json(const json& j, std::optional<T>& value) {
    if (j.is_null()) value.reset();
    else value = j.get<T>();
  }
};
NLOHMANN_JSON_NAMESPACE_END
