"""Stage bodies (quantize, convert, build, package) and the runner that executes them."""
