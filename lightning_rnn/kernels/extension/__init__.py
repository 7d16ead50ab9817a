"""What the compiled backends (cpp, cuda) share: the just-in-time build and the autograd glue."""
