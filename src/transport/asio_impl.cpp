// Boost.Asio compiled once (BOOST_ASIO_SEPARATE_COMPILATION): the transports include only its
// declarations, which keeps their rebuilds fast.
#include <boost/asio/impl/src.hpp>
