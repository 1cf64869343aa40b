"""An injected clock for generation under the drafting policy: only model forwards advance it."""

from __future__ import annotations


class ModelClock:
    """A clock that only forwards advance: a target forward over ``n`` tokens
    takes ``cost(n)`` seconds, a draft-model forward ``draft_s``. Given to
    the drafter as its ``clock``, it makes every run under the policy deterministic."""

    def __init__(self, target, cost, draft=None, draft_s: float = 0.0) -> None:
        self.t = 0.0
        self.handles = [target.register_forward_pre_hook(self._advance(cost), with_kwargs=True)]
        if draft is not None:
            self.handles.append(draft.register_forward_pre_hook(self._advance(lambda n: draft_s), with_kwargs=True))

    def _advance(self, cost):
        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.t += cost(int(ids.shape[1]))

        return hook

    def __call__(self) -> float:
        return self.t

    def __enter__(self) -> ModelClock:
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
