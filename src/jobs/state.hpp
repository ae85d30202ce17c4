// A job's mode and state: enums everywhere, their names (on disk, in tool results, in the audit
// log) defined once here for nlohmann-json.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace nshpc::jobs {

// Where a job runs: this machine (sandboxes under the server) or the Slurm cluster.
enum class Mode { local, slurm };

// One vocabulary for both modes: out_of_memory (killed at its memory limit) and output_limit (a
// file, stdout/stderr included, reached the output limit) for local jobs too; node_fail and
// preempted come only from Slurm.
enum class State {
  pending, running, completed, failed, cancelled, timed_out, lost, out_of_memory, node_fail, preempted, output_limit
};

// The first pair is what an unknown name reads as: an unknown mode runs locally, an unknown
// state is lost.
NLOHMANN_JSON_SERIALIZE_ENUM(Mode, {{Mode::local, "local"}, {Mode::slurm, "slurm"}})
NLOHMANN_JSON_SERIALIZE_ENUM(State, {{State::lost, "lost"},
                                     {State::pending, "pending"},
                                     {State::running, "running"},
                                     {State::completed, "completed"},
                                     {State::failed, "failed"},
                                     {State::cancelled, "cancelled"},
                                     {State::timed_out, "timed_out"},
                                     {State::out_of_memory, "out_of_memory"},
                                     {State::node_fail, "node_fail"},
                                     {State::preempted, "preempted"},
                                     {State::output_limit, "output_limit"}})

std::string to_string(State state);
std::string to_string(Mode mode);
// nullopt for a name that is none of the above.
std::optional<State> parse_state(std::string_view text);
std::optional<Mode> parse_mode(std::string_view text);
bool is_final(State state);

}  // namespace nshpc::jobs
