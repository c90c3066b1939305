// Checkpoints in torch.save's format: a zip archive holding a pickled {name: tensor} dict and
// one record per tensor, written with libtorch's own pickler and archive writer. Python's
// `torch.load(path)` reads it with its default `weights_only=True` (only dicts, tensors and
// storages inside; the dict is written untagged, because a TorchScript type tag is a global
// the weights-only unpickler refuses). Loading reads either that or a file torch.save wrote.
#include "shim.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <fstream>
#include <iterator>

extern "C" {

int trainer_save_state_dict(const char* path, const char** names, at::Tensor** tensors, int count, char* error,
                            size_t error_len) {
    return trainer_guard(error, error_len, [&] {
        c10::Dict<std::string, at::Tensor> state;
        for (int index = 0; index < count; ++index) {
            state.insert(names[index], tensors[index]->detach().to(at::kCPU).contiguous());
        }
        std::vector<char> pickled;
        torch::jit::Pickler pickler(
            [&](const char* bytes, size_t size) { pickled.insert(pickled.end(), bytes, bytes + size); }, nullptr,
            nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
        pickler.protocol();
        pickler.pushIValue(state);
        pickler.stop();
        caffe2::serialize::PyTorchStreamWriter writer{std::string(path)};
        torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
        writer.writeEndOfFile();
    });
}

struct TrainerStateDict {
    std::vector<std::string> names;
    std::vector<at::Tensor> tensors;
};

// A state dict file (ours or torch.save's) as names and CPU tensors; null with the reason.
void* trainer_load_state_dict(const char* path, char* error, size_t error_len) {
    TrainerStateDict* result = nullptr;
    trainer_guard(error, error_len, [&] {
        std::ifstream file(path, std::ios::binary);
        TORCH_CHECK(file.good(), "cannot open ", path);
        std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
        auto value = torch::jit::pickle_load(bytes);
        TORCH_CHECK(value.isGenericDict(), "holds a ", value.tagKind(), ", not a state dict (a dict of tensors)");
        auto state = std::make_unique<TrainerStateDict>();
        for (const auto& entry : value.toGenericDict()) {
            TORCH_CHECK(entry.key().isString(), "has a key that is not a string");
            TORCH_CHECK(entry.value().isTensor(), "`", entry.key().toStringRef(), "` is not a tensor");
            state->names.push_back(entry.key().toStringRef());
            state->tensors.push_back(entry.value().toTensor());
        }
        result = state.release();
    });
    return result;
}

int trainer_state_dict_len(void* handle) {
    return static_cast<int>(static_cast<TrainerStateDict*>(handle)->names.size());
}

const char* trainer_state_dict_name(void* handle, int index) {
    return static_cast<TrainerStateDict*>(handle)->names[index].c_str();
}

at::Tensor* trainer_state_dict_tensor(void* handle, int index) {
    return new at::Tensor(static_cast<TrainerStateDict*>(handle)->tensors[index]);
}

void trainer_state_dict_free(void* handle) {
    delete static_cast<TrainerStateDict*>(handle);
}

}
