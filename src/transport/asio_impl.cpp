// Boost.Asio and Boost.Beast compiled once (BOOST_ASIO_SEPARATE_COMPILATION,
// BOOST_BEAST_SEPARATE_COMPILATION): the transports include only their declarations, which keeps
// their rebuilds fast.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
