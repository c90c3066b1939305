// What tch 0.24 does not expose, for one device: autocast for any device type and dtype (tch's
// is CUDA and fp16 only), TF32, the CUDA caching allocator's statistics, page-locked batches
// without the deprecated `pin_memory(device)`, host-to-device and device-to-host copies on a side stream, and
// gradient clipping and fp16 unscaling with multi-tensor kernels and no host sync. CUDA is
// reached only through c10's device-generic interfaces (allocator, guard, stream, event), so
// no CUDA header or library is needed to build it and a CPU machine runs it.
#include "shim.h"

#include <ATen/autocast_mode.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <optional>
#include <vector>

static at::DeviceType device_type(int device) { return device == 1 ? at::kCUDA : at::kCPU; }

extern "C" {

// dtype: 0 = bfloat16, 1 = float16. Returns 0 on success.
int trainer_autocast_set(int device, int enabled, int dtype) {
    return trainer_guard(nullptr, 0, [&] {
        auto type = device_type(device);
        at::autocast::set_autocast_dtype(type, dtype == 1 ? at::kHalf : at::kBFloat16);
        at::autocast::set_autocast_enabled(type, enabled != 0);
        if (enabled) {
            at::autocast::increment_nesting();
        } else if (at::autocast::decrement_nesting() == 0) {
            at::autocast::clear_cache();
        }
    });
}

int trainer_autocast_enabled(int device) {
    try {
        return at::autocast::is_autocast_enabled(device_type(device)) ? 1 : 0;
    } catch (...) {
        return -1;
    }
}

// TF32 for CUDA matmuls and convolutions (torch.backends.cuda.matmul.fp32_precision and
// torch.backends.cudnn.conv.fp32_precision), or full fp32 ("ieee").
int trainer_set_tf32(int enabled) {
    return trainer_guard(nullptr, 0, [&] {
        auto precision = enabled ? at::Float32Precision::TF32 : at::Float32Precision::IEEE;
        at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, precision);
        at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, precision);
    });
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
    return trainer_guard(nullptr, 0, [&] {
        c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(device));
    });
}

int trainer_cuda_empty_cache() {
    return trainer_guard(nullptr, 0, [] { c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache(); });
}

// Makes CUDA device `index` current for this thread (allocations and NCCL follow it).
int trainer_cuda_set_device(int index, char* error, size_t error_len) {
    return trainer_guard(error, error_len, [&] {
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
            ->setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
    });
}

// An uninitialised page-locked host tensor shaped and typed like `like` but with `rows` rows:
// the loader gathers a batch straight into it (one host copy), and a copy from it to the GPU
// can be asynchronous. Allocated by the accelerator's caching host allocator, which also keeps
// a block from reuse until the copies reading it have finished.
at::Tensor* trainer_empty_pinned(const at::Tensor* like, int64_t rows, char* error, size_t error_len) {
    at::Tensor* result = nullptr;
    trainer_guard(error, error_len, [&] {
        auto sizes = like->sizes().vec();
        sizes[0] = rows;
        result = new at::Tensor(at::empty(sizes, like->options().device(at::kCPU).pinned_memory(true)));
    });
    return result;
}

// An asynchronous host-to-device copy on a side stream of the device, so it overlaps with the
// compute stream's work. The returned event (free it with trainer_h2d_wait) marks its end.
struct TrainerCopy {
    c10::Event done{c10::DeviceType::CUDA};
    c10::Stream side_stream;
};

