// The one translation unit that compiles fmt itself (the rest include only its declarations), so
// the formatting engine is generated once and the binary needs no libfmt.so at run time.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {

// What fmt/format.h declares `extern template` when it is not header-only.
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto thousands_sep_impl<wchar_t>(locale_ref) -> thousands_sep_result<wchar_t>;
template auto decimal_point_impl(locale_ref) -> char;
template auto decimal_point_impl(locale_ref) -> wchar_t;

}  // namespace detail
FMT_END_NAMESPACE
