"""The building blocks of an image, one folder each, and what the pipeline asks of them.

A block (`_block.Block`: a small protocol, with the capabilities a block names in its class line) holds, in its
folder blocks/<name>/: its recipe options (pydantic), its pin rule, what it contributes (packages, PATH /
LD_LIBRARY_PATH, environment, manifest entry), its Dockerfile fragments (`<name>.j2`: Jinja macros `builder`,
`runtime`, `final`), its release rows (releases.yaml) and its verify checks. Here: `_block` (what a block is),
`_core` (pins, contributions, the resolution state), `_releases` (the release files' model), `registry` (every
block in layer order, the orders and the context derived from it) and `knownbad` (what the release files mark bad).

Adding a component: see docs/contributing.md ("Adding a component, a release, a known-bad combination").
"""

from imgbuild.blocks._block import (
    Block,
    Downloads,
    PythonDists,
    PythonSets,
    RecipeRules,
    Released,
    ShipsFiles,
    Tracks,
    UserCode,
)
from imgbuild.blocks._core import (
    Context,
    Contribution,
    Details,
    Installed,
    Pin,
    Provides,
    Resolution,
    Tracked,
    builder_base,
    python_of,
    slug,
)
from imgbuild.blocks.knownbad import KnownBad, known_bad, recorded_checksums
from imgbuild.blocks.registry import (
    BY_NAME,
    REGISTRY,
    TEMPLATE_DIR,
    builder_order,
    context_for,
    dedupe,
    feeding,
    resolve_order,
    runtime_order,
)

__all__ = [
    "BY_NAME",
    "REGISTRY",
    "TEMPLATE_DIR",
    "Block",
    "Context",
    "Contribution",
    "Details",
    "Downloads",
    "Installed",
    "KnownBad",
    "Pin",
    "Provides",
    "PythonDists",
    "PythonSets",
    "RecipeRules",
    "Released",
    "Resolution",
    "ShipsFiles",
    "Tracked",
    "Tracks",
    "UserCode",
    "builder_base",
    "builder_order",
    "context_for",
    "dedupe",
    "feeding",
    "known_bad",
    "python_of",
    "recorded_checksums",
    "resolve_order",
    "runtime_order",
    "slug",
]
