// The desktop's accessibility tree (AT-SPI), in mcp-virtual-computer's snapshot format
// `at-spi-snapshot-v1`: at most 600 elements, 12 levels below the applications, 200 children per
// element and 80 applications; an element's ref is the path of child indices from the desktop
// (`atspi:8/0/2`: application 8, its child 0, that one's child 2), so refs change when the tree
// does (take a new snapshot after navigating).
//
// The tree is read inside the instance's sandbox by a Python script built into this binary (the
// application's own AT-SPI calls must happen where its bus is), one JSON request on stdin and one
// JSON answer on stdout. Like the seed, a snapshot keeps the applications and their first level,
// and below them only what is showing (or focused) and says something: a name, an action, focus,
// or an interactive or structural role; an element's parent_ref is its nearest kept ancestor.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.hpp"

namespace nshpc::desktop {

inline constexpr std::string_view kSnapshotFormat = "at-spi-snapshot-v1";
inline constexpr std::size_t kMaxNodes = 600;
inline constexpr int kMaxDepth = 12;
inline constexpr int kMaxChildren = 200;
inline constexpr int kMaxApps = 80;
// What the caller reads of the script's answer at most (600 elements come to about 150 KiB).
inline constexpr std::size_t kMaxAnswer = std::size_t{2} << 20;

// argv run in the sandbox (with session_env()): python3 with pyatspi, the script embedded
// (`python3 -c`), one JSON request on stdin, one JSON answer on stdout:
//   {"op": "snapshot", "max_nodes": 600, "max_depth": 12, "max_children": 200, "max_apps": 80,
//    "timeout_ms": 10000}                                   -> {format, truncated, nodes: [...]}
//   {"op": "element", "ref": "atspi:1/0/2"}                  -> that node (bounds, actions)
//   {"op": "action", "ref": "atspi:1/0/2", "name": "click"}  -> does the element's action (AT-SPI
//                                                              doAction) -> {ok: true}
// Every limit is optional (the defaults are the maxima above). Each call to an application waits
// at most 1.5 s, and a snapshot stops walking after timeout_ms (then truncated). A failure: exit 1,
// one line on stderr and {"error": TEXT} on stdout (a missing pyatspi names its Debian packages).
std::vector<std::string> atspi_command();

struct Bounds {
  int x = 0, y = 0, width = 0, height = 0;  // screen pixels
};

struct Node {
  std::string ref, parent_ref, role, name;  // parent_ref "" for an application
  int depth = 0;                             // 0: an application
  bool focused = false, focusable = false, enabled = true;
  std::optional<Bounds> bounds;  // none when it has no extent on the screen
  std::vector<std::string> actions;
};

struct Snapshot {
  std::vector<Node> nodes;
  bool truncated = false;  // a limit cut the tree (nodes, depth, children, applications or time)
};

// Whether `ref` is a ref: ^atspi:[0-9]+(/[0-9]+)*$, at most kMaxDepth + 1 indices of at most 4
// digits each. For checking a caller's ref before anything runs.
bool valid_ref(std::string_view ref);

// The script's output is hostile (the sandbox wrote it): at most kMaxAnswer bytes; every string
// cut to a sane length (names 200 characters, roles and actions 64) with control and
// direction-override characters replaced by spaces; refs checked with valid_ref, each node's depth
// against its ref, its parent_ref an ancestor (for a snapshot: one listed before it); no ref
// twice; node count and depth within the limits above; bounds within ±100000 pixels. Throws Error
// naming what was wrong, or saying the script's own error ({"error": ...}).
Snapshot parse_snapshot(std::string_view output);
Node parse_element(std::string_view output);
// The answer to an "action" request: returns when it was done, throws Error otherwise.
void parse_action(std::string_view output);

// The seed's document: {format, truncated, snapshot (snapshot_text), elements: [{ref, parent_ref
// (null for an application), role, name, focused, focusable, enabled, bounds {x, y, width,
// height} when known, actions when any}]}.
nlohmann::json snapshot_json(const Snapshot& snapshot);

// The seed's indented text, a line per element:
//   <2 spaces per level>- ROLE "NAME" [ref=atspi:4/0/1 bounds=X,Y,W,H focused actions=click]
// (no name: no quotes; a quote or backslash in a name escaped with a backslash; bounds, focused
// and actions only when there are any).
std::string snapshot_text(const Snapshot& snapshot);

}  // namespace nshpc::desktop
