// The tool-declaration helpers of src/tools (tools/internal.hpp): what they publish, key by key.
#include <gtest/gtest.h>

#include "config/config.hpp"
#include "tools/internal.hpp"

namespace tools = nshpc::tools;
using nshpc::mcp::json;

TEST(ToolSpec, ReadOnlyHintsLeaveOutDestructiveAndIdempotent) {
  EXPECT_EQ(tools::annotations({.read_only = true}), (json{{"readOnlyHint", true}, {"openWorldHint", false}}));
}

// Only what differs from MCP's defaults (readOnlyHint false, destructiveHint true,
// idempotentHint false, openWorldHint true) is published.
TEST(ToolSpec, HintsPublishWhatDiffersFromTheDefaults) {
  EXPECT_EQ(tools::annotations({.destructive = true, .idempotent = false, .open_world = true}), json::object());
  EXPECT_EQ(tools::annotations({.destructive = false}), (json{{"destructiveHint", false}, {"openWorldHint", false}}));
  EXPECT_EQ(tools::annotations({.destructive = true, .idempotent = true}),
            (json{{"idempotentHint", true}, {"openWorldHint", false}}));
  EXPECT_EQ(tools::annotations({}), (json{{"openWorldHint", false}}));
}

TEST(ToolSpec, InputObjectIsClosedAndOmitsAnEmptyRequired) {
  const json none = tools::input_object(json::object());
  EXPECT_EQ(none, (json{{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}}));
  const json one = tools::input_object({{"a", tools::of_type("string")}}, {"a"});
  EXPECT_EQ(one["required"], json::array({"a"}));
  EXPECT_EQ(one["properties"]["a"], (json{{"type", "string"}}));
}

TEST(ToolSpec, InstanceInputRequiresInstanceIdOnlyWithoutADefault) {
  nshpc::config::Config cfg;
  const json without = tools::instance_input(cfg, {{"job_id", tools::of_type("string")}}, {"job_id"});
  EXPECT_EQ(without["required"], json::array({"instance_id", "job_id"}));
  // Described the same in every tool.
  EXPECT_EQ(without["properties"]["instance_id"],
            (json{{"type", "string"}, {"description", "Instance id."}}));

  cfg.mcp.default_instance = "dflt";
  const json with = tools::instance_input(cfg, json::object());
  EXPECT_FALSE(with.contains("required"));
  EXPECT_EQ(with["properties"]["instance_id"]["description"], "Instance id. Default: 'dflt'.");
}

TEST(ToolSpec, OutputObjectIsOpenWithItsRequired) {
  EXPECT_EQ(tools::output_object({{"n", tools::of_type("integer")}}, {"n"}),
            (json{{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}, {"required", {"n"}}}));
}

// What `ns-hpc run` publishes as a tool's outputSchema: an object and the fields always there.
TEST(ToolSpec, ResultObjectIsAnObjectWithItsRequiredFieldsOnly) {
  EXPECT_EQ(tools::result_object({"id", "network"}), (json{{"type", "object"}, {"required", {"id", "network"}}}));
}

TEST(ToolSpec, StringArgIsEmptyWhenAbsentOrNotAString) {
  const json args = {{"s", "x"}, {"n", 3}};
  EXPECT_EQ(tools::string_arg(args, "s"), "x");
  EXPECT_EQ(tools::string_arg(args, "n"), "");
  EXPECT_EQ(tools::string_arg(args, "missing"), "");
}
