"""core/imageref.py: the one image-reference parser, after the distribution reference grammar."""

from __future__ import annotations

import pytest

from imgbuild.core.errors import RecipeError
from imgbuild.core.imageref import ImageRef, parse

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("ref", "expected", "registry", "full"),
    [
        ("ubuntu", ImageRef(None, "ubuntu"), "docker.io", "docker.io/library/ubuntu"),
        ("ubuntu:24.04", ImageRef(None, "ubuntu", "24.04"), "docker.io", "docker.io/library/ubuntu"),
        (
            "nvidia/cuda:12.8.1-devel",
            ImageRef(None, "nvidia/cuda", "12.8.1-devel"),
            "docker.io",
            "docker.io/nvidia/cuda",
        ),
        ("host:5000/repo", ImageRef("host:5000", "repo"), "host:5000", "host:5000/repo"),
        ("host:5000/repo:1", ImageRef("host:5000", "repo", "1"), "host:5000", "host:5000/repo"),
        ("localhost/x", ImageRef("localhost", "x"), "localhost", "localhost/x"),
        ("localhost:5000/a/b:t", ImageRef("localhost:5000", "a/b", "t"), "localhost:5000", "localhost:5000/a/b"),
        (f"a/b/c:tag@{D}", ImageRef(None, "a/b/c", "tag", D), "docker.io", "docker.io/a/b/c"),
        (f"ghcr.io/org/img@{D}", ImageRef("ghcr.io", "org/img", None, D), "ghcr.io", "ghcr.io/org/img"),
        (
            "public.ecr.aws/x/y_z__w-v:lock-0123",
            ImageRef("public.ecr.aws", "x/y_z__w-v", "lock-0123"),
            "public.ecr.aws",
            "public.ecr.aws/x/y_z__w-v",
        ),
        ("[::1]:5000/r", ImageRef("[::1]:5000", "r"), "[::1]:5000", "[::1]:5000/r"),
    ],
)
def test_parses(ref: str, expected: ImageRef, registry: str, full: str) -> None:
    got = parse(ref)
    assert got == expected
    assert got.registry == registry
    assert got.full_repository == full
    assert str(got) == ref
    assert got.name == expected.path.rsplit("/", 1)[-1]


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("", "empty"),
        (" ubuntu", "spaces"),
        ("Ubuntu", "path component"),
        ("a//b", "path component"),
        ("repo:", "tag"),
        ("repo:-x", "tag"),
        ("repo@sha256:abc", "digest"),
        ("repo@" + "ab" * 32, "digest"),
        ("host:port/x", "registry"),
        ("-bad.io/x", "registry"),
        ("a/" + "b" * 255, "longer than 255"),
        ("a/" + "b" * 600, "longer than 512"),
    ],
)
def test_refuses(ref: str, why: str) -> None:
    with pytest.raises(ValueError, match=r"^--to: ") as err:
        parse(ref, where="--to")
    assert why in str(err.value)
    assert "expected [REGISTRY[:PORT]/]PATH[:TAG][@DIGEST]" in str(err.value)


def test_error_class_and_place() -> None:
    with pytest.raises(RecipeError) as err:
        parse("Nope", where="recipes/x.yaml: base", error=RecipeError)
    assert err.value.exit_code == RecipeError.exit_code
    assert "recipes/x.yaml: base: 'Nope'" in err.value.message
