// A job's mode and state: enums everywhere, their names (on disk, in tool results, in the audit
// log) defined once, in record.cpp.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace nshpc::jobs {

// Where a job runs: this machine (sandboxes under the server) or the Slurm cluster.
enum class Mode { local, slurm };

// One vocabulary for both modes: out_of_memory (killed at its memory limit) and output_limit (a
// file, stdout/stderr included, reached the output limit) for local jobs too; node_fail and
// preempted come only from Slurm.
enum class State {
  pending, running, completed, failed, cancelled, timed_out, lost, out_of_memory, node_fail, preempted, output_limit
};

// Their names (on disk, in tool results, in the audit log), as JSON: an unknown mode reads as
// local, an unknown state as lost (record.cpp).
void to_json(nlohmann::json& out, const Mode& mode);
void from_json(const nlohmann::json& in, Mode& mode);
void to_json(nlohmann::json& out, const State& state);
void from_json(const nlohmann::json& in, State& state);

std::string to_string(State state);
std::string to_string(Mode mode);
// nullopt for a name that is none of the above.
std::optional<State> parse_state(std::string_view text);
std::optional<Mode> parse_mode(std::string_view text);
bool is_final(State state);

}  // namespace nshpc::jobs
