"""Small helpers the broker's modules share: values that may be Deferreds, errors as results,
and what stands in for a call of a capability the store lacks."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from twisted.internet import defer
from twisted.python.failure import Failure

from gateway.model import CommandError, ErrorCode
from gateway.shared import Shared
from gateway.storage.interface import MayWait, Storage

_T = TypeVar("_T")
_R = TypeVar("_R")


def then(value: MayWait[_T], fn: Callable[[_T], MayWait[_R]]) -> MayWait[_R]:
    """``fn(value)``, or a Deferred of it when ``value`` is a Deferred.

    Storage calls that may wait return either; the local engine answers at
    once, so the hot path makes no Deferred.
    """
    if isinstance(value, defer.Deferred):
        return value.addCallback(fn)
    return fn(value)


def first_failure(f: Failure) -> Failure:
    """``f``, or, for the ``FirstError`` of calls waited for together (``gatherResults``), the
    failure of the call that failed first."""
    error = f.value
    return error.subFailure if isinstance(error, defer.FirstError) else f


def command_error(f: Failure) -> CommandError:
    """The ``CommandError`` that failed ``f`` (through ``first_failure``); any other failure
    is raised again (``Failure.trap``)."""
    f = first_failure(f)
    f.trap(CommandError)
    error = f.value
    assert isinstance(error, CommandError)  # what trap let through
    return error


def errors_as(result_type: Callable[..., Any], *fields: str) -> Callable[[Callable], Callable]:
    """Turn a ``CommandError`` raised by a handler, or failing the Deferred it
    returns, into ``result_type(<fields of the command>, error=...)``."""

    def wrap(fn: Callable) -> Callable:
        def as_result(cmd: Any, e: CommandError) -> Any:
            return result_type(**{f: getattr(cmd, f) for f in fields}, error=e.error)

        @functools.wraps(fn)
        def run(self: Any, cmd: Any) -> Any:
            try:
                result = fn(self, cmd)
            except CommandError as e:
                return as_result(cmd, e)
            if isinstance(result, defer.Deferred):
                def failed(f: Failure) -> Any:
                    return as_result(cmd, command_error(f))

                return result.addErrback(failed)
            return result

        return run

    return wrap


class Share:
    """The result of one command of a run whose results come together (``fan_out``): item
    ``index`` of the sequence ``whole`` settles with. It stands where a Deferred of that result
    would, without a Deferred per command: ``gather`` waits on a run's results once."""

    __slots__ = ("whole", "index")

    def __init__(self, whole: Shared, index: int):
        self.whole = whole
        self.index = index

    def wait(self) -> defer.Deferred:
        """A Deferred of this one result."""
        index = self.index
        return self.whole.wait().addCallback(lambda results: results[index])


def fan_out(d: defer.Deferred, count: int) -> list[Share]:
    """``count`` results to come, the k-th being item k of the sequence ``d`` fires with (or its failure)."""
    whole = Shared(d)
    return [Share(whole, i) for i in range(count)]


def waits(result: Any) -> bool:
    """Whether ``result`` (of ``Broker.run_many``) is still to come: a Deferred or a ``Share``."""
    return type(result) is Share or isinstance(result, defer.Deferred)


def gather(results: Sequence[Any]) -> defer.Deferred:
    """A Deferred of ``results`` with each Deferred and ``Share`` replaced by what it settles with
    (failing with the first failure): one wait per run of ``Share``s, however many commands it ran."""
    pending: list[defer.Deferred] = []
    places: list[int | list[tuple[int, int]]] = []  # per pending: the result's place, or a run's places
    runs: dict[int, list[tuple[int, int]]] = {}
    for i, r in enumerate(results):
        if type(r) is Share:
            run = runs.get(id(r.whole))
            if run is None:
                run = runs[id(r.whole)] = []
                pending.append(r.whole.wait())
                places.append(run)
            run.append((i, r.index))
        elif isinstance(r, defer.Deferred):
            pending.append(r)
            places.append(i)
    out = list(results)

    def fill(outcomes: list[Any]) -> list[Any]:
        for place, outcome in zip(places, outcomes, strict=True):
            if isinstance(place, int):
                out[place] = outcome
            else:
                for i, k in place:
                    out[i] = outcome[k]
        return out

    return defer.gatherResults(pending, consumeErrors=True).addCallback(fill)


def refusal(store: Storage, call: str) -> Callable[..., NoReturn]:
    """What the broker calls instead of ``call`` of a capability ``store`` lacks (decided when the
    broker is built): it raises ``CommandError(UNSUPPORTED)`` with the store's reason
    (``Storage.refusals``), which the command's handler answers as its result."""
    message = store.refusals.get(call, f"the storage does not support {call}")

    def refuse(*args: Any) -> NoReturn:
        raise CommandError(ErrorCode.UNSUPPORTED, message)

    return refuse


def unknown_leader_epoch(topic: str, partition: int) -> int:
    """The leader epoch of a partition of a store that keeps none (``LeaderEpochStorage``):
    ``-1``, unknown, as a producer stamps it; a client's epoch is then not checked."""
    return -1
