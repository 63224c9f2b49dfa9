// Boost.JSON's and Boost.Beast's implementations, compiled once for the
// whole build (the debug endpoint's only users), like asio_impl.cpp.
#include <boost/beast/src.hpp>
#include <boost/json/src.hpp>
