// Boost.Asio's implementation, compiled once for the whole build.
//
// Every target links kvstrand_common and sees BOOST_ASIO_SEPARATE_COMPILATION,
// so the other translation units include only Asio's declarations; this keeps
// a clean build of the tree (three times over, with the sanitizers) short on
// a 2-core machine.
#include <boost/asio/impl/src.hpp>
