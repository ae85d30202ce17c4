// JSON conversions nlohmann-json 3.11 lacks: std::optional as the value or null.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

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
