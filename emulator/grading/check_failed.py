"""The failure a check raises: :class:`CheckFailed`, shown in a notebook as its message and
the student's own frames, none of the grading code's."""

import traceback
from pathlib import Path

GRADING = Path(__file__).resolve().parent


class CheckFailed(AssertionError):
    """The exercise's answer is wrong; the message says how.

    In a notebook the message is the first thing shown, with no frame of the grading code
    before it: IPython shows what ``_render_traceback_`` returns instead of the whole
    traceback. When the student's own code raised (the failure's ``__cause__``), its
    frames follow, and only those."""

    def _render_traceback_(self):
        lines = [f"{type(self).__name__}: {self}"]
        cause = self.__cause__
        if cause is not None and cause.__traceback__ is not None:
            frames = [f for f in traceback.extract_tb(cause.__traceback__)
                      if not Path(f.filename).resolve().is_relative_to(GRADING)]
            lines += ["", f"{type(cause).__name__} was raised here:" if frames else
                      f"{type(cause).__name__} was raised inside the check: look at what your code returns."]
            lines += [entry.rstrip("\n") for entry in traceback.format_list(frames)]
        return lines
