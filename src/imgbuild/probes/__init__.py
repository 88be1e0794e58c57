"""Programs imgbuild runs inside containers of an image (copied in at run time, never baked into images), one file
each; `text(name)` reads one."""

from imgbuild.probes._read import text

__all__ = ["text"]
