"""The instructor's grader, in pieces (``python -m tools.grade`` is its command).

* ``submission``: read a submitted notebook, find its exercise cells, put them into the
  course's own notebook;
* ``runner``: run that in a fresh copy of the course, in a kernel (``kernel``) that imports
  the copy's library, with limits; end every process it left; say what each check said;
* ``channel``: the signed lines the checks' outcomes travel by; ``integrity``: what a
  submission must not change; ``judge``: from both to a status per exercise;
* ``processes``: find and end what a submission started; ``container``: the same in a
  container per submission;
* ``students``, ``report``: whose each file is, which counts, the CSV and feedback files.

Nothing here is imported by the notebooks; the runner and what it loads use the standard
library, nbclient and jupyter_client only, so that they run in the grader's image.
"""
