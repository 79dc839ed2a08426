"""Comparing two runs side by side (File > Compare..., `cachescope gui --compare A B`): a
window of its own over `engine.analysis.compare`."""
