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


def show_model(summary, image, css_class, model, *args):
    """Run a widget's model on its controls' values; show its text in ``summary`` (a
    paragraph of ``css_class``) and its figure in ``image``. A combination the model refuses
    (ValueError: heads that do not divide, ...) is said in the text, the last figure kept.
    Returns the model's state, or None when refused."""
    try:
        state = model(*args)
    except ValueError as exc:
        summary.value = f"<p class='{css_class}'>{exc}</p>"
        return None
    summary.value = f"<p class='{css_class}'>{state['text']}</p>"
    show_figure(image, state["figure"])
    return state
