"""Only launch.py remains here (the one mpirun / torchrun line), pending its move; the rest of what was here went to
its owners: the recipe (imgbuild.recipe: edit) and the ground floor (imgbuild.core: fields, platforms, distro,
versions, instances)."""
