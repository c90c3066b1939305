// Data parallelism over libtorch's c10d, one process per device, as PyTorch's
// DistributedDataParallel does it: a TCPStore rendezvous at MASTER_ADDR:MASTER_PORT, a
// process group with Gloo (CPU) or NCCL (CUDA), and c10d's own Reducer, which buckets the
// gradients and all-reduces each bucket from autograd hooks as soon as backward has produced
// it, so communication overlaps with the rest of backward.
//
// The wheel ships the c10d headers but not gloo's or NCCL's/CUDA's, which ProcessGroupGloo.hpp
// and ProcessGroupNCCL.hpp include. The two backends are therefore created through their
// exported constructors, looked up by mangled name at run time (libtorch_cuda.so is loaded
// with RTLD_GLOBAL by the Rust side before NCCL is asked for, and linking it directly would
// stop the binary from starting where CUDA is absent), in memory reserved well above their
// size, and then used only through the `c10d::Backend` interface, whose header we have.
#include "shim.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <dlfcn.h>

namespace gloo::transport {
class Device;
}

namespace {

using OptionsPtr = c10::intrusive_ptr<c10d::Backend::Options>;
using BackendPtr = c10::intrusive_ptr<c10d::Backend>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;
using GlooDevice = std::shared_ptr<gloo::transport::Device>;

// In torch 2.11 ProcessGroupGloo is 488 bytes, ProcessGroupNCCL 1,112 and its Options 248
// (read from their deleting destructors); the reserves leave a wide margin for other builds.
constexpr size_t kBackendReserve = 16384;
constexpr size_t kOptionsReserve = 4096;
// PyTorch's DDP: a small first bucket, so the last layers' gradients start travelling early.
constexpr int64_t kFirstBucketBytes = 1 << 20;

// ProcessGroupGloo::Options: the devices and thread count that follow its Backend::Options base.
struct GlooOptionsLayout : c10d::Backend::Options {
    std::vector<GlooDevice> devices;
    int threads;
};

template <typename Function>
Function exported(const char* name) {
    void* address = dlsym(RTLD_DEFAULT, name);
    TORCH_CHECK(address != nullptr, "libtorch lacks ", name, " (this trainer is built for torch 2.11)");
    return reinterpret_cast<Function>(address);
}

// Runs an exported constructor on fresh zeroed memory and takes ownership as `Base`; the
// object is freed by its own virtual destructor when the last reference goes.
template <typename Base, typename Construct>
c10::intrusive_ptr<Base> construct(size_t reserve, Construct&& construct_at) {
    void* memory = ::operator new(reserve);
    std::memset(memory, 0, reserve);
    try {
        construct_at(memory);
    } catch (...) {
        ::operator delete(memory);
        throw;
    }
    return c10::intrusive_ptr<Base>::unsafe_steal_from_new(static_cast<Base*>(memory));
}

bool is_loopback(const std::string& address) {
    return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

BackendPtr make_gloo(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout,
                     const std::string& master_addr) {
    using OptionsConstructor = void (*)(void*, std::chrono::milliseconds);
    using DeviceFor = GlooDevice (*)(const std::string&, bool);
    using DefaultDevice = GlooDevice (*)(bool);
    using Constructor = void (*)(void*, const StorePtr&, int, int, OptionsPtr);
    auto options = construct<c10d::Backend::Options>(kOptionsReserve, [&](void* memory) {
        exported<OptionsConstructor>(
            "_ZN4c10d16ProcessGroupGloo7OptionsC1ENSt6chrono8durationIlSt5ratioILl1ELl1000EEEE")(memory, timeout);
    });
    auto* layout = static_cast<GlooOptionsLayout*>(options.get());
    // As torch.distributed: GLOO_SOCKET_IFNAME names the interface; else the loopback for a
    // loopback rendezvous, else the address this machine's host name resolves to.
    const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
    if (interface != nullptr && *interface != '\0') {
        layout->devices.push_back(exported<DeviceFor>(
            "_ZN4c10d16ProcessGroupGloo24createDeviceForInterfaceERKNSt7__cxx1112basic_stringIcSt11char_"
            "traitsIcESaIcEEEb")(interface, false));
    } else if (is_loopback(master_addr)) {
        layout->devices.push_back(exported<DeviceFor>(
            "_ZN4c10d16ProcessGroupGloo23createDeviceForHostnameERKNSt7__cxx1112basic_stringIcSt11char_"
            "traitsIcESaIcEEEb")("127.0.0.1", false));
    } else {
        layout->devices.push_back(exported<DefaultDevice>("_ZN4c10d16ProcessGroupGloo19createDefaultDeviceEb")(false));
    }
    layout->threads = 2;
    return construct<c10d::Backend>(kBackendReserve, [&](void* memory) {
        exported<Constructor>(
            "_ZN4c10d16ProcessGroupGlooC1ERKN3c1013intrusive_ptrINS_5StoreENS1_6detail34intrusive_target_default_"
            "null_typeIS3_EEEEiiNS2_INS0_7OptionsENS5_ISA_EEEE")(memory, store, rank, size, options);
    });
}

BackendPtr make_nccl(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout) {
    using OptionsConstructor = void (*)(void*, bool);
    using Constructor = void (*)(void*, StorePtr, int, int, OptionsPtr);
    auto options = construct<c10d::Backend::Options>(kOptionsReserve, [&](void* memory) {
        exported<OptionsConstructor>("_ZN4c10d16ProcessGroupNCCL7OptionsC1Eb")(memory, false);
    });
    options->timeout = timeout;
    return construct<c10d::Backend>(kBackendReserve, [&](void* memory) {
        exported<Constructor>(
            "_ZN4c10d16ProcessGroupNCCLC1EN3c1013intrusive_ptrINS_5StoreENS1_6detail34intrusive_target_default_"
            "null_typeIS3_EEEEiiNS2_INS0_7OptionsENS5_IS8_EEEE")(memory, store, rank, size, options);
    });
}

struct TrainerDdp {
    StorePtr store;
    c10::intrusive_ptr<c10d::ProcessGroup> group;
    std::unique_ptr<c10d::Reducer> reducer;
    bool cuda = false;
};

std::vector<at::Tensor> tensors_of(at::Tensor** tensors, int count) {
    std::vector<at::Tensor> result;
    result.reserve(count);
    for (int index = 0; index < count; ++index) result.push_back(*tensors[index]);
    return result;
}

} // namespace

extern "C" {

// Joins the run: rank 0 serves the store at master_addr:port, the others connect (each side
// waits up to timeout_ms); cuda_device < 0 means Gloo on the CPU, else NCCL on that device.
void* trainer_ddp_new(const char* master_addr, int port, int rank, int world, int cuda_device, long long timeout_ms,
                      char* error, size_t error_len) {
    TrainerDdp* ddp = nullptr;
    trainer_guard(error, error_len, [&] {
        std::chrono::milliseconds timeout(timeout_ms);
        c10d::TCPStoreOptions store_options;
        store_options.port = static_cast<std::uint16_t>(port);
        store_options.isServer = rank == 0;
        store_options.numWorkers = static_cast<size_t>(world);
        store_options.waitWorkers = true;
        store_options.timeout = timeout;
        auto result = std::make_unique<TrainerDdp>();
        result->store = c10::make_intrusive<c10d::TCPStore>(std::string(master_addr), store_options);
        result->cuda = cuda_device >= 0;
        auto backend = result->cuda ? make_nccl(result->store, rank, world, timeout)
                                    : make_gloo(result->store, rank, world, timeout, master_addr);
        result->group = c10::make_intrusive<c10d::ProcessGroup>(result->store, rank, world);
        auto type = result->cuda ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
        auto device_type = result->cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
        result->group->setBackend(device_type, type, backend);
        result->group->setDefaultBackend(type);
        result->group->setGroupName("0");
        ddp = result.release();
    });
    return ddp;
}

// Checks that every rank holds the same parameters (count, shapes, types), then builds the
// Reducer over them: buckets of `bucket_bytes` (the first 1 MiB), in reverse order of
// definition, which is roughly the order backward produces the gradients in.
int trainer_ddp_attach(void* handle, at::Tensor** params, const char** names, int count, long long bucket_bytes,
                       char* error, size_t error_len) {
    auto* ddp = static_cast<TrainerDdp*>(handle);
    return trainer_guard(error, error_len, [&] {
        auto tensors = tensors_of(params, count);
        c10d::verify_params_across_processes(ddp->group, tensors, std::nullopt);
        std::vector<bool> sparse(tensors.size(), false);
        std::vector<size_t> limits{static_cast<size_t>(kFirstBucketBytes), static_cast<size_t>(bucket_bytes)};
        auto buckets = std::get<0>(c10d::compute_bucket_assignment_by_size(tensors, limits, sparse));
        std::reverse(buckets.begin(), buckets.end());
        std::unordered_map<size_t, std::string> param_names;
        for (int index = 0; index < count; ++index) param_names[index] = names[index];
        ddp->reducer = std::make_unique<c10d::Reducer>(
            tensors, buckets, ddp->group, sparse, bucket_bytes, /*find_unused_parameters=*/false,
            /*gradient_as_bucket_view=*/false, param_names, kFirstBucketBytes,
            /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false, std::vector<int64_t>{});
    });
}

// Before a forward pass whose backward should synchronise (the last micro-batch of a step).
int trainer_ddp_prepare_forward(void* handle, char* error, size_t error_len) {
    auto* ddp = static_cast<TrainerDdp*>(handle);
    return trainer_guard(error, error_len, [&] {
        ddp->reducer->prepare_for_forward();
        // After the first step, buckets are re-cut in the order gradients actually arrived.
        ddp->reducer->rebuild_buckets();
    });
}

// Arms the autograd hooks for the next backward, which then all-reduces every bucket.
int trainer_ddp_prepare_backward(void* handle, char* error, size_t error_len) {
    auto* ddp = static_cast<TrainerDdp*>(handle);
    return trainer_guard(error, error_len, [&] { ddp->reducer->prepare_for_backward({}); });
}

// Overwrites the tensors with rank 0's (parameters at the start, batch norm statistics).
int trainer_ddp_broadcast(void* handle, at::Tensor** tensors, int count, char* error, size_t error_len) {
    auto* ddp = static_cast<TrainerDdp*>(handle);
    return trainer_guard(error, error_len, [&] {
        at::NoGradGuard no_grad;
        auto list = tensors_of(tensors, count);
        c10d::broadcast_coalesced(ddp->group, list, 256 << 20, 0);
    });
}

// Sums a tensor over the ranks, in place, and waits for it.
int trainer_ddp_all_reduce_sum(void* handle, at::Tensor* tensor, char* error, size_t error_len) {
    auto* ddp = static_cast<TrainerDdp*>(handle);
    return trainer_guard(error, error_len, [&] {
        std::vector<at::Tensor> list{*tensor};
        ddp->group->allreduce(list)->wait();
    });
}

// Leaves the run in order: hooks first, then the backend (NCCL frees its communicators).
void trainer_ddp_free(void* handle) {
    auto* ddp = static_cast<TrainerDdp*>(handle);
    try {
        ddp->reducer.reset();
        if (ddp->cuda) ddp->group->shutdown();
    } catch (...) {
    }
    delete ddp;
}

}
