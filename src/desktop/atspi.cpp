#include "desktop/atspi.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"

namespace nshpc::desktop {

namespace {

using nlohmann::json;

// The helper run in the sandbox. It trusts nothing it is asked either: limits are checked, refs
// parsed, and every call to an application bounded (pyatspi.setTimeout).
constexpr std::string_view kScript = R"py(
import json, sys, time

def answer(doc, code=0):
    sys.stdout.write(json.dumps(doc, ensure_ascii=True, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    sys.exit(code)

def fail(message):
    message = str(message)[:500]
    sys.stderr.write(message + "\n")
    answer({"error": message}, 1)

try:
    request = json.loads(sys.stdin.read(65536) or "null")
except ValueError as e:
    fail("the request is not JSON: %s" % e)
if not isinstance(request, dict) or not isinstance(request.get("op"), str):
    fail("the request must be a JSON object with an op")

try:
    import gi
    gi.require_version("Atspi", "2.0")
    from gi.repository import Gio
except Exception as e:
    fail("python3 cannot load AT-SPI (Debian packages python3-gi, gir1.2-atspi-2.0): %s" % e)

# Without its bus, AT-SPI aborts the process: ask the session bus for it first (not starting it).
try:
    Gio.bus_get_sync(Gio.BusType.SESSION, None).call_sync(
        "org.a11y.Bus", "/org/a11y/bus", "org.a11y.Bus", "GetAddress", None, None,
        Gio.DBusCallFlags.NO_AUTO_START, 3000, None)
except Exception as e:
    fail("the desktop's accessibility bus does not answer (is the desktop on?): %s" % e)

try:
    import pyatspi
except Exception as e:
    fail("python3 cannot load pyatspi (Debian package python3-pyatspi): %s" % e)

# A call to an application is a D-Bus round trip it answers: a hung one costs 1.5 s, not 25, also
# while it is starting (no grace period).
pyatspi.setTimeout(1500, -1)
started = time.monotonic()

def text(value, size=200):
    value = "" if value is None else str(value)
    value = "".join(" " if c < " " or c == "\x7f" else c for c in value).strip()
    return value[:size]

def limit(name, default, low, high):
    value = request.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or value > high:
        fail("%s must be an integer from %d to %d" % (name, low, high))
    return value

def node_bounds(node):
    try:
        e = node.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
    except Exception:
        return None
    if e.width <= 0 or e.height <= 0 or e.x + e.width <= 0 or e.y + e.height <= 0:
        return None
    return {"x": int(e.x), "y": int(e.y), "width": int(e.width), "height": int(e.height)}

def node_actions(node):
    try:
        a = node.queryAction()
        return [text(a.getName(i), 64) for i in range(min(a.nActions, 32))]
    except Exception:
        return []

def ref_of(path):
    return "atspi:" + "/".join(str(i) for i in path)

def describe(node, path, parent_ref):
    states = node.getState()
    item = {
        "ref": ref_of(path),
        "parent_ref": parent_ref,
        "role": text(node.getRoleName(), 64) or "unknown",
        "name": text(node.name),
        "depth": len(path) - 1,
        "focused": states.contains(pyatspi.STATE_FOCUSED),
        "focusable": states.contains(pyatspi.STATE_FOCUSABLE),
        "enabled": states.contains(pyatspi.STATE_ENABLED),
    }
    bounds = node_bounds(node)
    if bounds:
        item["bounds"] = bounds
    actions = node_actions(node)
    if actions:
        item["actions"] = actions
    return item, states.contains(pyatspi.STATE_SHOWING)

# Roles worth a line without a name (the seed's list).
MEANINGFUL = {"application", "frame", "dialog", "alert", "terminal", "push button", "toggle button",
              "check box", "radio button", "combo box", "entry", "text", "password text", "menu",
              "menu item", "page tab", "list", "list item", "table", "table cell", "tree", "tree item",
              "link", "icon", "label"}

def snapshot():
    max_nodes = limit("max_nodes", 600, 1, 600)
    max_depth = limit("max_depth", 12, 0, 12)
    max_children = limit("max_children", 200, 1, 200)
    max_apps = limit("max_apps", 80, 1, 80)
    budget = limit("timeout_ms", 10000, 100, 60000) / 1000.0
    nodes = []
    truncated = False

    def walk(node, path, parent_ref):
        nonlocal truncated
        if len(nodes) >= max_nodes or time.monotonic() - started > budget:
            truncated = True
            return
        try:
            item, showing = describe(node, path, parent_ref)
        except Exception:
            return
        depth = item["depth"]
        keep = (depth <= 1 or item["role"] in MEANINGFUL or item["name"] or "actions" in item
                or item["focused"]) and (depth <= 1 or showing or item["focused"])
        if keep:
            nodes.append(item)
            parent_ref = item["ref"]
        if depth >= max_depth:
            return
        try:
            count = int(node.childCount)
        except Exception:
            return
        if count > max_children:
            truncated = True
        for index in range(min(count, max_children)):
            if len(nodes) >= max_nodes:
                truncated = True
                return
            try:
                child = node.getChildAtIndex(index)
            except Exception:
                continue
            if child is not None:
                walk(child, path + [index], parent_ref)

    desktop = pyatspi.Registry.getDesktop(0)
    apps = int(desktop.childCount)
    if apps > max_apps:
        truncated = True
    for index in range(min(apps, max_apps)):
        try:
            app = desktop.getChildAtIndex(index)
        except Exception:
            continue
        if app is not None:
            walk(app, [index], None)
    answer({"format": "at-spi-snapshot-v1", "truncated": truncated, "nodes": nodes})

def node_at(ref):
    if not isinstance(ref, str) or not ref.startswith("atspi:") or len(ref) > 100:
        fail("ref must be a string atspi:N/N/...")
    try:
        path = [int(p) for p in ref[len("atspi:"):].split("/")]
    except ValueError:
        fail("ref %s is not atspi: followed by child indices" % text(ref))
    if len(path) > 13 or any(i < 0 for i in path):
        fail("ref %s is not atspi: followed by at most 13 child indices" % text(ref))
    node = pyatspi.Registry.getDesktop(0)
    for index in path:
        try:
            child = node.getChildAtIndex(index) if index < int(node.childCount) else None
        except Exception:
            child = None
        if child is None:
            fail("element %s is no longer there (the tree changed: take a new snapshot)" % ref)
        node = child
    return node, path

def element():
    node, path = node_at(request.get("ref"))
    try:
        item, _ = describe(node, path, ref_of(path[:-1]) if len(path) > 1 else None)
    except Exception as e:
        fail("element %s cannot be read: %s" % (ref_of(path), text(e)))
    answer(item)

def action():
    name = request.get("name")
    if not isinstance(name, str) or not name:
        fail("name must be the name of one of the element's actions")
    node, path = node_at(request.get("ref"))
    ref = ref_of(path)
    try:
        a = node.queryAction()
        names = [a.getName(i) for i in range(a.nActions)]
    except Exception:
        fail("element %s has no actions" % ref)
    if name not in names:
        fail("element %s has no action '%s'; its actions: %s" % (ref, text(name, 64), text(", ".join(names)) or "none"))
    try:
        done = a.doAction(names.index(name))
    except Exception as e:
        fail("action '%s' of %s failed: %s" % (text(name, 64), ref, text(e)))
    if not done:
        fail("element %s refused action '%s'" % (ref, text(name, 64)))
    answer({"ok": True, "ref": ref, "name": name})

ops = {"snapshot": snapshot, "element": element, "action": action}
if request["op"] not in ops:
    fail("op must be snapshot, element or action")
try:
    ops[request["op"]]()
except SystemExit:
    raise
except Exception as e:
    fail("%s failed: %s" % (request["op"], text(e)))
)py";

constexpr std::size_t kMaxName = 200;    // code points
constexpr std::size_t kMaxRole = 64;
constexpr std::size_t kMaxActions = 32;
constexpr int kMaxCoordinate = 100000;
constexpr std::size_t kMaxIndexDigits = 4;

// The answer's text as shown to a model and a person: no control characters (C0, DEL, C1), no
// line or paragraph separators and no direction overrides (text that reads differently from what
// it is), valid UTF-8, at most `max_chars` code points.
std::string clean(std::string_view raw, std::size_t max_chars) {
  const std::string valid = text::sanitize_utf8(raw);
  std::string out;
  out.reserve(valid.size());
  for (std::size_t i = 0; i < valid.size();) {
    const auto c = static_cast<unsigned char>(valid[i]);
    const std::size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    const std::string_view ch(valid.data() + i, std::min(len, valid.size() - i));
    i += ch.size();
    bool control = c < 0x20 || c == 0x7F;
    if (ch.size() == 2 && c == 0xC2 && static_cast<unsigned char>(ch[1]) < 0xA0) control = true;  // C1
    if (ch.size() == 3 && c == 0xE2 && static_cast<unsigned char>(ch[1]) == 0x80) {
      const auto last = static_cast<unsigned char>(ch[2]);
      if (last == 0xA8 || last == 0xA9 || (last >= 0xAA && last <= 0xAE)) control = true;  // U+2028-202E
    }
    if (ch.size() == 3 && c == 0xE2 && static_cast<unsigned char>(ch[1]) == 0x81) {
      const auto last = static_cast<unsigned char>(ch[2]);
      if (last >= 0xA6 && last <= 0xA9) control = true;  // U+2066-2069 (isolates)
    }
    out += control ? std::string_view(" ") : ch;
  }
  const std::string_view trimmed = text::trim(out);
  return std::string(trimmed.substr(0, text::utf8_prefix_bytes(trimmed, max_chars)));
}

// A hostile value, quoted in an error message.
std::string shown(const json& value) { return text::truncate_utf8(text::sanitize_utf8(value.dump()), 60); }

// The indices of a valid ref; nullopt when it is not one.
std::optional<std::vector<int>> ref_indices(std::string_view ref) {
  constexpr std::string_view prefix = "atspi:";
  if (!ref.starts_with(prefix)) return std::nullopt;
  std::vector<int> out;
  for (std::string_view part : text::split(ref.substr(prefix.size()), '/')) {
    if (part.empty() || part.size() > kMaxIndexDigits || out.size() > static_cast<std::size_t>(kMaxDepth)) return std::nullopt;
    int value = 0;
    for (char c : part) {
      if (c < '0' || c > '9') return std::nullopt;
      value = value * 10 + (c - '0');
    }
    out.push_back(value);
  }
  return out;
}

[[noreturn]] void malformed(std::string_view what, std::string_view problem) {
  throw Error(fmt::format("the accessibility helper's {} is malformed: {}", what, problem));
}

// The answer as a JSON object, or the helper's own error.
json answer_object(std::string_view output, std::string_view what) {
  if (output.size() > kMaxAnswer)
    malformed(what, fmt::format("{} bytes, more than the {} allowed", output.size(), kMaxAnswer));
  if (text::trim(output).empty()) throw Error(fmt::format("the accessibility helper gave no {}", what));
  json doc = parse_json_or_discarded(output);
  if (doc.is_discarded()) malformed(what, "it is not JSON");
  if (!doc.is_object()) malformed(what, "it is not a JSON object");
  if (auto it = doc.find("error"); it != doc.end())
    throw Error(fmt::format("accessibility: {}", it->is_string() ? clean(it->get<std::string>(), 500) : shown(*it)));
  return doc;
}

bool flag(const json& node, const char* key, const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || !it->is_boolean()) throw Error(fmt::format("{}: {} is not true or false", where, key));
  return it->get<bool>();
}

std::string string_field(const json& node, const char* key, std::size_t max_chars, const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || !it->is_string()) throw Error(fmt::format("{}: {} is not a string", where, key));
  return clean(it->get_ref<const std::string&>(), max_chars);
}

int coordinate(const json& bounds, const char* key, int low, const std::string& where) {
  const auto it = bounds.find(key);
  if (it == bounds.end() || !it->is_number_integer() || it->get<std::int64_t>() < low ||
      it->get<std::int64_t>() > kMaxCoordinate)
    throw Error(fmt::format("{}: bounds.{} is not an integer from {} to {}", where, key, low, kMaxCoordinate));
  return static_cast<int>(it->get<std::int64_t>());
}

// One node, checked on its own (a snapshot checks its place among the others). `where` names it
// in errors.
Node parse_node(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(fmt::format("{} is not an object", where));
  Node n;
  const auto ref = j.find("ref");
  if (ref == j.end() || !ref->is_string() || !valid_ref(ref->get_ref<const std::string&>()))
    throw Error(fmt::format("{}: ref {} is not atspi: followed by child indices", where,
                            ref == j.end() ? "(none)" : shown(*ref)));
  n.ref = ref->get<std::string>();
  const std::size_t levels = ref_indices(n.ref)->size();
  const auto depth = j.find("depth");
  if (depth == j.end() || !depth->is_number_integer() || depth->get<std::int64_t>() != static_cast<std::int64_t>(levels) - 1)
    throw Error(fmt::format("{} ({}): depth {} does not match its ref (depth {})", where, n.ref,
                            depth == j.end() ? "(none)" : shown(*depth), levels - 1));
  n.depth = static_cast<int>(levels) - 1;
  // An application has no parent; anything below it has one of its ancestors (the application
  // and its first level are always kept).
  const auto parent = j.find("parent_ref");
  const bool has_parent = parent != j.end() && !parent->is_null();
  if (n.depth == 0 && has_parent)
    throw Error(fmt::format("{} ({}): an application has a parent_ref", where, n.ref));
  if (n.depth > 0) {
    if (!has_parent || !parent->is_string() || !valid_ref(parent->get_ref<const std::string&>()) ||
        !n.ref.starts_with(parent->get_ref<const std::string&>() + "/"))
      throw Error(fmt::format("{} ({}): parent_ref {} is not one of its ancestors", where, n.ref,
                              has_parent ? shown(*parent) : "(none)"));
    n.parent_ref = parent->get<std::string>();
  }
  n.role = string_field(j, "role", kMaxRole, where);
  n.name = string_field(j, "name", kMaxName, where);
  n.focused = flag(j, "focused", where);
  n.focusable = flag(j, "focusable", where);
  n.enabled = flag(j, "enabled", where);
  if (const auto b = j.find("bounds"); b != j.end() && !b->is_null()) {
    if (!b->is_object()) throw Error(fmt::format("{} ({}): bounds is not an object", where, n.ref));
    n.bounds = Bounds{coordinate(*b, "x", -kMaxCoordinate, where), coordinate(*b, "y", -kMaxCoordinate, where),
                      coordinate(*b, "width", 1, where), coordinate(*b, "height", 1, where)};
  }
  if (const auto a = j.find("actions"); a != j.end() && !a->is_null()) {
    if (!a->is_array() || a->size() > kMaxActions)
      throw Error(fmt::format("{} ({}): actions is not a list of at most {} names", where, n.ref, kMaxActions));
    for (const auto& action : *a) {
      if (!action.is_string()) throw Error(fmt::format("{} ({}): an action is not a string", where, n.ref));
      n.actions.push_back(clean(action.get_ref<const std::string&>(), kMaxRole));
    }
  }
  return n;
}

}  // namespace

