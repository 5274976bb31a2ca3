"""An owner: one callback in the config for one concern, made of parts. Lightning calls every callback it holds for
every hook it dispatches (a profiler context and a state key each time: host time on every step of a small model's
GPU run), so a run holds a handful of owners, and each calls its parts only for the hooks they implement, decided
once when it is made. A part is a Lightning callback of its own (tests build one alone); its checkpoint state is kept
under the owner's, by the part's own key."""

from typing import Any, Dict, Iterable, Optional, Tuple

from lightning.pytorch import Callback
from lightning.pytorch.utilities.model_helpers import is_overridden

HOOKS = tuple(sorted(name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown")))


class Owner(Callback):
    """Its parts (those not None, in order), each hook reaching only the parts that override it."""

    def __init__(self, parts: Iterable[Optional[Callback]]) -> None:
        self.parts: Tuple[Callback, ...] = tuple(part for part in parts if part is not None)
        self.calls: Dict[str, tuple] = {hook: tuple(getattr(part, hook) for part in self.parts
                                                    if is_overridden(hook, part, Callback)) for hook in HOOKS}

    def state_dict(self) -> Dict[str, Any]:
        return {part.state_key: state for part in self.parts if (state := part.state_dict())}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        for part in self.parts:
            if part.state_key in state_dict:
                part.load_state_dict(state_dict[part.state_key])

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        """A checkpoint from before its parts had an owner holds their states at the top: loaded from there."""
        states = checkpoint.get("callbacks") or {}
        if self.state_key not in states:
            self.load_state_dict({part.state_key: states[part.state_key] for part in self.parts
                                  if part.state_key in states})
        for call in self.calls["on_load_checkpoint"]:
            call(trainer, pl_module, checkpoint)


def _each(hook: str):
    def call_parts(self, *args, **kwargs) -> None:
        for call in self.calls[hook]:
            call(*args, **kwargs)

    call_parts.__name__ = call_parts.__qualname__ = hook
    return call_parts


for _hook in HOOKS:
    if _hook not in vars(Owner):
        setattr(Owner, _hook, _each(_hook))


def each(callbacks: Iterable[Callback]) -> Iterable[Callback]:
    """Every callback of a list and, after an owner, its parts: what to search for a callback of a kind."""
    for callback in callbacks:
        yield callback
        yield from getattr(callback, "parts", ())


def find(callbacks: Iterable[Callback], kind: type) -> Optional[Callback]:
    """The first callback or part of ``kind``."""
    return next((callback for callback in each(callbacks) if isinstance(callback, kind)), None)
