"""One module per Linen idiom the drafter translates, each a small rewrite the method rewriter
calls at one hook (the idiom's module says which)."""
