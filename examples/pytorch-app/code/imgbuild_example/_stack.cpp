// What the training package needs from the image's stack, compiled against it: a tensor op (torch), the NCCL
// library it links (ncclGetVersion), and the MPI library it links (MPI_Get_library_version, callable before
// MPI_Init).
#include <mpi.h>
#include <nccl.h>
#include <torch/extension.h>

#include <string>

int nccl_version() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) {
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
