#pragma once
// `hone env`: the build and the machine in a few lines, for bug reports and for checking
// that a GPU is usable before a long run.

namespace hone::cli {

// Prints the report to stdout; returns the process exit code (0).
int env_command();

}  // namespace hone::cli
