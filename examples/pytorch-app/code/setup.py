"""The C++ extension of imgbuild_example, built against the image's stack: torch's headers and libraries (torch's
cpp_extension), the image's one NCCL (NCCL_INCLUDE_DIR / NCCL_LIB_DIR, which imgbuild exports to source builds) and
its MPI (the flags of MPICXX, Open MPI's compiler wrapper)."""

import os
import shlex
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension


def mpi_flags(which):
    out = subprocess.run([os.environ.get("MPICXX", "mpicxx"), f"--showme:{which}"], capture_output=True, text=True)
    out.check_returncode()
    return shlex.split(out.stdout)


nccl_lib = os.environ["NCCL_LIB_DIR"]
setup(
    ext_modules=[
        CppExtension(
            "imgbuild_example._stack",
            ["src/imgbuild_example/_stack.cpp"],
            include_dirs=[os.environ["NCCL_INCLUDE_DIR"]],
            extra_compile_args=[a for a in mpi_flags("compile") if a.startswith(("-I", "-D", "-pthread"))],
            # The NCCL wheel ships libnccl.so.2 (no unversioned link): link that file, and find it there at run time.
            extra_link_args=[f"-L{nccl_lib}", "-l:libnccl.so.2", f"-Wl,-rpath,{nccl_lib}", *mpi_flags("link")],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
