"""The course speaks for itself: no lesson, course map, README, library or lab docstring
refers to "the lecture", "the notes" or "the seed" it was built from. A seed is allowed
only as a random-number generator's (``seed=0``, ``default_rng(seed)``, "a random seed")."""

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLACES = ["solutions/*.py", "lessons/index.md", "README.md", "emulator/**/*.py", "gpu_labs/**/*.py", "tools/*.py",
          "benchmarks/*.py"]
LECTURE = re.compile(r"\blectures?\b|\blecture notes\b|\b(the|its) notes\b|\bseed notes\b", re.I)
SEED = re.compile(r"\bseeds?\b", re.I)
RNG_WORDS = re.compile(r"random|rng|generator|draw", re.I)


def prose(path):
    """(line, text) of what a reader reads: a Python file's comments and strings (docstrings,
    messages, markdown cells), or every line of a Markdown file; code's names are not prose."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out += [(tok.start[0] + i, line) for i, line in enumerate(tok.string.splitlines())]
    return out


def voice_problems(lines):
    """The (number, text) of lines that refer to a lecture, notes or a seed other than an
    RNG's (a seed next to code punctuation, ``seed=1`` or ``seeds``, or on a line about
    random draws, is an RNG's)."""
    if isinstance(lines, str):
        lines = list(enumerate(lines.splitlines(), 1))
    out = []
    for number, line in lines:
        if LECTURE.search(line):
            out.append((number, line.strip()))
            continue
        for m in SEED.finditer(line):
            before, after = line[m.start() - 1:m.start()], line[m.end():m.end() + 1]
            identifier = ((before != "" and before in "._`") or (after != "" and after in "=),]:+*_`")
                          or (before != "" and before in "\"'" and after == before))  # a name or a key
            if not identifier and not RNG_WORDS.search(line):
                out.append((number, line.strip()))
                break
    return out


def course_files():
    files = sorted({p for pattern in PLACES for p in ROOT.glob(pattern) if p.is_file()})
    assert any(p.name == "06_mesh.py" for p in files) and any(p.name == "index.md" for p in files)
    return files


def test_no_lesson_map_readme_or_library_mentions_a_lecture_or_a_seed():
    found = {p.relative_to(ROOT).as_posix(): voice_problems(prose(p)) for p in course_files()}
    found = {k: v for k, v in found.items() if v}
    assert not found, "\n".join(f"{path}:{n}: {line}" for path, lines in found.items() for n, line in lines)


@pytest.mark.parametrize("line", [
    "### BEGIN SOLUTION: Exercise 6.4: the seed's three claims",
    "# The lecture's layout: 8 nodes of 8 H100s",
    "(its notes, not checked here against each paper)",
    "both in the lecture notes:",
    '"""The seed\'s planner."""',
    "# What the seeds say about it",
])
def test_the_search_catches_what_it_forbids(line):
    assert voice_problems(line) == [(1, line.strip())]


@pytest.mark.parametrize("line", [
    "rng = np.random.default_rng(seed)",
    "batches = synthetic_batches(1, 8, 16, 64, seed=1)",
    "SEED = 0  # the job's random generator",
    "a random seed per student",
    "(drawn once per step: ``seeds``, the draw of each step)",
    "self.seed * 7919 + 1",
    '"seeds": train.seeds}',
])
def test_the_search_allows_random_number_seeds(line):
    assert voice_problems(line) == []


def test_only_prose_is_searched_in_python(tmp_path):
    code = tmp_path / "m.py"
    code.write_text('seed = 3\nx = f(seed)  # the seed\'s planner\n"""Built from the lecture."""\n')
    assert voice_problems(prose(code)) == [(2, "# the seed's planner"), (3, '"""Built from the lecture."""')]
