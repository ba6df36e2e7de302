"""Error and warning classes of the selection library.

Every bad input raises a subclass of :class:`SelectionError` with a message a user can act on;
the library never returns a wrong answer silently.
"""

from __future__ import annotations


class SelectionError(ValueError):
    """Base class of every error raised by :mod:`selection`."""


class InputDataError(SelectionError):
    """The arrays passed in are malformed: NaN/inf, wrong shape, invalid probabilities, empty pool."""


class UnknownStrategyError(SelectionError):
    """The strategy name is not one of :data:`selection.STRATEGIES`."""


class ParameterError(SelectionError):
    """A strategy parameter, batch size, index or option is unknown or out of range."""


class TaskMismatchError(SelectionError):
    """The strategy does not support the task (e.g. a classification-only strategy on regression)."""


class MemoryBudgetError(SelectionError):
    """The exact method would need more memory than allowed; the message names the approximation to use."""


class NumericalWarning(RuntimeWarning):
    """A numerical safeguard was applied (clamped value, jitter added, near-singular matrix)."""
