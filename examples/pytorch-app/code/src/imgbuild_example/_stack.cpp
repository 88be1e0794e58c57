// What the training package needs from the image's stack, compiled against it: a tensor op (torch), the NCCL
// library it links (ncclGetVersion), and the MPI library it links (MPI_Get_library_version, callable before
// MPI_Init).
#include <mpi.h>
#include <torch/extension.h>

#include <string>

// NCCL's C entry point, declared here: nccl.h includes CUDA's cuda_runtime.h, and this image's CUDA comes as PyTorch's
// wheels, whose headers are incomplete without the nvcc wheel. Linked against the image's one libnccl (setup.py).
extern "C" int ncclGetVersion(int* version);

int nccl_version() {
  int version = 0;
  if (ncclGetVersion(&version) != 0) {  // ncclSuccess
    throw std::runtime_error("ncclGetVersion failed");
  }
  return version;
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  return std::string(text, length);
}

// Scales a tensor in place and returns it: the op the training loop uses on its gradients.
torch::Tensor scale_(torch::Tensor t, double factor) { return t.mul_(factor); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("nccl_version", &nccl_version, "NCCL's version code, from the library this extension links");
  m.def("mpi_library_version", &mpi_library_version, "the MPI library this extension links");
  m.def("scale_", &scale_, "t *= factor, in place");
}
