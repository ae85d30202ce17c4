// XML of WebDAV request bodies: parsed with expat in namespace mode into a small tree (the bodies
// are small: the caller caps them), and written back with every namespace declared where it is
// used, so a client's prefixes are never echoed without their declaration.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nshpc::dav::xml {

struct Name {
  std::string ns;     // namespace URI ("" for none)
  std::string local;
  bool operator==(const Name&) const = default;
  bool operator<(const Name& o) const { return ns != o.ns ? ns < o.ns : local < o.local; }
};

struct Element {
  Name name;
  std::vector<std::pair<Name, std::string>> attributes;
  std::vector<std::unique_ptr<Element>> children;  // elements, in order
  // Text and elements in document order: a text run is an entry with child == nullptr.
  struct Part {
    const Element* child = nullptr;
    std::string text;
  };
  std::vector<Part> content;
  std::string lang;  // xml:lang in scope ("" none)

  const Element* find(std::string_view ns, std::string_view local) const;
  bool is(std::string_view ns, std::string_view local) const { return name.ns == ns && name.local == local; }
  std::string text() const;  // the concatenated text of this element (not of children)
};

// Parses a whole document. Throws std::runtime_error with expat's message (and the line) when it
// is not well-formed or not namespace-well-formed, or deeper than `max_depth`. Never loads an
// external entity; an internal DTD subset is refused (no entity expansion at all).
std::unique_ptr<Element> parse(std::string_view document, std::size_t max_depth = 64);

// Escapes text for element content and attribute values.
std::string escape(std::string_view text);

// The content of `element` (its text and child elements) as XML, each namespace declared on the
// element that uses it. What PROPPATCH stores and PROPFIND returns.
std::string inner_xml(const Element& element);

// `<p:local xmlns:p="ns">inner</p:local>` with a fresh prefix (or `<local xmlns="">` without a
// namespace); empty `inner` gives a self-closing element.
std::string element_xml(const Name& name, std::string_view inner, std::string_view lang = {});

}  // namespace nshpc::dav::xml
