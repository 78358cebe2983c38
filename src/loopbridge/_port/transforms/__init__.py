"""Drafting's third stage: one module per Linen idiom the drafter translates, each a small libcst
rewrite that the planner or the method rewriter calls at one hook (the idiom's module says
which)."""
