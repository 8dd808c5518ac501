"""Helpers shared by the widgets."""

import io

from matplotlib.figure import Figure


def new_axes(width, height):
    """A figure outside pyplot, so a widget's redraw never leaks into the cell output."""
    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.add_subplot()


def figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi)
    return buf.getvalue()


def show_figure(image, fig):
    """Put a figure in an Image widget at its own pixel size (not stretched)."""
    image.value = figure_png(fig)
    image.width = str(int(fig.get_figwidth() * fig.dpi))
