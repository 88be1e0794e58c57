"""The CI job matrix: which recipes a workflow builds and publishes, with their tags and the runners they need.

`imgbuild matrix --json` prints it for `.github/workflows/publish.yml` (``strategy.matrix: fromJSON(...)``).
Plain data from the recipes and their locks: no engine, no network.
"""

from __future__ import annotations

from typing import Any

# The GitHub Actions runner labels a recipe's accelerator needs (``runs-on:``).
RUNNERS: dict[str, list[str]] = {
    "none": ["ubuntu-latest"],
    "nvidia": ["self-hosted", "gpu"],
    "gaudi": ["self-hosted", "gaudi"],
}


def matrix(names: list[str] | None = None) -> dict[str, Any]:
    """The buildable recipes and their tags, as a GitHub Actions job matrix (``{"include": [...]}``).

    Each entry: recipe, image (repository), tags (content-addressed first), accelerator, runner (labels joined
    by spaces, for people) and runs_on (the label list, for ``runs-on:``). Only recipes with a fresh lock are
    publishable: a missing or stale lock is an error naming the recipe. Abstract recipes (parents) are left
    out, and refused when named.
    """
    from imgbuild import recipe
    from imgbuild.image import identity
    from imgbuild.pin import lock

    include = []
    for name in names or recipe.shipped_names():
        loaded = recipe.load(name)
        if loaded.recipe.abstract and not names:
            continue  # a parent among the shipped files: nothing of its own to publish
        resolved = lock.resolved_for(loaded.concrete())  # a published image comes from a lock
        named = identity.of(resolved)  # the image's names, without rendering it
        accelerator = loaded.recipe.platform.accelerator
        labels = RUNNERS[accelerator]
        include.append({
            "recipe": named.recipe,
            "image": named.repository,
            "tags": list(named.tags()),
            "accelerator": accelerator,
            "runner": " ".join(labels),
            "runs_on": labels,
        })  # fmt: skip
    return {"include": include}
