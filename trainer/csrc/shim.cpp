// What tch 0.24 does not expose: autocast for any device type and dtype (tch's is CUDA and
// fp16 only), and the CUDA caching allocator's statistics (through c10's device-allocator
// interface, so no CUDA header or library is needed to build it). Plain C functions; every call
// catches C++ exceptions so none crosses into Rust.
#include <ATen/autocast_mode.h>
#include <c10/core/CachingDeviceAllocator.h>

static at::DeviceType device_type(int device) { return device == 1 ? at::kCUDA : at::kCPU; }

extern "C" {

// dtype: 0 = bfloat16, 1 = float16. Returns 0 on success.
int trainer_autocast_set(int device, int enabled, int dtype) {
    try {
        auto type = device_type(device);
        at::autocast::set_autocast_dtype(type, dtype == 1 ? at::kHalf : at::kBFloat16);
        at::autocast::set_autocast_enabled(type, enabled != 0);
        if (enabled) {
            at::autocast::increment_nesting();
        } else if (at::autocast::decrement_nesting() == 0) {
            at::autocast::clear_cache();
        }
        return 0;
    } catch (...) {
        return -1;
    }
}

int trainer_autocast_enabled(int device) {
    try {
        return at::autocast::is_autocast_enabled(device_type(device)) ? 1 : 0;
    } catch (...) {
        return -1;
    }
}

// Peak bytes allocated on a CUDA device since the last reset; -1 when unavailable.
long long trainer_cuda_peak_allocated(int device) {
    try {
        auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(static_cast<c10::DeviceIndex>(device));
        return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    } catch (...) {
        return -1;
    }
}

int trainer_cuda_reset_peak(int device) {
    try {
        c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(device));
        return 0;
    } catch (...) {
        return -1;
    }
}

int trainer_cuda_empty_cache() {
    try {
        c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache();
        return 0;
    } catch (...) {
        return -1;
    }
}

}
