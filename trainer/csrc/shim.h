// Shared by the shim's files: tensors cross the C boundary as tch's `at::Tensor*`, a new tensor
// goes back as a heap `at::Tensor` that tch then owns, and every function catches C++
// exceptions and copies the message into the caller's buffer, so none crosses into Rust.
#pragma once
#include <ATen/ATen.h>
#include <cstring>
#include <exception>
#include <string>

inline void trainer_copy_error(const std::string& message, char* error, size_t error_len) {
    if (error == nullptr || error_len == 0) return;
    size_t length = std::min(message.size(), error_len - 1);
    std::memcpy(error, message.data(), length);
    error[length] = '\0';
}

// Runs `work`; on an exception, writes its message and returns -1.
template <typename Work>
int trainer_guard(char* error, size_t error_len, Work&& work) {
    try {
        work();
        return 0;
    } catch (const std::exception& exception) {
        trainer_copy_error(exception.what(), error, error_len);
    } catch (...) {
        trainer_copy_error("unknown C++ exception", error, error_len);
    }
    return -1;
}
