"""A method for fedrepro written outside it (docs/methods.md, "Your own method")."""
