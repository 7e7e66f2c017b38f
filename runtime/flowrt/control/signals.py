"""Why a frame or an activation will not happen: the reason an UNREACHABLE signal carries
along control edges (DESIGN §4.4) and the one a dead bucket passes on."""

from __future__ import annotations

from enum import Enum


class Reason(Enum):
    EMPTY = "empty"
    ERROR = "error"
    CANCEL = "cancel"

    @classmethod
    def worst(cls, reasons) -> Reason:
        """The most serious of `reasons` (error > cancel > empty; None counts as empty)."""
        worst = cls.EMPTY
        for reason in reasons:
            if reason is cls.ERROR:
                return reason
            if reason is cls.CANCEL:
                worst = reason
        return worst