std::vector<std::string> atspi_command() { return {"python3", "-c", std::string(kScript)}; }

bool valid_ref(std::string_view ref) { return ref_indices(ref).has_value(); }

Snapshot parse_snapshot(std::string_view output) {
  const json doc = answer_object(output, "snapshot");
  if (doc.value("format", json()) != std::string(kSnapshotFormat))
    malformed("snapshot", fmt::format("its format is not {}", kSnapshotFormat));
  Snapshot snap;
  const auto truncated = doc.find("truncated");
  if (truncated == doc.end() || !truncated->is_boolean()) malformed("snapshot", "truncated is not true or false");
  snap.truncated = truncated->get<bool>();
  const auto nodes = doc.find("nodes");
  if (nodes == doc.end() || !nodes->is_array()) malformed("snapshot", "nodes is not a list");
  if (nodes->size() > kMaxNodes) malformed("snapshot", fmt::format("{} nodes, more than {}", nodes->size(), kMaxNodes));
  std::set<std::string> seen;
  snap.nodes.reserve(nodes->size());
  try {
    for (std::size_t i = 0; i < nodes->size(); ++i) {
      const std::string where = fmt::format("node {}", i);
      Node n = parse_node((*nodes)[i], where);
      const std::vector<int> indices = *ref_indices(n.ref);
      if (indices[0] >= kMaxApps || std::any_of(indices.begin() + 1, indices.end(), [](int k) { return k >= kMaxChildren; }))
        throw Error(fmt::format("{} ({}): an index passes the limits ({} applications, {} children)", where, n.ref,
                                kMaxApps, kMaxChildren));
      if (!n.parent_ref.empty() && !seen.contains(n.parent_ref))
        throw Error(fmt::format("{} ({}): its parent {} is not listed before it", where, n.ref, n.parent_ref));
      if (!seen.insert(n.ref).second) throw Error(fmt::format("{}: ref {} is listed twice", where, n.ref));
      snap.nodes.push_back(std::move(n));
    }
  } catch (const Error& e) {
    malformed("snapshot", e.what());
  }
  return snap;
}

