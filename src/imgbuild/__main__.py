"""`python -m imgbuild ...`: the same as `imgbuild ...` (where the console script is not on PATH)."""

from imgbuild.cli.root import main

main()
