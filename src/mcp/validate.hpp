// Internal to src/mcp: the minimal JSON-Schema check of tool arguments.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "mcp/protocol.hpp"

namespace nshpc::mcp::detail {

// Checks tool arguments against the subset of JSON Schema that tool input schemas use:
// `type` (a name or an array of names; "integer" = a number without fraction), `enum`, `const`,
// `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`, `minLength`/`maxLength` (code
// points), `items`/`minItems`/`maxItems`, `properties`/`required`/`additionalProperties`
// (false or a schema), boolean schemas. Other keywords are ignored. Returns the first problem,
// naming the argument and what is expected, e.g.
//   argument 'timeout': expected an integer, got a string
//   missing required argument 'instance_id'
// or nullopt when the arguments are acceptable.
std::optional<std::string> validate_arguments(const json& arguments, const json& schema);

// "a string", "an integer", "a number", "a boolean", "an object", "an array", "null".
std::string_view describe_type(const json& value);

}  // namespace nshpc::mcp::detail