Node parse_element(std::string_view output) {
  const json doc = answer_object(output, "element");
  try {
    return parse_node(doc, "the element");
  } catch (const Error& e) {
    malformed("element", e.what());
  }
}

void parse_action(std::string_view output) {
  const json doc = answer_object(output, "action answer");
  if (doc.value("ok", json()) != true) malformed("action answer", "it does not say ok");
}

nlohmann::json snapshot_json(const Snapshot& snapshot) {
  json elements = json::array();
  for (const Node& n : snapshot.nodes) {
    json e = {{"ref", n.ref},
              {"parent_ref", n.parent_ref.empty() ? json() : json(n.parent_ref)},
              {"role", n.role},
              {"name", n.name},
              {"focused", n.focused},
              {"focusable", n.focusable},
              {"enabled", n.enabled}};
    if (n.bounds)
      e["bounds"] = {{"x", n.bounds->x}, {"y", n.bounds->y}, {"width", n.bounds->width}, {"height", n.bounds->height}};
    if (!n.actions.empty()) e["actions"] = n.actions;
    elements.push_back(std::move(e));
  }
  return {{"format", std::string(kSnapshotFormat)},
          {"truncated", snapshot.truncated},
          {"snapshot", snapshot_text(snapshot)},
          {"elements", std::move(elements)}};
}

std::string snapshot_text(const Snapshot& snapshot) {
  std::string out;
  for (const Node& n : snapshot.nodes) {
    if (!out.empty()) out += '\n';
    out.append(2 * static_cast<std::size_t>(std::clamp(n.depth, 0, kMaxDepth)), ' ');
    out += "- " + n.role;
    if (!n.name.empty()) {
      // Quoted as the seed does; a quote or backslash in the name escaped so the line stays one.
      out += " \"";
      for (char c : n.name) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
      }
      out += '"';
    }
    out += " [ref=" + n.ref;
    if (n.bounds) out += fmt::format(" bounds={},{},{},{}", n.bounds->x, n.bounds->y, n.bounds->width, n.bounds->height);
    if (n.focused) out += " focused";
    if (!n.actions.empty()) {
      out += " actions=";
      for (std::size_t i = 0; i < n.actions.size(); ++i) out += (i ? "," : "") + n.actions[i];
    }
    out += ']';
  }
  return out;
}

}  // namespace nshpc::desktop
