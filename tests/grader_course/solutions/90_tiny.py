# %% [markdown]
# # Lesson 90: two exercises, for the grader's tests

# %%
from emulator.notebook import setup
from emulator.grading import lesson90 as grade

setup()

# %%
def double(x):
    ### BEGIN SOLUTION: Exercise 90.1: double a number
    return 2 * x
    ### END SOLUTION


# %% tags=["check"]
grade.check_double(double)

# %% [markdown]
# Between the exercises.

# %%
def triple(x):
    ### BEGIN SOLUTION: Exercise 90.2: triple a number
    return double(x) + x
    ### END SOLUTION


# %% tags=["check"]
grade.check_triple(triple)
