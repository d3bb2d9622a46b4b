"""Per-app objects for routers of module-level handlers.

A router whose handlers are module-level functions is one object shared by every app built in
one process (tests build several), so it holds no per-app state. The factory that includes it
binds this app's objects instead (:func:`bind_router`): a router-level dependency
(:class:`Bind`) stores them on ``request.state`` before the handler runs, and a handler reads
one with a parameter ``Annotated[T, bound("name")]``. Every router of module-level handlers
(the Tinker API's included) is bound this way.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request


class Bind:
    """Router dependency: stores ``values`` (name -> object) on the request's ``state``."""

    def __init__(self, **values: Any) -> None:
        self.values = values

    def __call__(self, request: Request) -> None:
        for name, value in self.values.items():
            setattr(request.state, name, value)


def bound(name: str) -> Any:
    """``Depends`` on the object :class:`Bind` stored as ``name`` (``x: Annotated[T, bound("x")]``)."""

    def read(request: Request) -> Any:
        return getattr(request.state, name)

    read.__name__ = read.__qualname__ = f"bound_{name}"
    return Depends(read)


def bind_router(router: APIRouter, **values: Any) -> APIRouter:
    """A new router holding ``router``, whose every request gets ``values`` (:class:`Bind`).

    The dependency is the new router's own: ``router`` itself is left unchanged, so that every
    app can include it with objects of its own.
    """
    outer = APIRouter(dependencies=[Depends(Bind(**values))])
    outer.include_router(router)
    return outer


__all__ = ["Bind", "bind_router", "bound"]
