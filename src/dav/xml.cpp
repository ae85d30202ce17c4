// Parsing and writing the XML of WebDAV bodies (see xml.hpp).
#include "dav/xml.hpp"

#include <expat.h>

#include <stdexcept>

#include <fmt/format.h>

namespace nshpc::dav::xml {

namespace {

constexpr char kSeparator = '\x01';  // between namespace and local name (never in either)
constexpr std::string_view kXmlNs = "http://www.w3.org/XML/1998/namespace";

Name split(const XML_Char* raw) {
  std::string_view s(raw);
  const auto at = s.find(kSeparator);
  if (at == std::string_view::npos) return {"", std::string(s)};
  return {std::string(s.substr(0, at)), std::string(s.substr(at + 1))};
}

struct Builder {
  XML_Parser parser = nullptr;
  std::unique_ptr<Element> root;
  std::vector<Element*> stack;
  std::size_t max_depth = 64;
  std::string error;

  void stop(std::string why) {
    if (error.empty()) error = std::move(why);
    XML_StopParser(parser, XML_FALSE);
  }

  static void on_start(void* data, const XML_Char* name, const XML_Char** attrs) {
    auto* self = static_cast<Builder*>(data);
    if (self->stack.size() >= self->max_depth) return self->stop(fmt::format("elements nested deeper than {}", self->max_depth));
    auto element = std::make_unique<Element>();
    element->name = split(name);
    if (!self->stack.empty()) element->lang = self->stack.back()->lang;
    for (int i = 0; attrs[i] && attrs[i + 1]; i += 2) {
      Name attr = split(attrs[i]);
      if (attr.ns == kXmlNs && attr.local == "lang") element->lang = attrs[i + 1];
      else element->attributes.emplace_back(std::move(attr), attrs[i + 1]);
    }
    Element* raw = element.get();
    if (self->stack.empty()) {
      self->root = std::move(element);
    } else {
      Element* parent = self->stack.back();
      parent->content.push_back({raw, {}});
      parent->children.push_back(std::move(element));
    }
    self->stack.push_back(raw);
  }
  static void on_end(void* data, const XML_Char*) {
    auto* self = static_cast<Builder*>(data);
    if (!self->stack.empty()) self->stack.pop_back();
  }
  static void on_text(void* data, const XML_Char* text, int len) {
    auto* self = static_cast<Builder*>(data);
    if (self->stack.empty()) return;
    Element* e = self->stack.back();
    if (!e->content.empty() && !e->content.back().child) e->content.back().text.append(text, static_cast<std::size_t>(len));
    else e->content.push_back({nullptr, std::string(text, static_cast<std::size_t>(len))});
  }
  static void on_doctype(void* data, const XML_Char*, const XML_Char*, const XML_Char*, int) {
    static_cast<Builder*>(data)->stop("a DOCTYPE is not accepted in WebDAV bodies");
  }
  static void on_entity(void* data, const XML_Char*, int, const XML_Char*, int, const XML_Char*, const XML_Char*,
                        const XML_Char*, const XML_Char*) {
    static_cast<Builder*>(data)->stop("entity declarations are not accepted");
  }
};

struct ParserCloser {
  void operator()(XML_Parser p) const { XML_ParserFree(p); }
};

}  // namespace

const Element* Element::find(std::string_view ns, std::string_view local) const {
  for (const auto& child : children)
    if (child->is(ns, local)) return child.get();
  return nullptr;
}

std::string Element::text() const {
  std::string out;
  for (const Part& p : content)
    if (!p.child) out += p.text;
  return out;
}

std::unique_ptr<Element> parse(std::string_view document, std::size_t max_depth) {
  std::unique_ptr<std::remove_pointer_t<XML_Parser>, ParserCloser> parser(XML_ParserCreateNS("UTF-8", kSeparator));
  if (!parser) throw std::runtime_error("out of memory creating the XML parser");
  Builder builder;
  builder.parser = parser.get();
  builder.max_depth = max_depth;
  XML_SetUserData(parser.get(), &builder);
  XML_SetElementHandler(parser.get(), &Builder::on_start, &Builder::on_end);
  XML_SetCharacterDataHandler(parser.get(), &Builder::on_text);
  XML_SetStartDoctypeDeclHandler(parser.get(), &Builder::on_doctype);
  XML_SetEntityDeclHandler(parser.get(), &Builder::on_entity);
  XML_SetParamEntityParsing(parser.get(), XML_PARAM_ENTITY_PARSING_NEVER);
  const auto status = XML_Parse(parser.get(), document.data(), static_cast<int>(document.size()), XML_TRUE);
  if (!builder.error.empty()) throw std::runtime_error(fmt::format("invalid XML body: {}", builder.error));
  if (status != XML_STATUS_OK)
    throw std::runtime_error(fmt::format("invalid XML body: {} at line {}", XML_ErrorString(XML_GetErrorCode(parser.get())),
                                         XML_GetCurrentLineNumber(parser.get())));
  if (!builder.root) throw std::runtime_error("invalid XML body: no root element");
  return std::move(builder.root);
}

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\r': out += "&#13;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

void write_element(const Element& e, std::string& out, int& counter, std::string_view inherited_lang) {
  const std::string prefix = e.name.ns.empty() ? std::string() : fmt::format("x{}", counter++);
  const std::string tag = prefix.empty() ? e.name.local : prefix + ":" + e.name.local;
  out += "<" + tag;
  out += prefix.empty() ? std::string(" xmlns=\"\"") : fmt::format(" xmlns:{}=\"{}\"", prefix, escape(e.name.ns));
  if (!e.lang.empty() && e.lang != inherited_lang) out += fmt::format(" xml:lang=\"{}\"", escape(e.lang));
  for (const auto& [name, value] : e.attributes) {
    if (name.ns.empty()) {
      out += fmt::format(" {}=\"{}\"", name.local, escape(value));
    } else {
      const std::string p = fmt::format("x{}", counter++);
      out += fmt::format(" xmlns:{}=\"{}\" {}:{}=\"{}\"", p, escape(name.ns), p, name.local, escape(value));
    }
  }
  if (e.content.empty()) {
    out += "/>";
    return;
  }
  out += ">";
  for (const Element::Part& part : e.content) {
    if (part.child) write_element(*part.child, out, counter, e.lang);
    else out += escape(part.text);
  }
  out += "</" + tag + ">";
}

}  // namespace

std::string inner_xml(const Element& element) {
  std::string out;
  int counter = 0;
  for (const Element::Part& part : element.content) {
    if (part.child) write_element(*part.child, out, counter, element.lang);
    else out += escape(part.text);
  }
  return out;
}

std::string element_xml(const Name& name, std::string_view inner, std::string_view lang) {
  std::string open;
  std::string tag;
  if (name.ns.empty()) {
    tag = name.local;
    open = tag + " xmlns=\"\"";
  } else if (name.ns == "DAV:") {
    tag = "D:" + name.local;
    open = tag;
  } else {
    tag = "P:" + name.local;
    open = fmt::format("{} xmlns:P=\"{}\"", tag, escape(name.ns));
  }
  if (!lang.empty()) open += fmt::format(" xml:lang=\"{}\"", escape(lang));
  if (inner.empty()) return "<" + open + "/>";
  return "<" + open + ">" + std::string(inner) + "</" + tag + ">";
}

}  // namespace nshpc::dav::xml