void* trainer_h2d_start(const at::Tensor* source, int device, at::Tensor** out, char* error, size_t error_len) {
    TrainerCopy* copy = nullptr;
    trainer_guard(error, error_len, [&] {
        c10::Device target(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
        auto guard_impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
        // One side stream per thread, from the pool torch keeps per device.
        thread_local std::optional<c10::Stream> side;
        if (!side || side->device() != target) side = guard_impl->getStreamFromGlobalPool(target, false);
        auto tensor = std::make_unique<at::Tensor>();
        {
            c10::StreamGuard on_side(*side);
            *tensor = source->to(target, /*non_blocking=*/true);
        }
        copy = new TrainerCopy{c10::Event(c10::DeviceType::CUDA), *side};
        copy->done.record(*side);
        *out = tensor.release();
    });
    return copy;
}

// Makes the current (compute) stream wait for the copy, and tells the caching allocator the
// tensor is now used there, so its memory is not handed out again while compute reads it.
int trainer_h2d_wait(void* handle, const at::Tensor* tensor, char* error, size_t error_len) {
    auto* copy = static_cast<TrainerCopy*>(handle);
    int status = trainer_guard(error, error_len, [&] {
        auto guard_impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
        auto compute = guard_impl->getStream(tensor->device());
        copy->done.block(compute);
        guard_impl->recordDataPtrOnStream(tensor->storage().data_ptr(), compute);
    });
    delete copy;
    return status;
}

// Copies `count` tensors to page-locked host memory on a side stream and waits for them there,
// so that only the calling thread (the checkpoint writer) waits. A plain copy from that thread
// would run on the device's default stream, which training also uses, and stall training for
// the whole copy into pageable memory. The side stream first waits for the work already queued
// on the default stream (the snapshot's device-to-device copies among it). Host tensors are
// returned contiguous, as they are.
int trainer_d2h_pinned(const at::Tensor** sources, int count, at::Tensor** outs, char* error, size_t error_len) {
    for (int index = 0; index < count; ++index) outs[index] = nullptr;
    std::vector<at::Tensor> copies(count);
    int status = trainer_guard(error, error_len, [&] {
        std::optional<c10::Stream> side;
        for (int index = 0; index < count; ++index) {
            const at::Tensor& source = *sources[index];
            if (!source.is_cuda()) {
                copies[index] = source.contiguous();
                continue;
            }
            auto guard_impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
            if (!side || side->device() != source.device()) {
                if (side) side->synchronize();
                side = guard_impl->getStreamFromGlobalPool(source.device(), false);
                c10::Event queued(c10::DeviceType::CUDA);
                queued.record(guard_impl->getStream(source.device()));
                queued.block(*side);
            }
            c10::StreamGuard on_side(*side);
            copies[index] = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(true));
            copies[index].copy_(source, /*non_blocking=*/true);
        }
        if (side) side->synchronize();
    });
    if (status == 0) {
        for (int index = 0; index < count; ++index) outs[index] = new at::Tensor(std::move(copies[index]));
    }
    return status;
}

// Clips the global L2 norm of `count` gradients to `max_norm` as torch.nn.utils.clip_grad_norm_
// does: the scale factor stays a device tensor (clamped to 1), so there is no host sync.
int trainer_clip_grad_norm(at::Tensor** params, int count, double max_norm, char* error, size_t error_len) {
    return trainer_guard(error, error_len, [&] {
        std::vector<at::Tensor> grads;
        for (int index = 0; index < count; ++index) {
            auto grad = params[index]->grad();
            if (grad.defined()) grads.push_back(grad);
        }
        if (grads.empty()) return;
        auto norms = at::_foreach_norm(grads, 2);
        auto total = at::linalg_vector_norm(at::stack(norms), 2);
        auto factor = at::clamp_max(max_norm / (total + 1e-6), 1.0);
        at::_foreach_mul_(grads, factor);
    });
}

// fp16 loss scaling: multiplies every gradient by `inv_scale` and sets *found_inf when any holds
// an inf or NaN, in one multi-tensor kernel; reading the flag is the step's one host sync
// (torch's GradScaler has the same one).
int trainer_unscale_grads(at::Tensor** params, int count, double inv_scale, int* found_inf, char* error,
                          size_t error_len) {
    return trainer_guard(error, error_len, [&] {
        std::vector<at::Tensor> grads;
        for (int index = 0; index < count; ++index) {
            auto grad = params[index]->grad();
            if (grad.defined()) grads.push_back(grad);
        }
        *found_inf = 0;
        if (grads.empty()) return;
        auto options = grads[0].options().dtype(at::kFloat);
        auto flag = at::zeros({1}, options);
        auto inverse = at::full({1}, inv_scale, options);
        at::_amp_foreach_non_finite_check_and_unscale_(grads, flag, inverse);
        *found_inf = flag.item<float>() != 0.0f ? 1 : 0;
    });
}

// OpenMP threads of the calling thread only (each thread has its own setting): a loader thread
// gathers with one, so loader threads do not multiply the cores in use.
int trainer_set_thread_omp_threads(int threads) {
    using SetThreads = void (*)(int);
    auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (set == nullptr) return -1;
    set(threads);
    return 0;
}

}
