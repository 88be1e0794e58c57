"""What a target is: the recipe (loading, merging, the whole model), its field types and the shipped compatibility
tables. One floor with imgbuild.blocks: the recipe composes the blocks' options."""
