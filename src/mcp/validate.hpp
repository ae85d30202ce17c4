// Internal to src/mcp: the minimal JSON-Schema check of tool arguments and small UTF-8 helpers.
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

// Byte offset of the first ill-formed UTF-8 sequence (RFC 3629: no overlongs, no surrogates,
// nothing above U+10FFFF), or nullopt when `text` is valid UTF-8.
std::optional<std::size_t> find_invalid_utf8(std::string_view text);
// Number of code points; each ill-formed byte counts as one.
std::size_t utf8_length(std::string_view text);
// `text` with every ill-formed byte replaced by U+FFFD (safe to put into a json string).
std::string sanitize_utf8(std::string_view text);

}  // namespace nshpc::mcp::detail
