#include "cli/app.hpp"

int main(int argc, char** argv) { return nshpc::cli::main(argc, argv); }
