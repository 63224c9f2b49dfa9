// The target that builds the libraries' precompiled header (precompiled.hpp)
// needs one file of its own; it compiles to nothing.
