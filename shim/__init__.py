"""The shims that stand in for libcuda.so.1 and libcudart.so.13 inside the application."""
