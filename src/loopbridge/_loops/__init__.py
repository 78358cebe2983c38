"""Wing: loops over graphs that hold bridged models (while_loop, fori_loop, compile_step)."""
