"""Helpers shared by the tests and `make demo`: real images, real users."""
