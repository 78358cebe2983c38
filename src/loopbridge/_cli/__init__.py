"""Wing: the `loopbridge` command line."""
