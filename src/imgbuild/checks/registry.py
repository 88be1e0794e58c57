"""The registry of checks: `@check` files a check under each component that contributes it (each block's module
registers its own; `imgbuild.checks.always` the image's and the platform's), `selected` picks those of an image's
components in one scope, `run_checks` runs them concurrently."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from imgbuild.checks.context import BOTH, CheckContext, Scope
from imgbuild.checks.results import CheckResult
from imgbuild.checks.verdicts import fail

CheckFn = Callable[[CheckContext], CheckResult]


@dataclass(frozen=True)
class Check:
    """One registered check: its name, the components that contribute it and where it makes sense."""

    name: str
    components: tuple[str, ...]
    scopes: tuple[Scope, ...]
    fn: CheckFn
    doc: str


ALWAYS = ("image", "platform")  # pseudo-components whose checks run for every image
REGISTRY: dict[str, list[Check]] = {}


def check(name: str, *components: str, scopes: tuple[Scope, ...] = BOTH) -> Callable[[CheckFn], CheckFn]:
    """Register a check under each component that contributes it (it runs once when any is present)."""

    def deco(fn: CheckFn) -> CheckFn:
        item = Check(name, components, scopes, fn, (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
        for comp in components:
            REGISTRY.setdefault(comp, []).append(item)
        return fn

    return deco


def selected(components: Iterable[str], scope: Scope, order: Sequence[str]) -> list[Check]:
    """The checks for these components (plus the always-run ones) in `scope`: the image's first, then each
    component's in `order` (the blocks' layer order), the platform's (GPUs) last. The blocks register their checks
    when they are imported (the registry, imgbuild.blocks, imports them all)."""
    present = set(components) | set(ALWAYS)
    rank = {name: i for i, name in enumerate(("image", *order, "platform"))}
    seen: dict[str, tuple[int, int, Check]] = {}
    for comp, items in REGISTRY.items():
        if comp not in present:
            continue
        for i, item in enumerate(items):
            key = (rank.get(item.components[0], len(rank)), i, item)
            if scope in item.scopes and item.name not in seen:
                seen[item.name] = key
    return [item for _, _, item in sorted(seen.values(), key=lambda k: (k[0], k[1]))]


def run_checks(ctx: CheckContext, checks: list[Check], *, workers: int = 8) -> list[CheckResult]:
    """Run checks concurrently (each is a few commands on the target); results keep the checks' order."""

    def one(item: Check) -> CheckResult:
        start = time.monotonic()
        try:
            result = item.fn(ctx)
        except Exception as exc:  # a broken check is a failed check, never a crashed verification
            result = fail(f"the check itself failed: {type(exc).__name__}: {exc}")
        comp = next((c for c in item.components if c in ctx.components), item.components[0])
        return replace(result, name=item.name, component=comp, duration_s=round(time.monotonic() - start, 3))

    if workers <= 1 or len(checks) <= 1:
        return [one(c) for c in checks]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="imgbuild-check")
    try:
        results = list(pool.map(one, checks))
    except BaseException:
        # Ctrl-C or SIGTERM: drop the checks not started and do not wait here for the running ones (a command in the
        # container may take its whole timeout); the caller removes the containers they run in, which ends them.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results
