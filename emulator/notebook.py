"""One call at the top of every lesson: small, deterministic outputs."""

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from .grading import progress


def setup():
    """Print options and figure sizes shared by every lesson (small PNGs, fixed fonts);
    checks of exercises not yet attempted say so and let the lesson go on."""
    progress.in_lesson()
    np.set_printoptions(precision=4, suppress=True, linewidth=100)
    matplotlib.rcParams.update({
        "figure.dpi": 72, "savefig.dpi": 72, "figure.figsize": (7.5, 3.2),
        "font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
        "svg.hashsalt": "course", "path.simplify": True,
    })
    plt.close("all")
