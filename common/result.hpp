// result<T, E>: a value or an error, returned across layers instead of exceptions (C++20 has no
// std::expected).
#pragma once

#include <cassert>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace vcuda {

template <class E>
struct unexpected {
    E error;
};
template <class E>
unexpected(E) -> unexpected<E>;

template <class T, class E>
class [[nodiscard]] result {
  public:
    result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
    result(unexpected<E> e) : v_(std::in_place_index<1>, std::move(e.error)) {}

    bool has_value() const noexcept { return v_.index() == 0; }
    explicit operator bool() const noexcept { return has_value(); }
    T& value() & { return std::get<0>(v_); }
    const T& value() const& { return std::get<0>(v_); }
    T&& value() && { return std::get<0>(std::move(v_)); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    const E& error() const { return std::get<1>(v_); }

  private:
    std::variant<T, E> v_;
};

template <class E>
class [[nodiscard]] result<void, E> {
  public:
    result() = default;
    result(unexpected<E> e) : err_(std::move(e.error)), ok_(false) {}
    bool has_value() const noexcept { return ok_; }
    explicit operator bool() const noexcept { return ok_; }
    const E& error() const { return err_; }

  private:
    E err_{};
    bool ok_ = true;
};

}  // namespace vcuda
