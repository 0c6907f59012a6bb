"""When a goal line in a results table may be printed: both sides of the comparison must be
finite and clearly above chance, or the line says why it cannot be judged.

"Clearly above chance" is three binomial standard errors above the chance accuracy 1/C on the
n test points: a classifier at chance scores 1/C ± √(p(1 − p)/n), so e.g. 10.4 % on 360 points of
10 classes (1/C + 0.4 s.e.) is chance, and a comparison with it says nothing about the method.
"""

from __future__ import annotations

import math


def chance_threshold(num_classes: int, n_test: int, z: float = 3.0) -> float:
    """The accuracy below which a score on ``n_test`` points of ``num_classes`` classes is not
    distinguishable from guessing (chance + ``z`` binomial standard errors)."""
    p = 1.0 / num_classes
    return p + z * math.sqrt(p * (1.0 - p) / n_test)


def why_unjudgeable(sides: dict[str, dict | None], num_classes: int, n_test: int) -> str | None:
    """None when every side (``{"test_accuracy": mean, "test_nll": mean}``) is finite and above chance;
    otherwise the reason, naming the side(s)."""
    threshold = chance_threshold(num_classes, n_test)
    reasons = []
    for name, side in sides.items():
        accuracy = None if side is None else side.get("test_accuracy")
        nll = None if side is None else side.get("test_nll")
        if accuracy is None:
            reasons.append(f"{name} has no finished run")
        elif not (math.isfinite(accuracy) and (nll is None or math.isfinite(nll))):
            reasons.append(f"{name} is not finite")
        elif accuracy <= threshold:
            reasons.append(f"{name} is at chance ({100 * accuracy:.1f} % ≤ {100 * threshold:.1f} %, chance "
                           f"{100 / num_classes:.0f} % + 3 s.e. on {n_test} test points)")
    return "; ".join(reasons) or None
