// The target that builds the tests' precompiled header (precompiled.hpp):
// it needs one file of its own; main() comes from support/main.cpp.
