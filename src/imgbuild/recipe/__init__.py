"""Recipes: the model of a target image (model), its YAML files loaded, merged and checked (loading), one value of a
file changed in place (edit) and the JSON Schema of a file (schema). One floor above imgbuild.blocks: the recipe
composes the blocks' options."""

from imgbuild.core.paths import display  # the paths in the loader's errors, as callers show them too
from imgbuild.recipe.loading import find, load, shipped_names, where_set
from imgbuild.recipe.model import OS, Arch, Base, Components, LoadedRecipe, MpiRun, Platform, Recipe, Runtime

__all__ = [
    "OS",
    "Arch",
    "Base",
    "Components",
    "LoadedRecipe",
    "MpiRun",
    "Platform",
    "Recipe",
    "Runtime",
    "display",
    "find",
    "load",
    "shipped_names",
    "where_set",
]
