// The WebDAV `If` header (RFC 4918 §10.4): tagged and untagged lists of conditions on lock
// tokens and entity tags, each possibly negated with `Not`.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::dav {

struct IfCondition {
  bool negated = false;
  bool is_etag = false;  // [etag]; else a state token <uri>
  std::string value;     // the token URI, or the entity tag with its quotes (and W/)
};

struct IfList {
  std::optional<std::string> resource;  // the resource tag's URI as sent; nullopt: the request URI
  std::vector<IfCondition> conditions;
};

// Parses the header; throws std::invalid_argument saying what is malformed (answer 400).
std::vector<IfList> parse_if_header(std::string_view header);

// What the evaluation needs to know about a resource (named by a decoded URL path).
struct IfFacts {
  // The resource's current entity tag; nullopt when it does not exist.
  std::function<std::optional<std::string>(const std::string& path)> etag;
  // Whether `token` names a lock that covers the resource.
  std::function<bool(const std::string& path, const std::string& token)> locked_by;
  // The decoded URL path of a resource tag (its path part; nullopt when it is not on this server).
  std::function<std::optional<std::string>(const std::string& uri)> path_of;
};

// True when any list holds for its resource (`request_path` for an untagged list).
bool evaluate_if(const std::vector<IfList>& lists, const std::string& request_path, const IfFacts& facts);

// Every state token named in the header (not negated): the lock tokens the client submits.
std::vector<std::string> submitted_tokens(const std::vector<IfList>& lists);

}  // namespace nshpc::dav
